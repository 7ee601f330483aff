"""Per-client evaluation, shared by the personalized methods.

Each client evaluates its own model (after optional local fine-tuning) on its
own test split and replies as :mod:`fedx.protocol.personalized` says. The
strategy keeps every client's result per round (``evaluations``, which the
ServerApp writes into ``metrics.json``) and reports the mean and standard
deviation over clients.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Message, MetricRecord

from fedx.protocol.personalized import CLIENT_ID, EVAL_ACCURACY, EVAL_LOSS, NUM_EXAMPLES
from fedx.strategy_core.base import RoundInFlight, Target


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
    keys = (EVAL_ACCURACY, EVAL_LOSS, NUM_EXAMPLES) + ((CLIENT_ID,) if client_id is None else ())
    given = {key: metrics.get(key) for key in keys}
    values = {
        k: float(v) for k, v in given.items() if isinstance(v, (int, float)) and np.isfinite(v)
    }
    if len(values) != len(keys):
        return f"expected finite {', '.join(keys)} metrics, got {given}"
    if values[NUM_EXAMPLES] <= 0 or not 0.0 <= values[EVAL_ACCURACY] <= 1.0:
        return f"{NUM_EXAMPLES} must be positive and {EVAL_ACCURACY} in [0, 1], got {given}"
    return ClientEvaluation(
        client_id=int(values[CLIENT_ID]) if client_id is None else client_id,
        accuracy=values[EVAL_ACCURACY],
        loss=values[EVAL_LOSS],
        num_examples=int(values[NUM_EXAMPLES]),
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


def collect_evaluations(
    evaluations: dict[int, list[ClientEvaluation]],
    in_flight: RoundInFlight[Target],
    replies: Iterable[Message],
    identify: Callable[[Target], tuple[int | None, str]],
) -> MetricRecord | None:
    """Read the replies of an evaluation in flight; keep the round's results; summarize them.

    ``identify(target)`` gives the client id the strategy knows a node as
    (``None``: the reply says) and the evaluated model's architecture.
    Unusable replies are logged and dropped; the results are stored in
    ``evaluations`` under the round, by client id.
    """
    results: dict[int, ClientEvaluation] = {}
    for answer in in_flight.match(replies):
        result = parse_evaluation(answer.message, *identify(answer.target))
        if isinstance(result, str):
            in_flight.dropped(answer, result)
            continue
        results[result.client_id] = result
    if not results:
        return None
    evaluations[in_flight.server_round] = [results[cid] for cid in sorted(results)]
    return summarize(evaluations[in_flight.server_round])


class PerClientEvaluation:
    """What a personalized strategy's evaluation keeps: every client's result, by round.

    A strategy that mixes this in sets :attr:`evaluating` in its
    ``configure_evaluate`` (the nodes asked, and what each stands for) and
    says, if it knows, which client a node is (:meth:`evaluated_client`).
    Their constructors take the two arguments below, which this class
    documents for all of them.

    Parameters
    ----------
    finetune_epochs : int (default: 1)
        Local epochs each client fine-tunes the model it is evaluated with,
        on its own training split, before testing it on its own test split;
        0 tests the model as it is. Matsuda et al. (SDM 2022) fine-tune
        the methods they compare before testing (Sec. 5.1.3, Table 7)
        without giving the epochs: one is our choice.
    evaluate_every : int (default: 1)
        Personalized evaluation every this many rounds, and after the last.
    """

    #: Every client's result, by round (the ServerApp writes them into metrics.json).
    evaluations: dict[int, list[ClientEvaluation]]
    #: The evaluation in flight.
    evaluating: RoundInFlight[Any] | None

    def evaluated_client(self, target: Any) -> tuple[int | None, str]:
        """The client id and model architecture of an evaluated node; ``None``: its reply says."""
        del target
        return None, ""

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Keep every client's test result; report mean and std over clients."""
        del server_round  # the evaluation in flight knows its round
        in_flight, self.evaluating = self.evaluating, None
        if in_flight is None:
            return None
        return collect_evaluations(self.evaluations, in_flight, replies, self.evaluated_client)
