"""FedMut: generalized federated learning via stochastic mutation.

Hu et al., "FedMut: Generalized Federated Learning via Stochastic Mutation",
AAAI 2024.
"""

from logging import INFO
from typing import Any

from flwr.common import log

from fedx.ops import Model, dynamic_beta, mutate
from fedx.strategies.multi_model import MultiModelStrategy


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

    Parameters
    ----------
    alpha : float (default: 4.0)
        Mutation range, >= 0 (the paper uses 4.0 throughout).
    beta0 : float (default: 0.3)
        Initial dynamic preference in [0, 1] (paper: 0.3 for CNN and VGG-16,
        0.5 for ResNet).
    beta_rounds : int (default: 100)
        ``T_b``, the round at which beta_t reaches 0 (authors' code: 100).
    **kwargs
        As for :class:`~fedx.strategies.MultiModelStrategy`.
    """

    def __init__(
        self, *, alpha: float = 4.0, beta0: float = 0.3, beta_rounds: int = 100, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if not 0.0 <= beta0 <= 1.0:
            raise ValueError(f"beta0 must be in [0, 1], got {beta0}")
        if beta_rounds < 1:
            raise ValueError(f"beta_rounds must be >= 1, got {beta_rounds}")
        self.alpha = alpha
        self.beta0 = beta0
        self.beta_rounds = beta_rounds
        self.previous_global: Model | None = None

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        log(INFO, "\t├──> FedMut settings:")
        log(INFO, "\t│\t├── Mutation range alpha: %s", self.alpha)
        log(INFO, "\t│\t└── Dynamic preference: beta0=%s over %d rounds", self.beta0, self.beta_rounds)
        super().summary()

    def state_dict(self) -> dict[str, Any]:
        """The pool state plus ``w_glb`` of the last round, which ``g`` needs."""
        state = super().state_dict()
        state["previous-global"] = (
            None if self.previous_global is None else dict(self.previous_global)
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        super().load_state_dict(state)
        if "previous-global" not in state:
            raise ValueError("the strategy state lacks 'previous-global'")
        previous = state["previous-global"]
        self.previous_global = None if previous is None else dict(previous)

    def update_pool(
        self,
        server_round: int,
        models: list[Model],
        weights: list[float],
        trained: list[bool],
    ) -> list[Model]:
        """Aggregate the trained models, then mutate the result."""
        aggregated = self.round_mean(models, weights, trained)
        # Before the first aggregation every slot holds the initial model w_glb^0.
        previous = self.previous_global if self.previous_global is not None else self.pool[0]
        beta = dynamic_beta(self.beta0, server_round, self.beta_rounds)
        self.previous_global = aggregated
        return mutate(aggregated, previous, self.rng, k=len(models), alpha=self.alpha, beta=beta)

    def global_model(
        self,
        server_round: int,
        models: list[Model],
        weights: list[float],
        trained: list[bool],
        pool: list[Model],
    ) -> Model:
        """The aggregated model ``w_glb`` the mutations are centred on."""
        assert self.previous_global is not None  # set by update_pool this round
        return self.previous_global
