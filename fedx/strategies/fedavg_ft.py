"""FedAvg with local fine-tuning, evaluated per client: FedMe's strongest baseline.

Matsuda et al. (SDM 2022, Sec. 5) find that FedAvg whose global model every
client fine-tunes on its own data before testing beats the personalized
methods they compare with; only FedMe matches it.
"""

from collections.abc import Callable, Iterable
from logging import INFO, WARNING

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from fedx.strategies.personalized import (
    ClientEvaluation,
    evaluation_due,
    parse_evaluation,
    summarize,
)


class FedAvgFT(FedAvg):
    """FedAvg whose evaluation fine-tunes the global model on each client first.

    Training is Flower's FedAvg. Every ``evaluate_every`` rounds (and after
    the last) the global model goes to every connected node
    (``fraction_evaluate`` of them, 1.0 by default) with
    ``finetune-epochs`` in the config; the client trains it that many epochs
    on its own training data, tests it on its own test split and replies with
    ``eval-acc``, ``eval-loss``, ``num-examples`` and its ``client-id``. The
    strategy keeps every client's result (:attr:`evaluations`) and reports
    the mean and standard deviation over clients, as for FedMe.

    Parameters
    ----------
    finetune_epochs : int (default: 1)
        Local fine-tuning epochs before testing; 0 tests the global model
        itself on every client's test split (FedAvg without fine-tuning).
    evaluate_every : int (default: 1)
        Evaluate every this many rounds, and after the last.
    **kwargs
        Flower's FedAvg arguments; ``fraction_evaluate`` defaults to 1.0.
    """

    def __init__(self, *, finetune_epochs: int = 1, evaluate_every: int = 1, **kwargs) -> None:
        kwargs.setdefault("fraction_evaluate", 1.0)
        super().__init__(**kwargs)
        if finetune_epochs < 0:
            raise ValueError(f"finetune_epochs must be >= 0, got {finetune_epochs}")
        if evaluate_every < 1:
            raise ValueError(f"evaluate_every must be >= 1, got {evaluate_every}")
        self.finetune_epochs = finetune_epochs
        self.evaluate_every = evaluate_every
        self.evaluations: dict[int, list[ClientEvaluation]] = {}
        self._num_rounds: int | None = None

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        log(INFO, "\t├──> Personalized evaluation: fine-tuning %d epoch(s), every %d round(s)",
            self.finetune_epochs, self.evaluate_every)
        super().summary()

    # pylint: disable=too-many-arguments,too-many-positional-arguments
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run FedAvg; remembers ``num_rounds`` so that the last round is always evaluated."""
        self.begin_run(num_rounds=num_rounds, timeout=timeout)
        return super().start(grid, initial_arrays, num_rounds, timeout, train_config,
                             evaluate_config, evaluate_fn)

    def begin_run(self, *, num_rounds: int, timeout: float) -> None:
        """Learn the run's last round (called by ``start`` and ``run_rounds``): it is always evaluated."""
        del timeout
        self._num_rounds = num_rounds

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the global model with the fine-tuning epochs, when an evaluation is due."""
        if not evaluation_due(server_round, self.evaluate_every, self._num_rounds):
            return []
        config["finetune-epochs"] = self.finetune_epochs
        return super().configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Keep every client's test result; report mean and std over clients."""
        results: dict[int, ClientEvaluation] = {}
        for message in replies:
            result = parse_evaluation(message, client_id=None)
            if isinstance(result, str):
                log(WARNING, "Round %s: dropped the evaluation of node %s: %s",
                    server_round, message.metadata.src_node_id, result)
                continue
            results[result.client_id] = result
        if not results:
            return None
        self.evaluations[server_round] = [results[cid] for cid in sorted(results)]
        return summarize(self.evaluations[server_round])
