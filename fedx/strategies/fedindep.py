"""FedIndep: K independently trained models, shuffled among nodes."""

from fedx.method import Method
from fedx.ops import Model, recombine
from fedx.strategy_core.keys import NUM_MODELS_KEY, POOL_MEAN_KEY
from fedx.strategy_core.multi_model import MultiModelStrategy, PoolRound


class FedIndep(MultiModelStrategy):
    """K models trained independently: FedMR-p1.0, the paper's extreme ablation.

    Every round the whole trained models are shuffled among the slots and no
    model is ever aggregated with another; only the reported global model is
    the mean of the K trained models. It separates the effect of
    recombination from that of dispatching a different model to each node.

    It has no arguments of its own: they are
    :class:`~fedx.strategies.MultiModelStrategy`'s (``secure`` included: the
    clients may swap layers before the shuffle), and its signature is that
    class's.

    Examples
    --------
    Ten models trained on their own, each round on other clients; start it as
    Flower's ``FedAvg`` (``strategy.start(grid=grid, initial_arrays=arrays)``):

    >>> from fedx.strategies import FedIndep
    >>> strategy = FedIndep(fraction_train=0.1, seed=0)
    >>> strategy.fraction_train
    0.1
    """

    def update_pool(self, trained: PoolRound) -> list[Model]:
        """Shuffle the whole models among the slots (one segment: every layer moves together)."""
        return recombine(trained.models, self.rng, grouping="tensor", segment_fraction=1.0)


METHOD = Method(
    name="fedindep",
    strategy=FedIndep,
    description="FedIndep (Hu et al., KDD'24): K independent models, shuffled whole (FedMR-p1.0)",
    keys=(NUM_MODELS_KEY, POOL_MEAN_KEY),
    style={"color": "#CC79A7", "linestyle": "-"},
)
