"""Flower strategies for multi-model federated learning (numpy and Flower only).

Use them in any Flower ServerApp in place of ``FedAvg``; ClientApps that reply
with an ``"arrays"`` ArrayRecord and a ``"metrics"`` MetricRecord holding
``"num-examples"`` work unchanged.
"""

from fedx.strategies.fedcross import FedCross
from fedx.strategies.fedindep import FedIndep
from fedx.strategies.fedmr import FedMR
from fedx.strategies.fedmut import FedMut
from fedx.strategies.multi_model import MultiModelStrategy

__all__ = ["FedCross", "FedIndep", "FedMR", "FedMut", "MultiModelStrategy"]
