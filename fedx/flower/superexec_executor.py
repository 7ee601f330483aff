"""Change: Flower's SuperExec builds fedx's warm ClientApp executor (``fedx-superexec``).

What it changes
    The module global ``get_executor`` of
    ``flwr.supercore.superexec.run_superexec``, which ``run_superexec``
    calls once as it starts to build the executor of its tasks, is replaced
    by the factory given to :func:`apply`, in ``fedx-superexec``'s process
    only (through :func:`fedx.flower.install`). ``fedx-superexec``'s factory returns the warm
    executor (:class:`fedx.deploy.warm_executor.WarmExecutor`) for Flower's
    default executor type, ``subprocess``, and Flower's ``get_executor``'s
    executor otherwise. Everything else of the SuperExec (polling, TLS,
    authentication, plug-ins, signals) stays Flower's own. The warm executor
    implements Flower's executor protocol
    (``flwr.supercore.superexec.executor.Executor``); this module hands it
    the protocol's types.

    The module global ``time`` of ``run_superexec`` is replaced too, by
    :class:`TaskPollWaits`: the
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
    seconds of imports in every message, ``import torch`` the largest part
    (``benchmarks/clientapp_startups.py`` measures them). The warm
    executor forks every task from an interpreter that imported them once:
    with it (and 0.1 s polls) a round of the deployment benchmark, and the
    secure stage, take a fraction of the time they take with Flower's
    executor and polls (docs/results.md, "What each part of the fast setup
    gives").
    A short task poll interval (0.1 s in the README's fast setup) costs the
    SuperExec and its SuperNode a request per interval while there is
    nothing to do, and their SuperNodes' answers more, all the time
    (``benchmarks/idle_federation.py`` measures it). Backing
    off once no task has run for a while brings them back to Flower's one
    poll a second.

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`). 1.42's
    ``run_superexec`` no longer passes a trace parent to the dispatch's
    span; the executor's construction, the loop and its wait are the same.
    Flower's seams were looked for: ``flower-superexec --executor`` takes
    ``subprocess`` or ``kubernetes`` only, and ``run_superexec`` builds its
    executor from that name (no executor class or object can be passed);
    its task poll interval is Flower's setting
    ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, which fedx uses as it is.

Under another Flower
    Where ``run_superexec`` or the executor's types are not the code
    checked, :func:`fedx.flower.install` makes no change and
    ``fedx-superexec`` refuses to start, naming the code that differs (use
    ``flower-superexec``).
"""

import importlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from fedx.flower import SUPEREXEC_TASK_POLL, IdleBackoff, replace
from fedx.flower._fingerprints import flower_code

__all__ = [
    "TaskPollWaits",
    "apply",
    "back_off_task_polls",
    "run_flower_superexec",
    "task_poll_interval",
    "use_executor_factory",
]  # and, when asked for, Flower's types of FLOWER_TYPES

#: Flower's task poll interval when it cannot be read (seconds).
FLOWER_TASK_POLL_INTERVAL = SUPEREXEC_TASK_POLL
#: Flower's SuperExec loop, whose globals this changes.
RUN_SUPEREXEC = "flwr.supercore.superexec.run_superexec"
#: Flower's executor types this module hands fedx's executor, and where they live.
FLOWER_TYPES = {
    "ExecutionSpec": "flwr.supercore.superexec.executor",
    "Executor": "flwr.supercore.superexec.executor",
    "LaunchResult": "flwr.supercore.superexec.executor",
    "SubprocessExecutor": "flwr.supercore.superexec.executor",
    "get_executor": "flwr.supercore.superexec.executor",
    "ExecutorConfig": "flwr.supercore.superexec.executor.config",
    "ExecutorType": "flwr.supercore.constant",
    "TaskType": "flwr.supercore.constant",
}

#: The Flower code this change relies on (its fingerprints: fedx.flower._fingerprints).
FLOWER_CODE = flower_code(
    "flwr.supercore.superexec.run_superexec:run_superexec",
    "flwr.supercore.superexec.run_superexec:_get_task_poll_interval",
    "flwr.supercore.superexec.executor.factory:get_executor",
    "flwr.supercore.superexec.executor.types:Executor",
    "flwr.supercore.superexec.executor.types:ExecutionSpec",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that run_superexec still builds its executor once, at its start, through the module "
    "global get_executor(executor_type, executor_config=..., insecure=..., "
    "root_certificates_path=...), and that fedx.deploy.warm_executor.WarmExecutor still "
    "implements every method of the Executor protocol with the ExecutionSpec fields it reads; "
    "and that its loop waits time.sleep(task_poll_interval) through the module's own `time` "
    "between two task polls, and sleeps that long nowhere else"
)

#: ``factory(executor_type, executor_config=None, *, insecure, root_certificates_path)``:
#: an executor, as Flower's ``get_executor`` builds one.
ExecutorFactory = Callable[..., Any]


def __getattr__(name: str) -> Any:
    # Flower's executor types (FLOWER_TYPES), imported when first asked for.
    if name in FLOWER_TYPES:
        return getattr(importlib.import_module(FLOWER_TYPES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def flower_run_superexec() -> Any:
    """Flower's SuperExec loop module (imported on first use)."""
    return importlib.import_module(RUN_SUPEREXEC)


def use_executor_factory(factory: ExecutorFactory):
    """Make this process's Flower SuperExec build its executor with ``factory``; returns the undo."""
    return replace(flower_run_superexec(), "get_executor", factory)


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


def back_off_task_polls(waits: TaskPollWaits):
    """Make this process's Flower SuperExec wait between its task polls as ``waits`` says.

    ``waits.backoff.interval`` must be the SuperExec's task poll interval
    (:func:`task_poll_interval`); set its ``busy`` once the executor is
    built. Returns the undo.
    """
    return replace(flower_run_superexec(), "time", waits)


def apply(factory: ExecutorFactory, waits: TaskPollWaits):
    """The change, as :func:`fedx.flower.install` makes it: the SuperExec builds its executor
    with ``factory`` and waits between task polls as ``waits`` says. Returns the undo."""
    undo_factory = use_executor_factory(factory)
    undo_waits = back_off_task_polls(waits)

    def undo() -> None:
        undo_waits()
        undo_factory()

    return undo


def task_poll_interval() -> float:
    """How often Flower's SuperExec asks for tasks (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, 1 s).

    Read through Flower's own ``_get_task_poll_interval`` (which checks the
    setting), when that is there.

    Raises
    ------
    ValueError
        When the setting is not a number of seconds Flower takes.
    """
    read = getattr(flower_run_superexec(), "_get_task_poll_interval", None)
    return float(read()) if callable(read) else FLOWER_TASK_POLL_INTERVAL


def run_flower_superexec(arguments: Sequence[str]) -> None:
    """Run Flower's ``flower-superexec`` command in this process with ``arguments``."""
    # pylint: disable=import-outside-toplevel
    from flwr.supercore.cli import flower_superexec

    sys.argv = [sys.argv[0], *arguments]
    flower_superexec()
