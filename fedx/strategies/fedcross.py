"""FedCross: federated learning via multi-model cross aggregation.

Hu et al., "FedCross: Towards Accurate Federated Learning via Multi-Model
Cross-Aggregation", ICDE 2024.
"""

from fedx.checks import Integer, Number, OneOf, check
from fedx.method import Key, Method
from fedx.ops import SELECTIONS, SIMILARITY_MEASURES, Model, average, cross_aggregate
from fedx.strategy_core.base import MetricsAggregation
from fedx.strategy_core.keys import NUM_MODELS_KEY, POOL_MEAN_KEY
from fedx.strategy_core.multi_model import MultiModelStrategy, PoolRound
from fedx.strategy_core.secure import SecureRecombination

#: A model's own weight in a fusion, [0.5, 1).
ALPHA = Number(0.5, 1.0, high_open=True)


class FedCross(MultiModelStrategy):
    """FedCross: every middleware model is fused with a collaborator.

    Each round the sampled nodes are shuffled over the K middleware models
    (Algorithm 1, line 5); after training, model i becomes
    ``alpha * v_i + (1 - alpha) * v_co`` with the collaborator picked by
    ``selection`` (Sec. 3.2). The global model, for deployment only, is the
    plain mean of the new middleware models (``pool_mean="weighted"``: each
    weighted by the reply its slot trained this round, untrained slots left
    out).

    The arguments after ``alpha_start`` are
    :class:`~fedx.strategies.MultiModelStrategy`'s.

    Parameters
    ----------
    alpha : float (default: 0.99)
        Weight alpha of a model's own parameters in its fusion, in [0.5, 1)
        (paper: 0.99).
    selection : {"in_order", "highest_similarity", "lowest_similarity"} (default: "lowest_similarity")
        Collaborator rule: the paper's best, the least similar model, by
        default. In-order uses the paper's round counter
        r = server_round - 1. A model never picks itself, whatever the
        measure gives it.
    similarity : {"model", "layer-pairs"} (default: "model")
        What the similarity rules compare: the paper's cosine over all
        floating-point parameters as one vector, or ``"layer-pairs"``, the
        quantity the FedCross code of the authors' lab computes (the sum of
        cosines of consecutive pairs of state-dict entries, see
        :func:`fedx.ops.cosine_similarity_matrix`). Not used by
        ``"in_order"`` or in propeller rounds.
    propeller_rounds : int (default: 0)
        For the first this many rounds, fuse with two in-order propeller
        models: ``alpha * v_i + (1 - alpha) / 2 * (p1 + p2)``.
    dynamic_alpha_rounds : int (default: 0)
        Let alpha grow linearly from ``alpha_start`` to ``alpha`` over this
        many rounds, starting after the propeller rounds (so propellers for
        rounds 1-50 and dynamic alpha for 51-100 is the paper's PM-DA).
        0 keeps alpha fixed.
    alpha_start : float (default: 0.5)
        Starting alpha of the dynamic schedule, in [0.5, ``alpha``].

    Examples
    --------
    The paper's FedCross (alpha 0.99, the least similar collaborator) with
    its PM-DA acceleration: propeller models for rounds 1-50, then alpha
    growing from 0.5 over rounds 51-100. Start it as Flower's ``FedAvg``
    (``strategy.start(grid=grid, initial_arrays=arrays, num_rounds=200)``):

    >>> from fedx.strategies import FedCross
    >>> strategy = FedCross(
    ...     alpha=0.99, propeller_rounds=50, dynamic_alpha_rounds=50, fraction_train=0.1, seed=0
    ... )
    >>> strategy.selection, [round(strategy.alpha_at(r), 3) for r in (51, 76, 101)]
    ('lowest_similarity', [0.5, 0.745, 0.99])
    """

    # pylint: disable=too-many-arguments,too-many-locals
    def __init__(
        self,
        *,
        alpha: float = 0.99,
        selection: str = "lowest_similarity",
        similarity: str = "model",
        propeller_rounds: int = 0,
        dynamic_alpha_rounds: int = 0,
        alpha_start: float = 0.5,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: MetricsAggregation | None = None,
        evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
        seed: int | None = None,
        node_wait_timeout: float = 60.0,
        num_models: int | None = None,
        pool_mean: str = "uniform",
        unresponsive_cooldown: float = 60.0,
        secure: SecureRecombination | None = None,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
            seed=seed,
            node_wait_timeout=node_wait_timeout,
            num_models=num_models,
            pool_mean=pool_mean,
            unresponsive_cooldown=unresponsive_cooldown,
            secure=secure,
        )
        self.alpha = check("alpha", alpha, ALPHA)
        self.selection = check("selection", selection, OneOf(SELECTIONS))
        self.similarity = check("similarity", similarity, OneOf(SIMILARITY_MEASURES))
        self.propeller_rounds = check("propeller_rounds", propeller_rounds, Integer(0))
        self.dynamic_alpha_rounds = check("dynamic_alpha_rounds", dynamic_alpha_rounds, Integer(0))
        self.alpha_start = check("alpha_start", alpha_start, Number(0.5, self.alpha))

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        self.log_settings(
            "FedCross settings",
            {
                "alpha": self.alpha,
                "Collaborator selection": self.selection
                + ("" if self.selection == "in_order" else f" ({self.similarity} similarity)"),
                "Propeller rounds": self.propeller_rounds,
                "Dynamic alpha": f"from {self.alpha_start} over {self.dynamic_alpha_rounds} rounds",
            },
        )
        super().summary()

    def alpha_at(self, server_round: int) -> float:
        """Alpha used to fuse the models trained in ``server_round``."""
        if self.dynamic_alpha_rounds == 0:
            return self.alpha
        done = server_round - 1 - self.propeller_rounds
        progress = min(max(done / self.dynamic_alpha_rounds, 0.0), 1.0)
        return self.alpha_start + (self.alpha - self.alpha_start) * progress

    def assign_slots(self, num_nodes: int) -> list[int]:
        """Shuffle which node trains which middleware model."""
        return [int(slot) for slot in self.rng.permutation(len(self.pool))[:num_nodes]]

    def update_pool(self, trained: PoolRound) -> list[Model]:
        """Cross-aggregate every middleware model with its collaborator(s)."""
        if len(trained.models) < 2:
            return list(trained.models)  # nobody to collaborate with
        server_round = trained.server_round
        return cross_aggregate(
            trained.models,
            alpha=self.alpha_at(server_round),
            selection=self.selection,
            measure=self.similarity,
            round_index=server_round - 1,
            propeller=server_round <= self.propeller_rounds,
        )

    def global_model(self, trained: PoolRound, pool: list[Model]) -> Model:
        """The mean of the new middleware models (GlobalModelGen)."""
        return average(pool, trained.weights if self.pool_mean == "weighted" else None)


METHOD = Method(
    name="fedcross",
    strategy=FedCross,
    description="FedCross (Hu et al., ICDE'24): each model fused with a collaborator by cosine similarity",
    keys=(
        NUM_MODELS_KEY,
        POOL_MEAN_KEY,
        # What each key does is its argument's description in FedCross's docstring.
        Key("fedcross-alpha", 0.99, ALPHA, argument="alpha"),
        Key("fedcross-selection", "lowest_similarity", OneOf(SELECTIONS), argument="selection"),
        Key("fedcross-similarity", "model", OneOf(SIMILARITY_MEASURES), argument="similarity"),
        Key("fedcross-propeller-rounds", 0, Integer(0), argument="propeller_rounds"),
        Key("fedcross-dynamic-alpha-rounds", 0, Integer(0), argument="dynamic_alpha_rounds"),
        # At most fedcross-alpha: the constructor checks the pair.
        Key("fedcross-alpha-start", 0.5, ALPHA, argument="alpha_start"),
    ),
    style={"color": "#009E73", "linestyle": "-"},
)
