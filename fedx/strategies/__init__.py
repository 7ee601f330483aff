"""Flower strategies for multi-model federated learning (numpy and Flower only).

Use them in any Flower ServerApp in place of ``FedAvg``; ClientApps that reply
with an ``"arrays"`` ArrayRecord and a ``"metrics"`` MetricRecord holding
``"num-examples"`` work unchanged. :class:`FedMe` is the exception: its
clients train two models per round (:mod:`fedx.protocol.fedme` says what the
messages hold), and it also uses scikit-learn's KMeans. They run on Flower
1.36 (the last release whose SuperNodes reach the SuperLink over gRPC) and
later; ``OLDEST_FLWR`` is the oldest release they are tested with.

Every module (or package) here is a method: it declares at least one
``Method`` (:mod:`fedx.method`) for the fedx app, which :mod:`fedx.registry`
finds by reading this folder alone; a new method is a new module. What the
methods share (the base class, the pool, checkpoints, the round loop, the
wire) is :mod:`fedx.strategy_core`; the names a Flower project uses are
handed on here.
"""

# First: on a too old Flower, fail with a message that says so.
from fedx.strategy_core import OLDEST_FLWR  # isort: skip
from fedx.strategies.fedavg_ft import FedAvgFT
from fedx.strategies.fedcross import FedCross
from fedx.strategies.fedindep import FedIndep
from fedx.strategies.fedme import FedMe
from fedx.strategies.fedmr import FedMR
from fedx.strategies.fedmut import FedMut
from fedx.strategy_core.base import FedxStrategy, RandomStreams, to_arrayrecord, to_model
from fedx.strategy_core.checkpoint import (
    Checkpoint,
    CheckpointError,
    capture_run,
    load_checkpoint,
    restore_run,
    save_checkpoint,
)
from fedx.strategy_core.divergence import DivergenceGuard
from fedx.strategy_core.multi_model import MultiModelStrategy, PoolRound
from fedx.strategy_core.personalized import ClientEvaluation
from fedx.strategy_core.rounds import run_rounds
from fedx.strategy_core.secure import SecureRecombination

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
