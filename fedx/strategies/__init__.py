"""Flower strategies for multi-model federated learning (numpy and Flower only).

Use them in any Flower ServerApp in place of ``FedAvg``; ClientApps that reply
with an ``"arrays"`` ArrayRecord and a ``"metrics"`` MetricRecord holding
``"num-examples"`` work unchanged. :class:`FedMe` is the exception: its
clients train two models per round (:mod:`fedx.protocol.fedme` says what the
messages hold), and it also uses scikit-learn's KMeans. They run on Flower
1.36 (the last release whose SuperNodes reach the SuperLink over gRPC) and
later; ``OLDEST_FLWR`` is the oldest release they are tested with.

Every module here may declare methods for the fedx app (``Method`` objects,
:mod:`fedx.method`), which :mod:`fedx.registry` finds; a new method is a new
module.
"""

# First: on a too old Flower, fail with a message that says so.
from fedx.strategies.compat import OLDEST_FLWR  # isort: skip
from fedx.strategies.base import FedxStrategy, RandomStreams, to_arrayrecord, to_model
from fedx.strategies.checkpoint import (
    Checkpoint,
    CheckpointError,
    capture_run,
    load_checkpoint,
    restore_run,
    save_checkpoint,
)
from fedx.strategies.divergence import DivergenceGuard
from fedx.strategies.fedavg_ft import FedAvgFT
from fedx.strategies.fedcross import FedCross
from fedx.strategies.fedindep import FedIndep
from fedx.strategies.fedme import FedMe
from fedx.strategies.fedmr import FedMR
from fedx.strategies.fedmut import FedMut
from fedx.strategies.multi_model import MultiModelStrategy, PoolRound
from fedx.strategies.personalized import ClientEvaluation
from fedx.strategies.rounds import run_rounds
from fedx.strategies.secure import SecureRecombination

__all__ = [
    "OLDEST_FLWR",
    "Checkpoint",
    "CheckpointError",
    "ClientEvaluation",
    "DivergenceGuard",
    "FedAvgFT",
    "FedCross",
    "FedIndep",
    "FedMR",
    "FedMe",
    "FedMut",
    "FedxStrategy",
    "MultiModelStrategy",
    "PoolRound",
    "RandomStreams",
    "SecureRecombination",
    "capture_run",
    "load_checkpoint",
    "restore_run",
    "run_rounds",
    "save_checkpoint",
    "to_arrayrecord",
    "to_model",
]
