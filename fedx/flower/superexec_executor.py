"""Change: Flower's SuperExec builds fedx's warm ClientApp executor (``fedx-superexec``).

What it changes
    The module global ``get_executor`` of
    ``flwr.supercore.superexec.run_superexec``, which ``run_superexec``
    calls once as it starts to build the executor of its tasks, is replaced
    by the factory given to :func:`use_executor_factory`, in the process
    that calls it only. ``fedx-superexec``'s factory returns the warm
    executor (:class:`fedx.deploy.superexec.WarmExecutor`) for Flower's
    default executor type, ``subprocess``, and Flower's ``get_executor``'s
    executor otherwise. Everything else of the SuperExec (polling, TLS,
    authentication, plug-ins, signals) stays Flower's own. The warm executor
    implements Flower's executor protocol
    (``flwr.supercore.superexec.executor.Executor``); this module hands it
    the protocol's types.

    With :func:`back_off_task_polls`, the module global ``time`` of
    ``run_superexec`` is replaced too, by :class:`TaskPollWaits`: the
    ``time`` module whose ``sleep`` makes the loop's wait between two task
    polls (``time.sleep(task_poll_interval)``) follow an
    :class:`~fedx.flower.supernode_waits.IdleBackoff`: the task poll
    interval while the executor has run a task within the last
    ``idle_after`` seconds, then longer and longer waits up to a ceiling
    (Flower's default interval, 1 s).

Why
    In a real deployment Flower 1.41 runs every message a SuperNode receives
    in a new ClientApp process (``flwr-clientapp``, started by the
    SuperExec's ``SubprocessExecutor``), and that process starts Python and
    imports the app before it reads the message: for fedx's ClientApp
    10-13 s on a 2-core machine, 3-4 s of it ``import torch``. The warm
    executor forks every task from an interpreter that imported them once:
    the deployment benchmark's round took 2.68 s with it (0.1 s polls,
    SQLite SuperLink) against 8.35 s with Flower's executor and polls, the
    secure stage 10.8 s against 65.4 s (docs/results.md, Run 4).
    A short task poll interval (0.1 s in the README's fast setup) costs the
    SuperExec and its SuperNode a request per interval while there is
    nothing to do: 3-6% of a core for 3 idle SuperExecs, with their
    SuperNodes' answers more (``benchmarks/idle_federation.py``). Backing
    off once no task has run for a while brings them back to Flower's one
    poll a second.

Checked against
    flwr 1.41.0 (:data:`fedx.flower.CHECKED_FLWR`).

Under another Flower
    :func:`use_executor_factory` raises ``RuntimeError`` when
    ``run_superexec`` has no ``get_executor`` to replace: ``fedx-superexec``
    refuses to start and says it needs flwr 1.41. :func:`task_poll_interval`
    reads Flower's task poll interval through a private function of
    ``run_superexec``; without it, Flower's default of 1 s.
    :func:`back_off_task_polls` raises ``RuntimeError`` when
    ``run_superexec``'s source has no ``time.sleep(task_poll_interval)``.
"""

import inspect
import sys
import time
from collections.abc import Callable, Sequence

import flwr.supercore.superexec.run_superexec as flower_run_superexec
from flwr.supercore.constant import ExecutorType, TaskType
from flwr.supercore.superexec.executor import (
    ExecutionSpec,
    Executor,
    LaunchResult,
    SubprocessExecutor,
    get_executor,
)
from flwr.supercore.superexec.executor.config import ExecutorConfig

from fedx.flower import SUPEREXEC_TASK_POLL, IdleBackoff

__all__ = [
    "ExecutionSpec",
    "Executor",
    "ExecutorConfig",
    "ExecutorType",
    "LaunchResult",
    "TaskPollWaits",
    "SubprocessExecutor",
    "TaskType",
    "back_off_task_polls",
    "get_executor",
    "run_flower_superexec",
    "task_poll_interval",
    "use_executor_factory",
]

#: Flower's task poll interval when it cannot be read (seconds).
FLOWER_TASK_POLL_INTERVAL = SUPEREXEC_TASK_POLL

