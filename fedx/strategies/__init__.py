"""Flower strategies for multi-model federated learning (numpy and Flower only).

Use them in any Flower ServerApp in place of ``FedAvg``; ClientApps that reply
with an ``"arrays"`` ArrayRecord and a ``"metrics"`` MetricRecord holding
``"num-examples"`` work unchanged. :class:`FedMe` is the exception: its
clients train two models per round (see its docstring for the messages), and
it also uses scikit-learn's KMeans.
"""

from fedx.strategies.fedavg_ft import FedAvgFT
from fedx.strategies.fedcross import FedCross
from fedx.strategies.fedindep import FedIndep
from fedx.strategies.fedme import FedMe
from fedx.strategies.fedmr import FedMR
from fedx.strategies.fedmut import FedMut
from fedx.strategies.multi_model import MultiModelStrategy
from fedx.strategies.personalized import ClientEvaluation

__all__ = [
    "ClientEvaluation",
    "FedAvgFT",
    "FedCross",
    "FedIndep",
    "FedMR",
    "FedMe",
    "FedMut",
    "MultiModelStrategy",
]
