"""FedMR: federated learning via layer-wise model recombination.

Hu et al., "Is Aggregation the Only Choice? Federated Learning via Layer-wise
Model Recombination", KDD 2024 (arXiv:2305.10730).
"""

from logging import INFO

from flwr.common import log

from fedx.ops import GROUPINGS, Model, average, recombine
from fedx.strategies.multi_model import MultiModelStrategy


class FedMR(MultiModelStrategy):
    """FedMR: recombine the layers of the K trained models every round.

    After local training, for every layer a permutation of the K models is
    drawn and new model i takes that layer from trained model pi(i), so every
    uploaded layer is used exactly once (Sec. 4.2). With two-stage training
    (Sec. 4.3) the first ``first_stage_rounds`` rounds are plain FedAvg: every
    slot gets the average of the trained models weighted by
    ``weighted_by_key``. The reported global model is the plain mean of the K
    trained models (Algorithm 1, line 11).

    Parameters
    ----------
    first_stage_rounds : int (default: 0)
        Rounds of FedAvg before recombination starts (the paper uses 100 for
        ResNet-20 and VGG-16, 0 for the CNN).
    grouping : {"tensor", "module"} (default: "tensor")
        What one layer is: each state-dict tensor (the authors' code), or all
        tensors of one module together (weight, bias, BatchNorm statistics).
    segment_fraction : float, optional
        The FedMR-px ablation: with N layers, layer j belongs to segment
        ceil(j / (x N)) and a segment moves as one unit. ``1.0`` moves whole
        models (see :class:`FedIndep`). ``None`` (default) recombines every
        layer on its own.
    **kwargs
        Sampling, record-key and seeding arguments of
        :class:`~fedx.strategies.MultiModelStrategy` (those of Flower's FedAvg
        plus ``num_models``, ``seed`` and ``node_wait_timeout``).
    """

    def __init__(
        self,
        *,
        first_stage_rounds: int = 0,
        grouping: str = "tensor",
        segment_fraction: float | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if first_stage_rounds < 0:
            raise ValueError(f"first_stage_rounds must be >= 0, got {first_stage_rounds}")
        if grouping not in GROUPINGS:
            raise ValueError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")
        if segment_fraction is not None and not 0.0 < segment_fraction <= 1.0:
            raise ValueError(f"segment_fraction must be in (0, 1], got {segment_fraction}")
        self.first_stage_rounds = first_stage_rounds
        self.grouping = grouping
        self.segment_fraction = segment_fraction

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        log(INFO, "\t├──> FedMR settings:")
        log(INFO, "\t│\t├── First-stage (FedAvg) rounds: %d", self.first_stage_rounds)
        log(INFO, "\t│\t├── Layer grouping: %s", self.grouping)
        log(INFO, "\t│\t└── Segment fraction: %s", self.segment_fraction or "off (layer-wise)")
        super().summary()

    def update_pool(
        self,
        server_round: int,
        models: list[Model],
        weights: list[float],
        trained: list[bool],
    ) -> list[Model]:
        """Average in the first stage, recombine layers after it."""
        if server_round <= self.first_stage_rounds:
            fresh = [(m, w) for m, w, ok in zip(models, weights, trained, strict=True) if ok]
            aggregated = average([m for m, _ in fresh], [w for _, w in fresh])
            return [aggregated] * len(models)
        return recombine(
            models,
            self.rng,
            grouping=self.grouping,  # type: ignore[arg-type]
            segment_fraction=self.segment_fraction,
        )
