"""FedAvg with local fine-tuning, evaluated per client: the strongest personalized baseline.

Matsuda et al. (SDM 2022, Sec. 5) find that FedAvg whose global model every
client fine-tunes on its own data before testing beats the personalized
methods they compare with; only their own method matches it.
"""

from collections.abc import Iterable
from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedx.checks import Integer, check
from fedx.method import Method
from fedx.ops import Model, average
from fedx.protocol.personalized import FINETUNE_EPOCHS
from fedx.strategy_core.base import (
    FedxStrategy,
    MetricsAggregation,
    RoundInFlight,
    read_reply,
    to_arrayrecord,
    to_model,
)
from fedx.strategy_core.keys import FINETUNE_EPOCHS_KEY
from fedx.strategy_core.personalized import ClientEvaluation, PerClientEvaluation


class FedAvgFT(PerClientEvaluation, FedxStrategy[tuple[RoundInFlight[None], Model]], FedAvg):
    """FedAvg whose evaluation fine-tunes the global model on each client first.

    Training is Flower's FedAvg, with fedx's reply checks: a reply whose
    arrays do not fit the global model it was sent (names, shapes, dtypes,
    NaN or Inf), that lacks a positive ``weighted_by_key``, or that comes
    from a node not sent the round's model is logged and left out of the
    average, which fedx computes without overflow (:func:`fedx.ops.average`).
    Every ``evaluate_every`` rounds (and after
    the last) the global model goes to every connected node
    (``fraction_evaluate`` of them, 1.0 by default) with
    ``finetune-epochs`` in the config; the client trains it that many epochs
    on its own training data, tests it on its own test split and replies with
    ``eval-acc``, ``eval-loss``, ``num-examples`` and its ``client-id``. The
    strategy keeps every client's result (:attr:`evaluations`) and reports
    the mean and standard deviation over clients, as personalized methods do.

    Its arguments are :class:`~fedx.strategy_core.personalized.PerClientEvaluation`'s
    (``finetune_epochs``: 0 tests the global model itself on every client's
    test split, FedAvg without fine-tuning), :class:`~fedx.strategies.FedxStrategy`'s
    and Flower's ``FedAvg``'s, as those classes document them.

    Examples
    --------
    FedAvg evaluated after one epoch of fine-tuning on each client, every
    fifth round; its ClientApp's evaluate replies carry ``eval-acc``,
    ``eval-loss``, ``num-examples`` and ``client-id``:

    >>> from fedx.strategies import FedAvgFT
    >>> strategy = FedAvgFT(finetune_epochs=1, evaluate_every=5, fraction_train=0.1)
    >>> strategy.finetune_epochs, strategy.evaluate_every, strategy.fraction_evaluate
    (1, 5, 1.0)
    """

    # pylint: disable=too-many-arguments
    def __init__(
        self,
        *,
        finetune_epochs: int = 1,
        evaluate_every: int = 1,
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
    ) -> None:
        super().__init__(
            seed=seed,
            node_wait_timeout=node_wait_timeout,
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
        )
        self.finetune_epochs = check("finetune_epochs", finetune_epochs, Integer(0))
        self.evaluate_every = check("evaluate_every", evaluate_every, Integer(1))
        self.evaluations: dict[int, list[ClientEvaluation]] = {}
        # The evaluation in flight: the nodes asked (each reply says which client it is).
        self.evaluating: RoundInFlight[None] | None = None

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        self.log_settings(
            "Personalized evaluation",
            {
                "Fine-tuning": f"{self.finetune_epochs} epoch(s)",
                "Every": f"{self.evaluate_every} round(s), and the last",
            },
        )
        super().summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's training messages; remember whom they went to, and the model."""
        messages = list(super().configure_train(server_round, arrays, config, grid))
        in_flight = RoundInFlight(
            server_round,
            {m.metadata.dst_node_id: None for m in messages},
            messages,
            describe=lambda _: "training",
            consequence="left out of the average",
        )
        self.training.put((in_flight, to_model(arrays)))
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The weighted mean of the usable replies (FedAvg's rule); the others logged and dropped."""
        in_flight, sent = self.training.take()
        models, weights, contents = [], [], []
        for answer in in_flight.match(replies):
            parsed = read_reply(answer.message, sent, self.arrayrecord_key, self.weighted_by_key)
            if isinstance(parsed, str):
                in_flight.dropped(answer, parsed)
                continue
            models.append(parsed[0])
            weights.append(parsed[1])
            contents.append(answer.message.content)
        log(INFO, "aggregate_train: %d of %d replies used", len(models), len(in_flight.targets))
        if not models:
            return None, None
        metrics = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        return to_arrayrecord(average(models, weights)), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the global model with the fine-tuning epochs, when an evaluation is due."""
        if not self.evaluation_due(server_round, self.evaluate_every):
            return []
        config[FINETUNE_EPOCHS] = self.finetune_epochs
        messages = list(super().configure_evaluate(server_round, arrays, config, grid))
        self.evaluating = RoundInFlight(
            server_round,
            {m.metadata.dst_node_id: None for m in messages},
            messages,
            describe=lambda _: "evaluation",
        )
        return messages


METHOD = Method(
    name="fedavg-ft",
    strategy=FedAvgFT,
    description="FedAvg evaluated per client after local fine-tuning (Matsuda et al.'s baseline)",
    keys=(FINETUNE_EPOCHS_KEY,),
    # Personalized evaluation covers every client, whatever fraction-evaluate says.
    takes=(
        "fraction-train",
        "min-train-nodes",
        "min-evaluate-nodes",
        "min-available-nodes",
        "eval-every",
    ),
    personalized=True,
    style={"color": "#555555", "linestyle": "-."},
)
