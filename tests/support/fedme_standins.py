"""Stand-ins for FedMe's tests: numpy clients of two 'architectures' and the strategy they answer.

Shared by the FedMe strategy's tests (tests/unit/test_strategy_fedme.py), the
property tests and the packed wire's tests.
"""

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from fedx.strategies import FedMe, to_arrayrecord, to_model
from tests.support.standin_grid import NODE_IDS, StandInGrid

WIDTHS = {"narrow": 2, "wide": 5}
# Node i of the stand-in grid is client CLIENT_OF[node] (not in node order).
CLIENT_OF = {node: cid for node, cid in zip(NODE_IDS, (3, 0, 4, 1, 2), strict=True)}


def initial_model(architecture: str, client_id: int) -> dict[str, np.ndarray]:
    """A two-layer numpy 'architecture' whose values tell which client it started on."""
    width = WIDTHS[architecture]
    return {
        "hidden.weight": np.full((width, 4), float(client_id), dtype=np.float32),
        "out.weight": np.full((3, width), float(client_id), dtype=np.float32),
        "out.bias": np.full((3,), float(client_id), dtype=np.float32),
    }


class Predictor:
    """predict_fn: softmax of the output bias, the same for all 6 unlabeled samples."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, architecture: str, model: dict[str, np.ndarray]) -> np.ndarray:
        self.calls.append(architecture)
        bias = model["out.bias"].astype(np.float64)
        probabilities = np.exp(bias - bias.max())
        return np.tile(probabilities / probabilities.sum(), (6, 1))


class NumpyClients:
    """FedMe clients: trained personalized = sent + 1, trained exchanged = sent + 2."""

    def __init__(
        self,
        choose_exchanged: set[int] = frozenset(),
        broken: dict[int, str] | None = None,
        architectures: dict[int, str] | None = None,
    ):
        self.choose_exchanged = set(choose_exchanged)
        self.broken = broken or {}  # client id -> how its train reply goes wrong
        # client id -> the architecture it chooses locally, or how that reply goes wrong
        self.architectures = architectures or {}

    def __call__(self, message: Message) -> Message | None:
        kind = message.metadata.message_type
        cid = CLIENT_OF[message.metadata.dst_node_id]
        if kind == "query":
            return Message(
                RecordDict({"metrics": MetricRecord({"client-id": cid})}), reply_to=message
            )
        if kind == "evaluate":
            model = to_model(message.content["personalized"])
            metrics = {
                "eval-acc": 0.1 * cid,
                "eval-loss": float(model["out.bias"][0]),
                "num-examples": 10 + cid,
            }
            return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=message)
        if "candidate-architectures" in message.content["config"]:
            return self._choose(message, cid)
        return self._train(message, cid)

    def _choose(self, message: Message, cid: int) -> Message | None:
        """Report the architecture of ``self.architectures`` (validation accuracy 0.9 for it)."""
        answer = self.architectures.get(cid, "narrow")
        if answer == "silent":
            return None
        if answer == "error":
            return Message(Error(code=0, reason="KeyError: 'personalized'"), reply_to=message)
        candidates = list(message.content["config"]["candidate-architectures"])
        accuracies = [0.9 if name == answer else 0.5 for name in candidates]
        records = {
            "choice": ConfigRecord({"chosen-architecture": answer}),
            "metrics": MetricRecord({"num-examples": 20, "val-acc-candidates": accuracies}),
        }
        if answer == "no-record":
            del records["choice"]
        return Message(RecordDict(records), reply_to=message)

    def _train(self, message: Message, cid: int) -> Message | None:
        fault = self.broken.get(cid)
        if fault == "silent":
            return None
        if fault == "error":
            return Message(Error(code=0, reason="out of memory"), reply_to=message)
        personalized = {k: v + 1 for k, v in to_model(message.content["personalized"]).items()}
        exchanged = {k: v + 2 for k, v in to_model(message.content["exchanged"]).items()}
        if fault == "nan":
            exchanged["out.bias"] = np.full_like(exchanged["out.bias"], np.nan)
        if fault == "shape":
            # Arrays of the other architecture than the one it was sent.
            other = (
                "wide"
                if message.content["config"]["exchanged-architecture"] == "narrow"
                else "narrow"
            )
            exchanged = initial_model(other, cid)
        records = {
            "personalized": to_arrayrecord(personalized),
            "exchanged": to_arrayrecord(exchanged),
        }
        if fault == "missing":
            del records["exchanged"]
        choice = 1 if cid in self.choose_exchanged or fault == "choice" else 0
        metrics = {"num-examples": 20, "train-loss-personalized": 1.0, "chose-exchanged": choice}
        return Message(RecordDict({**records, "metrics": MetricRecord(metrics)}), reply_to=message)


def make_fedme(predictor=None, **kwargs) -> FedMe:
    settings = {
        "architectures": ("narrow", "wide"),
        "initial_model_fn": initial_model,
        "predict_fn": predictor or Predictor(),
        # These tests' clients start round-robin, in one cluster, unless a test says otherwise.
        "initial_architecture": "round-robin",
        "cluster_rounds": (),
        "seed": 0,
        "min_available_nodes": 1,
        "node_wait_timeout": 1.0,
        **kwargs,
    }
    return FedMe(**settings)


def train_round(strategy: FedMe, grid: StandInGrid, server_round: int):
    messages = list(
        strategy.configure_train(server_round, ArrayRecord(), ConfigRecord({"lr": 0.1}), grid)
    )
    replies = grid.send_and_receive(messages)
    return messages, replies, strategy.aggregate_train(server_round, replies)
