"""FedMe: personalized federated learning via model exchange.

Matsuda et al., "FedMe: Federated Learning via Model Exchange", SDM 2022
(arXiv:2110.07868), Sec. 4. Its parts, one module each: the strategy and
its run-config declaration (:mod:`~fedx.strategies.fedme.strategy`), the
clients joining and choosing their first architecture
(:mod:`~fedx.strategies.fedme.registration`), clustering the models by their
outputs (:mod:`~fedx.strategies.fedme.clustering`), and the messages to and
from the clients (:mod:`~fedx.strategies.fedme.clients`).
"""

from fedx.strategies.fedme.strategy import METHOD, FedMe, InitialModelFn, PredictFn

__all__ = ["METHOD", "FedMe", "InitialModelFn", "PredictFn"]
