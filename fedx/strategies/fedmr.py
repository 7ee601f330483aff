"""FedMR: federated learning via layer-wise model recombination.

Hu et al., "Is Aggregation the Only Choice? Federated Learning via Layer-wise
Model Recombination", KDD 2024 (arXiv:2305.10730).
"""

from fedx.checks import FRACTION, Flag, Integer, OneOf, Rule, check, renamed
from fedx.method import Key, Method, Variant
from fedx.ops import GROUPINGS, Model, recombine
from fedx.strategy_core.base import MetricsAggregation
from fedx.strategy_core.keys import NUM_MODELS_KEY, POOL_MEAN_KEY
from fedx.strategy_core.multi_model import MultiModelStrategy, PoolRound
from fedx.strategy_core.secure import KEYS as SECURE_KEYS
from fedx.strategy_core.secure import SecureRecombination


class FedMR(MultiModelStrategy):
    """FedMR: recombine the layers of the K trained models every round.

    After local training, for every layer a permutation of the K models is
    drawn and new model i takes that layer from trained model pi(i), so every
    uploaded layer is used exactly once (Sec. 4.2). With two-stage training
    (Sec. 4.3) the first ``first_stage_rounds`` rounds are plain FedAvg: every
    slot gets the mean of the K models. The reported global model is the
    mean of the K trained models (Algorithm 1, line 11). Both are plain
    means, as in the authors' code, unless ``pool_mean="weighted"`` (see
    :meth:`~fedx.strategies.MultiModelStrategy.round_mean`).

    The arguments after ``secure_max_layers`` are
    :class:`~fedx.strategies.MultiModelStrategy`'s but ``secure``, which
    FedMR builds from its ``secure_*`` arguments.

    Parameters
    ----------
    first_stage_rounds : int (default: 0)
        Rounds of FedAvg before recombination starts (two-stage FedMR; the
        paper uses 100 for ResNet-20 and VGG-16, 0 for the CNN).
    grouping : {"tensor", "module"} (default: "tensor")
        What one layer is: each state-dict tensor (the authors' code), or all
        tensors of one module together (weight, bias, BatchNorm statistics).
    segment_fraction : float, optional
        The FedMR-px ablation: with N layers, layer j belongs to segment
        ceil(j / (x N)) and a segment moves as one unit. ``1.0`` moves whole
        models (see :class:`FedIndep`). ``None`` (default; run config: 0)
        recombines every layer on its own.
    secure_recombination : bool (default: False)
        Appendix B: before uploading, the clients exchange random layers
        among themselves, end-to-end encrypted through the server
        (:mod:`fedx.secure`, and the page Secure recombination), so the
        server only receives recombined models. The ClientApp must support
        it (:mod:`fedx.secure.client`). The server-side recombination still
        follows. Each exchange waits at most the ``timeout`` given to
        :meth:`start`. (Any pool strategy can take a
        :class:`~fedx.strategy_core.secure.SecureRecombination` as ``secure``.)
    secure_repeats : int (default: 3)
        r_s, repetitions of the exchange per round (at least 1).
    secure_min_layers : int (default: 2)
        n_l, the fewest layers a client sends its peers per repetition (at
        least 1). Each client sends n in [n_l, n_u] of its layers, "layer"
        as ``grouping`` says. A client whose exchanges leave its trained
        model unchanged does not upload it; more repetitions and layers make
        that rarer (under 1% of uploads with the defaults and K >= 4).
    secure_max_layers : int (default: 4)
        n_u, the most layers a client sends per repetition (at least n_l,
        ``secure_min_layers``; capped at the model's number of layers).

    Examples
    --------
    Two-stage FedMR as the paper runs it on ResNet-20 (10% of the clients per
    round, FedAvg for 100 rounds); it starts as Flower's ``FedAvg`` does:

    >>> from fedx.strategies import FedMR
    >>> strategy = FedMR(first_stage_rounds=100, fraction_train=0.1, seed=0)
    >>> strategy.first_stage_rounds, strategy.grouping, strategy.fraction_train
    (100, 'tensor', 0.1)
    """

    # pylint: disable=too-many-arguments,too-many-locals
    def __init__(
        self,
        *,
        first_stage_rounds: int = 0,
        grouping: str = "tensor",
        segment_fraction: float | None = None,
        secure_recombination: bool = False,
        secure_repeats: int = 3,
        secure_min_layers: int = 2,
        secure_max_layers: int = 4,
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
    ) -> None:
        self.first_stage_rounds = check("first_stage_rounds", first_stage_rounds, Integer(0))
        self.grouping = check("grouping", grouping, OneOf(GROUPINGS))
        self.segment_fraction = (
            None
            if segment_fraction is None
            else check("segment_fraction", segment_fraction, FRACTION)
        )
        secure = None
        if check("secure_recombination", secure_recombination, Flag()):
            with renamed("secure_"):
                secure = SecureRecombination(
                    secure_repeats, secure_min_layers, secure_max_layers, grouping
                )
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

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        self.log_settings(
            "FedMR settings",
            {
                "First-stage (FedAvg) rounds": self.first_stage_rounds,
                "Layer grouping": self.grouping,
                "Segment fraction": self.segment_fraction or "off (layer-wise)",
            },
        )
        super().summary()

    def update_pool(self, trained: PoolRound) -> list[Model]:
        """Average in the first stage, recombine layers after it."""
        if trained.server_round <= self.first_stage_rounds:
            return [self.round_mean(trained)] * len(trained.models)
        return recombine(
            trained.models,
            self.rng,
            grouping=self.grouping,
            segment_fraction=self.segment_fraction,
        )


def _two_stage(config) -> str | None:
    rounds, total = config["first-stage-rounds"], config["num-server-rounds"]
    if 0 < rounds < total:
        return None
    return (
        "needs 0 < first-stage-rounds < num-server-rounds in the setting, got "
        f"first-stage-rounds={rounds}, num-server-rounds={total}"
    )


#: FedMR's run-config name, keys and fedx-compare variants.
METHOD = Method(
    name="fedmr",
    strategy=FedMR,
    description="FedMR (Hu et al., KDD'24): layer-wise recombination of the K trained models",
    keys=(
        NUM_MODELS_KEY,
        POOL_MEAN_KEY,
        # What each key does is its argument's description in FedMR's docstring.
        Key("first-stage-rounds", 0, Integer(0), argument="first_stage_rounds"),
        Key("grouping", "tensor", OneOf(GROUPINGS), argument="grouping"),
        Key(
            "segment-fraction",
            0.0,
            Rule(
                float,
                lambda v: 0.0 <= v <= 1.0,
                "0 (off: layer-wise recombination) or a number in (0, 1]",
            ),
            argument="segment_fraction",
            parse=lambda value: value or None,  # 0 switches segments off
        ),
        *SECURE_KEYS,
    ),
    variants=(
        # One-stage FedMR, whatever the setting's first stage.
        Variant("fedmr", {"first-stage-rounds": 0}, style={"color": "#0072B2", "linestyle": "-"}),
        # The setting's first stage: the papers' FedMR for ResNet-20 and VGG-16.
        Variant(
            "fedmr-two-stage",
            requires=_two_stage,
            style={"color": "#56B4E9", "linestyle": "-"},
        ),
    ),
)