#: The Flower code this change relies on, with the fingerprint of its source
#: (SHA-256, first 16 hex digits) as checked: tests/test_flower_changes.py.
FLOWER_CODE = {
    "flwr.supercore.superexec.run_superexec:run_superexec": "d11f4e7fbc8f0b12",
    "flwr.supercore.superexec.run_superexec:_get_task_poll_interval": "032c4beb47964e73",
    "flwr.supercore.superexec.executor.factory:get_executor": "891abfc53747803d",
    "flwr.supercore.superexec.executor.types:Executor": "c6d3173df690f03e",
    "flwr.supercore.superexec.executor.types:ExecutionSpec": "a52aad6399c9a5ec",
}
#: What to re-check in that code when it changes.
RECHECK = (
    "that run_superexec still builds its executor once, at its start, through the module "
    "global get_executor(executor_type, executor_config=..., insecure=..., "
    "root_certificates_path=...), and that fedx.deploy.superexec.WarmExecutor still "
    "implements every method of the Executor protocol with the ExecutionSpec fields it reads; "
    "and that its loop waits time.sleep(task_poll_interval) through the module's own `time` "
    "between two task polls, and sleeps that long nowhere else"
)

#: ``factory(executor_type, executor_config=None, *, insecure, root_certificates_path)``:
#: an executor, as Flower's ``get_executor`` builds one.
ExecutorFactory = Callable[..., Executor]


def use_executor_factory(factory: ExecutorFactory) -> None:
    """Make this process's Flower SuperExec build its executor with ``factory``.

    Raises
    ------
    RuntimeError
        When Flower's SuperExec has no ``get_executor`` to replace.
    """
    if not callable(getattr(flower_run_superexec, "get_executor", None)):
        raise RuntimeError(
            "this Flower's SuperExec has no get_executor to replace (fedx needs flwr 1.41)"
        )
    flower_run_superexec.get_executor = factory


class TaskPollWaits:
    """``time`` for Flower's SuperExec loop: its wait between two task polls follows ``backoff``.

    ``busy()`` says whether one of the executor's tasks runs. While one
    does, the loop asks for no other task until it ends, or for at most
    ``backoff.ceiling`` seconds (checking every ``backoff.interval``
    seconds, without a request, whether it has ended): Flower 1.41's
    SuperNode hands out its next message's task only once it has the reply
    to the last one. After that the polls stay ``backoff.interval`` apart
    for ``backoff.idle_after`` seconds, then back off.
    """

    def __init__(self, backoff: IdleBackoff, busy: Callable[[], bool] = lambda: False) -> None:
        self.backoff = backoff
        self.busy = busy
        #: When the executor was last seen busy (``time.monotonic``): its start at first.
        self.last_busy = time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Sleep; the loop's task-poll wait (``backoff.interval`` long) follows the backoff."""
        if seconds != self.backoff.interval:
            time.sleep(seconds)
            return
        start = time.monotonic()
        if self.busy():
            deadline = start + self.backoff.ceiling
            while self.busy() and (now := time.monotonic()) < deadline:
                time.sleep(min(self.backoff.interval, deadline - now))
            self.last_busy = time.monotonic()
            return
        time.sleep(self.backoff.wait(start - self.last_busy))

    def __getattr__(self, name: str):
        return getattr(time, name)


def back_off_task_polls(backoff: IdleBackoff) -> TaskPollWaits:
    """Make this process's Flower SuperExec wait between its task polls as ``backoff`` says.

    ``backoff.interval`` must be the SuperExec's task poll interval
    (:func:`task_poll_interval`). Returns the loop's new ``time``; set its
    ``busy`` once the executor is built.

    Raises
    ------
    RuntimeError
        When Flower's SuperExec loop has no ``time.sleep(task_poll_interval)``.
    """
    if "time.sleep(task_poll_interval)" not in inspect.getsource(flower_run_superexec):
        raise RuntimeError(
            "this Flower's SuperExec has no time.sleep(task_poll_interval) to back off "
            "(fedx needs flwr 1.41)"
        )
    waits = TaskPollWaits(backoff)
    flower_run_superexec.time = waits  # type: ignore[assignment]
    return waits


def task_poll_interval() -> float:
    """How often Flower's SuperExec asks for tasks (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, 1 s)."""
    read = getattr(flower_run_superexec, "_get_task_poll_interval", None)
    return float(read()) if callable(read) else FLOWER_TASK_POLL_INTERVAL


def run_flower_superexec(arguments: Sequence[str]) -> None:
    """Run Flower's ``flower-superexec`` command in this process with ``arguments``."""
    # pylint: disable=import-outside-toplevel
    from flwr.supercore.cli import flower_superexec

    sys.argv = [sys.argv[0], *arguments]
    flower_superexec()
