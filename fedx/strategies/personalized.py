"""Personalized evaluation shared by FedMe and FedAvg + fine-tuning.

Each client evaluates its own model (after optional local fine-tuning) on its
own test split and replies with a MetricRecord holding ``eval-acc``,
``eval-loss`` and ``num-examples`` (and ``client-id`` when the strategy does
not know which client a node is). The strategy keeps every client's result
per round and reports the mean and standard deviation over clients.
"""

from dataclasses import dataclass

import numpy as np
from flwr.app import Message, MetricRecord

from fedx.strategies.client_identity import CLIENT_ID_KEY

ACCURACY_KEY = "eval-acc"
LOSS_KEY = "eval-loss"


@dataclass(frozen=True)
class ClientEvaluation:
    """One client's personalized test result in one round.

    Attributes
    ----------
    client_id : int
        The client (its ``partition-id`` in the fedx ClientApp).
    accuracy, loss : float
        On the client's own test split.
    num_examples : int
        Size of that test split.
    architecture : str
        The evaluated model's architecture; empty when every client has the
        same one.
    """

    client_id: int
    accuracy: float
    loss: float
    num_examples: int
    architecture: str = ""

    def to_dict(self) -> dict[str, float | int | str]:
        """The result as ``metrics.json`` stores it under the client's id."""
        row: dict[str, float | int | str] = {
            "accuracy": self.accuracy,
            "loss": self.loss,
            "num-examples": self.num_examples,
        }
        if self.architecture:
            row["architecture"] = self.architecture
        return row


def evaluation_due(server_round: int, every: int, num_rounds: int | None) -> bool:
    """Whether to evaluate after ``server_round``: every ``every`` rounds and the last."""
    return server_round % every == 0 or server_round == num_rounds


def parse_evaluation(
    message: Message, client_id: int | None, architecture: str = ""
) -> ClientEvaluation | str:
    """Read a personalized evaluation reply, or say why it cannot be used.

    Parameters
    ----------
    message : Message
        The reply.
    client_id : int or None
        The client the strategy knows the node as; ``None`` takes the reply's
        ``client-id`` metric (FedAvg + fine-tuning, which never asks).
    architecture : str, optional
        The architecture of the evaluated model.
    """
    if message.has_error():
        return f"the node reported an error: {message.error.reason}"
    records = list(message.content.metric_records.values())
    if len(records) != 1:
        return f"expected one MetricRecord, got {len(records)}"
    metrics = records[0]
    values = {key: metrics.get(key) for key in (ACCURACY_KEY, LOSS_KEY, "num-examples")}
    if client_id is None:
        values[CLIENT_ID_KEY] = metrics.get(CLIENT_ID_KEY)
    if any(not isinstance(v, (int, float)) or not np.isfinite(v) for v in values.values()):
        return f"expected finite {', '.join(values)} metrics, got {values}"
    if values["num-examples"] <= 0 or not 0.0 <= values[ACCURACY_KEY] <= 1.0:
        return f"num-examples must be positive and {ACCURACY_KEY} in [0, 1], got {values}"
    return ClientEvaluation(
        client_id=int(values[CLIENT_ID_KEY]) if client_id is None else client_id,
        accuracy=float(values[ACCURACY_KEY]),
        loss=float(values[LOSS_KEY]),
        num_examples=int(values["num-examples"]),
        architecture=architecture,
    )


def summarize(evaluations: list[ClientEvaluation]) -> MetricRecord:
    """Mean and standard deviation over clients (each client counts once, as in the paper).

    Returns
    -------
    MetricRecord
        ``personalized-accuracy``, ``personalized-accuracy-std`` (population
        standard deviation over clients), ``personalized-loss`` and
        ``evaluated-clients``.
    """
    accuracies = np.array([e.accuracy for e in evaluations], dtype=np.float64)
    losses = np.array([e.loss for e in evaluations], dtype=np.float64)
    return MetricRecord(
        {
            "personalized-accuracy": float(accuracies.mean()),
            "personalized-accuracy-std": float(accuracies.std()),
            "personalized-loss": float(losses.mean()),
            "evaluated-clients": len(evaluations),
        }
    )
