"""FedCross: federated learning via multi-model cross aggregation.

Hu et al., "FedCross: Towards Accurate Federated Learning via Multi-Model
Cross-Aggregation", ICDE 2024.
"""

from logging import INFO

from flwr.common import log

from fedx.ops import SELECTIONS, Model, average, cross_aggregate
from fedx.strategies.multi_model import MultiModelStrategy


class FedCross(MultiModelStrategy):
    """FedCross: every middleware model is fused with a collaborator.

    Each round the sampled nodes are shuffled over the K middleware models
    (Algorithm 1, line 5); after training, model i becomes
    ``alpha * v_i + (1 - alpha) * v_co`` with the collaborator picked by
    ``selection`` (Sec. 3.2). The global model, for deployment only, is the
    plain mean of the new middleware models (``pool_mean="weighted"``: each
    weighted by the reply its slot trained this round, untrained slots left
    out).

    Parameters
    ----------
    alpha : float (default: 0.99)
        Weight of a model's own parameters, in [0.5, 1) (paper: 0.99).
    selection : {"in_order", "highest_similarity", "lowest_similarity"}
        Collaborator rule (default: "lowest_similarity", the paper's best).
        In-order uses the paper's round counter r = server_round - 1.
    propeller_rounds : int (default: 0)
        For the first rounds, fuse with two in-order propeller models:
        ``alpha * v_i + (1 - alpha) / 2 * (p1 + p2)``.
    dynamic_alpha_rounds : int (default: 0)
        Let alpha grow linearly from ``alpha_start`` to ``alpha`` over this
        many rounds, starting after the propeller rounds (so propellers for
        rounds 1-50 and dynamic alpha for 51-100 is the paper's PM-DA).
        0 keeps alpha fixed.
    alpha_start : float (default: 0.5)
        Starting alpha of the dynamic schedule, in [0.5, alpha].
    **kwargs
        As for :class:`~fedx.strategies.MultiModelStrategy`.
    """

    # pylint: disable=too-many-arguments
    def __init__(
        self,
        *,
        alpha: float = 0.99,
        selection: str = "lowest_similarity",
        propeller_rounds: int = 0,
        dynamic_alpha_rounds: int = 0,
        alpha_start: float = 0.5,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if not 0.5 <= alpha < 1.0:
            raise ValueError(f"alpha must be in [0.5, 1), got {alpha}")
        if selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
        if propeller_rounds < 0 or dynamic_alpha_rounds < 0:
            raise ValueError(
                "propeller_rounds and dynamic_alpha_rounds must be >= 0, "
                f"got {propeller_rounds} and {dynamic_alpha_rounds}"
            )
        if not 0.5 <= alpha_start <= alpha:
            raise ValueError(f"alpha_start must be in [0.5, alpha={alpha}], got {alpha_start}")
        self.alpha = alpha
        self.selection = selection
        self.propeller_rounds = propeller_rounds
        self.dynamic_alpha_rounds = dynamic_alpha_rounds
        self.alpha_start = alpha_start

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        log(INFO, "\t├──> FedCross settings:")
        log(INFO, "\t│\t├── alpha: %s, collaborator selection: %s", self.alpha, self.selection)
        log(INFO, "\t│\t├── Propeller rounds: %d", self.propeller_rounds)
        log(INFO, "\t│\t└── Dynamic alpha: from %s over %d rounds", self.alpha_start, self.dynamic_alpha_rounds)
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

    def update_pool(
        self,
        server_round: int,
        models: list[Model],
        weights: list[float],
        trained: list[bool],
    ) -> list[Model]:
        """Cross-aggregate every middleware model with its collaborator(s)."""
        if len(models) < 2:
            return list(models)  # nobody to collaborate with
        return cross_aggregate(
            models,
            alpha=self.alpha_at(server_round),
            selection=self.selection,  # type: ignore[arg-type]
            round_index=server_round - 1,
            propeller=server_round <= self.propeller_rounds,
        )

    def global_model(
        self,
        server_round: int,
        models: list[Model],
        weights: list[float],
        trained: list[bool],
        pool: list[Model],
    ) -> Model:
        """The mean of the new middleware models (GlobalModelGen)."""
        return average(pool, weights if self.pool_mean == "weighted" else None)
