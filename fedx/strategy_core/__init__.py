"""What fedx's strategies share: the base class, the round loop, checkpoints and the wire.

The methods live in :mod:`fedx.strategies`, one module (or package) each,
and are built from these parts:

- :mod:`~fedx.strategy_core.base`: :class:`~fedx.strategy_core.base.FedxStrategy`,
  node waiting, reply validation and seeded random streams;
- :mod:`~fedx.strategy_core.multi_model`: the pool of K models that the
  multi-model methods update, and :mod:`~fedx.strategy_core.secure`, secure
  recombination;
- :mod:`~fedx.strategy_core.personalized`: per-client evaluation of the
  personalized methods;
- :mod:`~fedx.strategy_core.rounds`, :mod:`~fedx.strategy_core.divergence`,
  :mod:`~fedx.strategy_core.checkpoint`, :mod:`~fedx.strategy_core.capabilities`:
  the round loop, the divergence guard, checkpoints, and what a strategy
  may offer them;
- :mod:`~fedx.strategy_core.client_identity`, :mod:`~fedx.strategy_core.packing`:
  which client a node is, and models sent packed to nodes that read them;
- :mod:`~fedx.strategy_core.keys`: run-config keys several methods declare.

Like the strategies, these import numpy and Flower, never torch.
"""

# First: on a too old Flower, fail with a message that says so.
from fedx.strategy_core.compat import OLDEST_FLWR

__all__ = ["OLDEST_FLWR"]
