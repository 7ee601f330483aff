"""FedMut: generalized federated learning via stochastic mutation.

Hu et al., "FedMut: Generalized Federated Learning via Stochastic Mutation",
AAAI 2024.
"""

from typing import Any

from fedx.checks import NON_NEGATIVE, UNIT_INTERVAL, Integer, check
from fedx.method import Key, Method
from fedx.ops import Model, dynamic_beta, mutate
from fedx.strategy_core.base import MetricsAggregation
from fedx.strategy_core.keys import NUM_MODELS_KEY, POOL_MEAN_KEY
from fedx.strategy_core.multi_model import MultiModelStrategy, PoolRound
from fedx.strategy_core.secure import SecureRecombination


class FedMut(MultiModelStrategy):
    """FedMut: send K mutations of the global model around its last update.

    Each round the K models are aggregated into ``w_glb``, by their plain
    mean as in the authors' code (a slot whose node did not reply counts with
    the mutation it was sent, so the mutations still cancel out;
    ``pool_mean="weighted"``: the trained models weighted by
    ``weighted_by_key``, which diverges on skewed partitions); with ``g =
    w_glb - w_glb(previous round)``, the next pool is K models ``w_glb + alpha * v_i * g`` where per
    layer half the ``v`` are +1 and half -1 + beta_t (Algorithm 2, eq. 2),
    ``beta_t = max(beta0 (1 - t / beta_rounds), 0)`` (eq. 5). Round 1 sends
    the initial model to every node. The global model is ``w_glb``.

    The arguments after ``beta_rounds`` are
    :class:`~fedx.strategies.MultiModelStrategy`'s.

    Parameters
    ----------
    alpha : float (default: 4.0)
        Mutation range alpha, >= 0: the paper's 4.0 (all its experiments,
        with the local learning rate 0.01). The mutation moves a model by
        alpha times the last global update, which grows with the learning
        rate: at the fedx app's default learning rate, 0.05, alpha = 4
        diverges on the digits and about 1 does not.
    beta0 : float (default: 0.3)
        Initial dynamic preference beta0 in [0, 1] (paper: 0.3 for the CNN
        and VGG-16, 0.5 for ResNet).
    beta_rounds : int (default: 100)
        ``T_b``, the round at which beta_t reaches 0 (authors' code: 100).

    Examples
    --------
    The paper's FedMut for ResNet-20 (alpha 4, beta0 0.5), 10% of the
    clients per round; start it as Flower's ``FedAvg``
    (``strategy.start(grid=grid, initial_arrays=arrays, num_rounds=200)``):

    >>> from fedx.strategies import FedMut
    >>> strategy = FedMut(alpha=4.0, beta0=0.5, fraction_train=0.1, seed=0)
    >>> strategy.alpha, strategy.beta0, strategy.beta_rounds
    (4.0, 0.5, 100)
    """

    # pylint: disable=too-many-arguments,too-many-locals
    def __init__(
        self,
        *,
        alpha: float = 4.0,
        beta0: float = 0.3,
        beta_rounds: int = 100,
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
        self.alpha = check("alpha", alpha, NON_NEGATIVE)
        self.beta0 = check("beta0", beta0, UNIT_INTERVAL)
        self.beta_rounds = check("beta_rounds", beta_rounds, Integer(1))
        self.previous_global: Model | None = None

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        self.log_settings(
            "FedMut settings",
            {
                "Mutation range alpha": self.alpha,
                "Dynamic preference": f"beta0={self.beta0} over {self.beta_rounds} rounds",
            },
        )
        super().summary()

    def checkpoint_state(self) -> dict[str, Any]:
        """The pool state plus ``w_glb`` of the last round, which ``g`` needs."""
        previous = None if self.previous_global is None else dict(self.previous_global)
        return {**super().checkpoint_state(), "previous-global": previous}

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`checkpoint_state` returned."""
        super().restore_checkpoint_state(state)
        if "previous-global" not in state:
            raise ValueError("the strategy state lacks 'previous-global'")
        previous = state["previous-global"]
        self.previous_global = None if previous is None else dict(previous)

    def update_pool(self, trained: PoolRound) -> list[Model]:
        """Aggregate the trained models, then mutate the result."""
        aggregated = self.round_mean(trained)
        # Before the first aggregation every slot holds the initial model w_glb^0.
        previous = self.previous_global if self.previous_global is not None else self.pool[0]
        beta = dynamic_beta(self.beta0, trained.server_round, self.beta_rounds)
        self.previous_global = aggregated
        return mutate(
            aggregated, previous, self.rng, k=len(trained.models), alpha=self.alpha, beta=beta
        )

    def global_model(self, trained: PoolRound, pool: list[Model]) -> Model:
        """The aggregated model ``w_glb`` the mutations are centred on."""
        assert self.previous_global is not None  # set by update_pool this round
        return self.previous_global


METHOD = Method(
    name="fedmut",
    strategy=FedMut,
    description="FedMut (Hu et al., AAAI'24): K mutations of the global model along its last update",
    keys=(
        NUM_MODELS_KEY,
        POOL_MEAN_KEY,
        # What each key does is its argument's description in FedMut's docstring.
        Key("fedmut-alpha", 4.0, NON_NEGATIVE, argument="alpha"),
        Key("fedmut-beta0", 0.3, UNIT_INTERVAL, argument="beta0"),
        Key("fedmut-beta-rounds", 100, Integer(1), argument="beta_rounds"),
    ),
    style={"color": "#D55E00", "linestyle": "-"},
)
