"""FedBlend: a small multi-model method written outside fedx, registered with it.

Every round each pool model is blended with the mean of the models trained
that round: model i becomes ``w * v_i + (1 - w) * mean(v)``. With ``w = 1``
the K models never meet (like FedIndep without the shuffle); with ``w = 0``
every slot gets the mean (FedAvg with a pool). In between, the pool keeps
its diversity while its spread shrinks by ``w`` every round; the pool's mean
is the mean of the trained models, which is also the global model.

Everything a method needs is here: the strategy (a
:class:`~fedx.strategies.MultiModelStrategy` with one ``update_pool``) and
its declaration (:data:`METHOD`), which this package's entry point hands to
fedx (pyproject.toml, group ``fedx.methods``).
"""

from typing import Any

from fedx.checks import UNIT_INTERVAL, check
from fedx.ops import Model, average
from fedx.registry import Key, Method
from fedx.strategies import MultiModelStrategy, PoolRound
from fedx.strategy_core.keys import POOL_MEAN_KEY


class FedBlend(MultiModelStrategy):
    """Blend every pool model with the round's mean.

    Parameters
    ----------
    own_weight : float (default: 0.5)
        ``w`` in [0, 1]: the weight of a model's own parameters.
    **kwargs
        As for :class:`~fedx.strategies.MultiModelStrategy` (sampling, seed,
        ``pool_mean`` for the mean).
    """

    def __init__(self, *, own_weight: float = 0.5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.own_weight = check("own_weight", own_weight, UNIT_INTERVAL)

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        self.log_settings("FedBlend settings", {"Own weight w": self.own_weight})
        super().summary()

    def update_pool(self, trained: PoolRound) -> list[Model]:
        """``w * v_i + (1 - w) * mean`` for every slot (untrained slots: the model they were sent)."""
        mean = self.round_mean(trained)
        weights = [self.own_weight, 1.0 - self.own_weight]
        return [average([model, mean], weights) for model in trained.models]


#: What fedx needs to run FedBlend by name: ``--run-config 'strategy="fedblend"'``.
METHOD = Method(
    name="fedblend",
    strategy=FedBlend,
    description="FedBlend (an example from outside fedx): each pool model blended with the round's mean",
    keys=(
        POOL_MEAN_KEY,
        Key(
            "fedblend-own-weight",
            0.5,
            UNIT_INTERVAL,
            "weight w of a model's own parameters",
            argument="own_weight",
        ),
    ),
)
