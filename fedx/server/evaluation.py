"""Flower's ``evaluate_fn`` for the fedx app: the round clock, central and per-client results."""

import torch
from flwr.app import ArrayRecord, MetricRecord

from fedx.arrays import to_numpy_dict
from fedx.config import RunConfig
from fedx.data import batch_loader, device_batches, load_split
from fedx.outputs import RunRecorder
from fedx.strategy_core.capabilities import EvaluatesPerClient
from fedx.strategy_core.personalized import summarize
from fedx.training import Batches, evaluate, get_device


class RoundEvaluation:
    """Records every round in ``metrics.json``; evaluates the global model centrally.

    Flower calls it before the first round and after every round, after
    federated evaluation. It records the round's wall time (the time between
    calls, minus central evaluation), evaluates the global model on the
    held-out test split every ``eval-every`` rounds and after the last (when
    the run has a global model: ``model`` is ``None`` otherwise), and copies
    the per-client results of the round into ``metrics.json`` when the
    strategy keeps them (:class:`~fedx.strategy_core.capabilities.EvaluatesPerClient`).
    """

    def __init__(
        self, cfg: RunConfig, model: torch.nn.Module | None, recorder: RunRecorder, strategy: object
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.recorder = recorder
        self.per_client = strategy.evaluations if isinstance(strategy, EvaluatesPerClient) else {}
        self.device = get_device(cfg.device)
        self.loader: Batches | None = None
        if model is not None:
            # LEAF: the union of the selected users' test samples.
            test_set = load_split(cfg.dataset, "test", **cfg.data_settings())
            on_device = device_batches(test_set, 256, self.device)
            self.loader = on_device if on_device is not None else batch_loader(test_set, 256)

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Record the round; return the central metrics when they were computed."""
        if server_round > 0:
            self.recorder.record(server_round, **{"round-seconds": self.recorder.round_seconds()})
        self._record_per_client(server_round)
        due = server_round % self.cfg.eval_every == 0 or server_round == self.cfg.num_server_rounds
        metrics = None
        if due and self.model is not None and self.loader is not None:
            weights = to_numpy_dict(arrays)
            self.model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
            loss, accuracy = evaluate(self.model, self.loader, self.device)
            self.recorder.record(server_round, loss=loss, accuracy=accuracy)
            metrics = MetricRecord({"loss": loss, "accuracy": accuracy})
        self.recorder.start_round_clock()
        return metrics

    def _record_per_client(self, server_round: int) -> None:
        results = self.per_client.get(server_round)
        if not results:
            return
        summary = summarize(results)
        self.recorder.record(server_round, **{k: float(v) for k, v in summary.items()})
        self.recorder.record_clients(server_round, {str(r.client_id): r.to_dict() for r in results})
