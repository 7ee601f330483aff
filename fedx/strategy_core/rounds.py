"""Flower's round loop, able to start at a later round and to report every round.

``Strategy.start`` in Flower always counts rounds from 1 and returns only at
the end. :func:`run_rounds` is the same loop (configure and aggregate
training, then federated evaluation, then the ``evaluate_fn``) for any
message-API strategy, Flower's own included, with two additions that resuming
needs: ``start_round`` continues the numbering of an interrupted run, and
``on_round_end`` is called after every round, which is where a ServerApp
writes its checkpoint. A :class:`~fedx.strategy_core.divergence.DivergenceGuard`
stops a run that diverged.
"""

import io
import time
from collections.abc import Callable
from logging import INFO, WARNING

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.serverapp.strategy.strategy_utils import log_strategy_start_info

from fedx.messaging import send_and_collect
from fedx.strategy_core.capabilities import RunAware
from fedx.strategy_core.divergence import DivergenceGuard

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
RoundEndFn = Callable[[int, ArrayRecord, Result], None]


# pylint: disable=too-many-arguments,too-many-locals
def run_rounds(
    strategy: Strategy,
    grid: Grid,
    initial_arrays: ArrayRecord,
    num_rounds: int = 3,
    timeout: float = 3600,
    train_config: ConfigRecord | None = None,
    evaluate_config: ConfigRecord | None = None,
    evaluate_fn: EvaluateFn | None = None,
    *,
    start_round: int = 1,
    result: Result | None = None,
    on_round_end: RoundEndFn | None = None,
    guard: DivergenceGuard | None = None,
) -> Result:
    """Run rounds ``start_round`` to ``num_rounds`` of ``strategy``.

    The parameters after ``strategy`` are those of Flower's ``Strategy.start``
    (:meth:`fedx.strategies.FedxStrategy.start` is this function), plus
    ``start_round`` and the keywords after it.

    Parameters
    ----------
    strategy : Strategy
        Any Flower message-API strategy; for a resumed run, with its state
        already restored.
    grid : Grid
        The Grid of the ServerApp.
    initial_arrays : ArrayRecord
        The global model the first round starts from: the initial model, or
        the global model of the checkpoint's round.
    num_rounds : int (default: 3)
        The last round.
    timeout : float (default: 3600)
        Seconds each exchange waits for replies (:func:`~fedx.messaging.send_and_collect`).
    train_config, evaluate_config : ConfigRecord, optional
        Sent to the nodes with every training / evaluation message.
    evaluate_fn : callable, optional
        Centralized evaluation, called as ``evaluate_fn(round, arrays)``.
    start_round : int (default: 1)
        The first round to run. Rounds before it count as done: the
        ``evaluate_fn`` of round 0 runs only when ``start_round`` is 1. To
        continue a checkpointed run, restore the strategy
        (:func:`fedx.strategies.restore_run`), pass the checkpoint's global
        arrays as ``initial_arrays`` and its round + 1 here.
    result : Result, optional
        The metrics of the rounds already done (from a checkpoint); new rounds
        are added to it.
    on_round_end : callable, optional
        Called as ``on_round_end(round, arrays, result)`` after each round,
        once evaluation is done: the state of the strategy, ``arrays`` and
        ``result`` then describe exactly ``round`` completed rounds. With a
        ``guard``, only after rounds that ended well (not after a round the
        guard counts against the run), so the last checkpoint is a good one.
    guard : DivergenceGuard, optional
        Stops the run early when it diverged (its ``stop_reason`` says why,
        in one log line); the result then holds the global model of the
        guard's ``last_good_round``.

    Returns
    -------
    Result
        The final global arrays and the metrics of all rounds.
    """
    if start_round < 1:
        raise ValueError(f"start_round must be >= 1, got {start_round}")
    arrays = initial_arrays
    log(INFO, "Starting %s strategy:", type(strategy).__name__)
    log_strategy_start_info(num_rounds, arrays, train_config, evaluate_config)
    if start_round > 1:
        log(INFO, "\t└──> Resuming after round %d", start_round - 1)
    strategy.summary()
    log(INFO, "")
    # Strategies whose extra message exchanges or schedules depend on the
    # run's limits (secure recombination, evaluation of the last round) learn them here.
    if isinstance(strategy, RunAware):
        strategy.begin_run(num_rounds=num_rounds, timeout=timeout)

    train_config = ConfigRecord() if train_config is None else train_config
    evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
    result = Result() if result is None else result
    if len(result.arrays) == 0:
        result.arrays = arrays
    started = time.time()

    if evaluate_fn is not None and start_round == 1:
        metrics = evaluate_fn(0, arrays)
        log(INFO, "Initial global evaluation results: %s", metrics)
        if metrics is not None:
            result.evaluate_metrics_serverapp[0] = metrics
    if guard is not None:
        guard.start(start_round - 1, arrays, result.evaluate_metrics_serverapp.get(0))

    for server_round in range(start_round, num_rounds + 1):
        log(INFO, "")
        log(INFO, "[ROUND %s/%s]", server_round, num_rounds)
        replies = list(
            send_and_collect(
                grid, strategy.configure_train(server_round, arrays, train_config, grid), timeout
            )
        )
        new_arrays, metrics = strategy.aggregate_train(server_round, replies)
        if guard is not None:
            guard.after_training(server_round, replies, new_arrays, metrics)
        if new_arrays is not None:
            result.arrays = arrays = new_arrays
        _keep(result.train_metrics_clientapp, server_round, metrics)
        # Federated evaluation of the global arrays, when the strategy asks for it.
        replies = send_and_collect(
            grid, strategy.configure_evaluate(server_round, arrays, evaluate_config, grid), timeout
        )
        _keep(
            result.evaluate_metrics_clientapp,
            server_round,
            strategy.aggregate_evaluate(server_round, replies),
        )
        metrics = None
        if evaluate_fn is not None:
            log(INFO, "Global evaluation")
            metrics = evaluate_fn(server_round, arrays)
            log(INFO, "\t└──> MetricRecord: %s", metrics)
            if metrics is not None:
                result.evaluate_metrics_serverapp[server_round] = metrics
        if guard is not None:
            guard.after_evaluation(server_round, arrays, metrics)
        if on_round_end is not None and (guard is None or guard.round_ok):
            on_round_end(server_round, arrays, result)
        if guard is not None and guard.stop_reason is not None:
            assert guard.last_good_arrays is not None  # set by guard.start
            result.arrays = guard.last_good_arrays
            log(
                WARNING,
                "Stopped the run after round %s of %s, %s; it ends with the state of round %s, "
                "the last that ended well",
                server_round,
                num_rounds,
                guard.stop_reason,
                guard.last_good_round,
            )
            break

    log(INFO, "")
    log(INFO, "Strategy execution finished in %.2fs", time.time() - started)
    log(INFO, "")
    log(INFO, "Final results:")
    log(INFO, "")
    for line in io.StringIO(str(result)):
        log(INFO, "\t%s", line.strip("\n"))
    log(INFO, "")
    return result


def _keep(
    by_round: dict[int, MetricRecord], server_round: int, metrics: MetricRecord | None
) -> None:
    """Log a round's aggregated metrics and keep them in the result."""
    if metrics is not None:
        log(INFO, "\t└──> Aggregated MetricRecord: %s", metrics)
        by_round[server_round] = metrics
