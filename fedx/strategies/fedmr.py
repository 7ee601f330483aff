"""FedMR: federated learning via layer-wise model recombination.

Hu et al., "Is Aggregation the Only Choice? Federated Learning via Layer-wise
Model Recombination", KDD 2024 (arXiv:2305.10730).
"""

from collections.abc import Iterable
from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid

from fedx.ops import GROUPINGS, Model, recombine
from fedx.secure.relay import RelayStats, SecureRelay
from fedx.secure.wire import FLAG_KEY, GROUPING_KEY, MAX_LAYERS_KEY, MIN_LAYERS_KEY
from fedx.strategies.multi_model import MultiModelStrategy


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
    secure_recombination : bool (default: False)
        Appendix B: before uploading, the clients exchange random layers
        among themselves, end-to-end encrypted through the server
        (:mod:`fedx.secure`), so the server only receives recombined models.
        The ClientApp must support it (:mod:`fedx.secure.client`). The
        server-side recombination still follows. Each exchange waits at most
        the ``timeout`` given to :meth:`start`.
    secure_repeats : int (default: 3)
        r_s, repetitions of the exchange per round (at least 1).
    secure_min_layers, secure_max_layers : int (default: 2, 4)
        n_l <= n_u: each client sends n in [n_l, n_u] of its layers per
        repetition (capped at the number of layers). "Layer" follows
        ``grouping``. A client whose exchanges leave its trained model
        unchanged does not upload it; more repetitions and layers make that
        rarer (under 1% of uploads with the defaults and K >= 4).
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
        secure_recombination: bool = False,
        secure_repeats: int = 3,
        secure_min_layers: int = 2,
        secure_max_layers: int = 4,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if first_stage_rounds < 0:
            raise ValueError(f"first_stage_rounds must be >= 0, got {first_stage_rounds}")
        if grouping not in GROUPINGS:
            raise ValueError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")
        if segment_fraction is not None and not 0.0 < segment_fraction <= 1.0:
            raise ValueError(f"segment_fraction must be in (0, 1], got {segment_fraction}")
        if secure_repeats < 1:
            raise ValueError(f"secure_repeats must be >= 1, got {secure_repeats}")
        if secure_recombination and self.pool_mean == "weighted":
            # After a secure exchange a model's layers come from several
            # clients, so its uploader's example count no longer weights them.
            raise ValueError(
                "pool_mean='weighted' cannot be used with secure_recombination: "
                "the uploaded models mix several clients' layers"
            )
        if not 1 <= secure_min_layers <= secure_max_layers:
            raise ValueError(
                "secure layers must satisfy 1 <= secure_min_layers <= secure_max_layers, "
                f"got {secure_min_layers} and {secure_max_layers}"
            )
        self.first_stage_rounds = first_stage_rounds
        self.grouping = grouping
        self.segment_fraction = segment_fraction
        self.secure_recombination = secure_recombination
        self.secure_repeats = secure_repeats
        self.secure_min_layers = secure_min_layers
        self.secure_max_layers = secure_max_layers
        #: What the last round's secure exchange cost (None before the first).
        self.relay_stats: RelayStats | None = None
        self._grid: Grid | None = None

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        log(INFO, "\t├──> FedMR settings:")
        log(INFO, "\t│\t├── First-stage (FedAvg) rounds: %d", self.first_stage_rounds)
        log(INFO, "\t│\t├── Layer grouping: %s", self.grouping)
        log(INFO, "\t│\t├── Segment fraction: %s", self.segment_fraction or "off (layer-wise)")
        if self.secure_recombination:
            log(
                INFO,
                "\t│\t└── Secure recombination: r_s=%d, n in [%d, %d]",
                self.secure_repeats, self.secure_min_layers, self.secure_max_layers,
            )
        else:
            log(INFO, "\t│\t└── Secure recombination: off")
        super().summary()

    # pylint: disable=too-many-arguments
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send every sampled node its pool model; ask for secure recombination if on."""
        if self.secure_recombination:
            self._grid = grid
            config[FLAG_KEY] = True
            config[MIN_LAYERS_KEY] = self.secure_min_layers
            config[MAX_LAYERS_KEY] = self.secure_max_layers
            config[GROUPING_KEY] = self.grouping
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """With secure recombination, exchange layers first; then recombine as usual.

        The training replies then carry public keys only; the relay turns
        them into upload replies, which go through the usual validation.
        """
        if not self.secure_recombination:
            return super().aggregate_train(server_round, replies)
        if self._grid is None:
            raise RuntimeError("secure recombination needs configure_train to have been called")
        relay = SecureRelay(self._grid, timeout=self.round_timeout, repeats=self.secure_repeats)
        uploads = relay.run(server_round, replies)
        self.relay_stats = relay.stats
        arrays, metrics = super().aggregate_train(server_round, uploads)
        if metrics is not None:
            metrics["secure-exchanges"] = relay.stats.exchanges
            metrics["secure-layer-bytes"] = relay.stats.layer_bytes
            metrics["secure-seconds"] = relay.stats.seconds
            metrics["secure-aborted"] = relay.stats.aborted
        return arrays, metrics

    def update_pool(
        self,
        server_round: int,
        models: list[Model],
        weights: list[float],
        trained: list[bool],
    ) -> list[Model]:
        """Average in the first stage, recombine layers after it."""
        if server_round <= self.first_stage_rounds:
            return [self.round_mean(models, weights, trained)] * len(models)
        return recombine(
            models,
            self.rng,
            grouping=self.grouping,  # type: ignore[arg-type]
            segment_fraction=self.segment_fraction,
        )
