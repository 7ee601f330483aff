"""The warm executor: a Flower SuperExec executor that forks ClientApp tasks from a warm interpreter.

``fedx-superexec`` (:mod:`fedx.deploy.superexec`) runs Flower's SuperExec
with it; what the warm interpreter and each task's child run is
:mod:`fedx.deploy.warm_task`. docs/deployment/warm-executor.md ("Inside the
warm executor") says what every task starts from and how many run at once.
"""

import multiprocessing
import time
from collections import deque
from collections.abc import Callable, Sequence
from ctypes import c_byte
from logging import INFO, WARNING
from multiprocessing.process import BaseProcess

from flwr.common import log
from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL

from fedx.deploy.cores import (
    ClientAppCores,
)
from fedx.deploy.warm_task import _task_child, package_sources, report_preloaded, warm_environment
from fedx.flower import clientapp_task
from fedx.flower.clientapp_task import installed_fab_dir, run_clientapp_task
from fedx.flower.object_pulls import FLOWER_INITIAL_BACKOFF
from fedx.flower.superexec_executor import (
    ExecutionSpec,
    LaunchResult,
    SubprocessExecutor,
    TaskType,
)

DEFAULT_PRELOAD_APP = "fedx.client_app"
#: torch, what fedx's ClientApp imports on its first training or evaluation
#: message (``fedx.client_app.HANDLERS_MODULE``), and the strategies' modules,
#: where :mod:`fedx.registry` finds the methods whose keys the ClientApp checks
#: the run config against: without them every task would import them.
DEFAULT_PRELOAD = ("torch", "fedx.client.handlers", "fedx.strategies")
#: What every task's process runs besides the app: this module (whose
#: functions the task's process is given), Flower's ``run_clientapp`` with
#: fedx's change to it, and the Flower code the task's changes rely on, checked
#: once here (``fedx.flower._warm``).
TASK_MODULES = (
    __name__,
    "fedx.deploy.warm_task",
    "fedx.flower._warm",
    *clientapp_task.TASK_MODULES,
)
#: Seconds a running task gets to stop on SIGTERM when the SuperExec stops.
STOP_GRACE = 10.0
#: Seconds a claimed task may take to report to its SuperNode before the
#: SuperNode takes it back and hands it out again: a task queued here longer
#: than that is dropped.
CLAIM_LAPSES = float(HEARTBEAT_DEFAULT_INTERVAL)
#: How often :meth:`WarmExecutor.wait_for_capacity` looks for an ended task.
CAPACITY_POLL = 0.05


class WarmExecutor:
    """A Flower SuperExec executor that forks ClientApp tasks from a warm interpreter.

    It implements Flower's executor protocol
    (``flwr.supercore.superexec.executor.Executor``); see
    docs/deployment/warm-executor.md for what a task starts from.

    Parameters
    ----------
    preload_app : str or None
        The ClientApp module the warm interpreter imports; its top-level
        package is imported afresh (from the run's FAB) by every task whose
        FAB holds other code (:meth:`keeps_app`).
    preload : sequence of str
        Modules the warm interpreter imports as well: libraries stay
        imported in every task, modules of the app's package are dropped
        like the app's (what they import stays).
    task : callable
        What a task's child runs, given the task's ``ExecutionSpec``
        (default: Flower's ``run_clientapp``); a module-level function.
    object_pull_wait : float
        The longest the task waits before it asks its SuperNode again for an
        object of its message that the SuperNode is still pulling: it asks
        after :data:`~fedx.flower.object_pulls.FIRST_WAIT` (or this, where
        shorter), then doubling up to this (Flower: 1 s, then doubling up
        to 10 s; :mod:`fedx.flower.object_pulls`). ``fedx-superexec`` makes
        it its task poll interval.
    cores : ClientAppCores, optional
        Torch threads of each task and how many tasks run at once (default:
        :meth:`ClientAppCores.resolve` from the environment and the machine).
    """

    def __init__(
        self,
        preload_app: str | None = DEFAULT_PRELOAD_APP,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        task: Callable[[ExecutionSpec], None] = run_clientapp_task,
        object_pull_wait: float = FLOWER_INITIAL_BACKOFF,
        cores: ClientAppCores | None = None,
    ) -> None:
        self.task = task
        self.object_pull_wait = object_pull_wait
        self.cores = ClientAppCores.resolve() if cores is None else cores
        self.app_package = preload_app.split(".")[0] if preload_app else None
        self.modules = [*preload, *([preload_app] if preload_app else [])]
        self._context = multiprocessing.get_context("forkserver")
        # Without TASK_MODULES every task would import them itself, before it starts.
        self._context.set_forkserver_preload([*self.modules, *TASK_MODULES])
        self._fallback = SubprocessExecutor()
        self._tasks: dict[int, BaseProcess] = {}
        #: Each task's flag in shared memory: 1 while it waits for its input.
        self._waiting: dict[int, c_byte] = {}
        #: Tasks launched beyond the limit: (when, spec), oldest first.
        self._queue: deque[tuple[float, ExecutionSpec]] = deque()
        #: The app package's files as the warm interpreter imported them.
        self._app_sources = package_sources(self.app_package) if self.app_package else None
        #: Per FAB hash: whether its tasks keep the warm interpreter's app modules.
        self._keeps_app: dict[str, bool] = {}
        self.warm_pid, self.preloaded = self._warm_up()

    def _warm_up(self) -> tuple[int, list[str]]:
        """Start the warm interpreter and wait until it has imported the modules."""
        started = time.monotonic()
        receiver, sender = self._context.Pipe(duplex=False)
        probe = self._context.Process(
            target=report_preloaded, args=(self.modules, sender), name="fedx-warm-up"
        )
        with warm_environment(self.cores.threads):
            probe.start()  # starts the warm interpreter, which forks it once its imports are done
        sender.close()
        preloaded, warm_pid = receiver.recv()
        receiver.close()
        probe.join()
        probe.close()
        log(
            INFO,
            "fedx: warm ClientApp interpreter (pid %d) ready in %.1fs, imported: %s; "
            "%d torch thread(s) per ClientApp, at most %d at once (%d core(s))",
            warm_pid,
            time.monotonic() - started,
            ", ".join(preloaded) or "nothing",
            self.cores.threads,
            self.cores.max_tasks,
            self.cores.cores,
        )
        if missing := [m for m in self.modules if m not in preloaded]:
            log(
                WARNING,
                "fedx: the warm interpreter could not import %s; every task imports "
                "it itself (check that it is installed in this environment)",
                ", ".join(missing),
            )
        return warm_pid, preloaded

    # Flower's executor protocol ------------------------------------------

    def get_eligible_capacity(
        self,
        supported_task_types: set[TaskType],
        *,
        insecure: bool = False,
        root_certificates_path: str | None = None,
    ) -> tuple[set[TaskType], set[str]]:
        """Every task type, but ClientApps only while fewer than ``max_tasks`` hold a slot or wait here.

        Flower's SuperExec asks before every claim: a ClientApp task it does
        not claim waits in the SuperNode, where its claim cannot lapse.
        """
        del insecure, root_certificates_path
        if self._has_room():
            return supported_task_types, set()
        return supported_task_types - {TaskType.CLIENT_APP}, set()

    def wait_for_capacity(
        self,
        task_type: TaskType | None = None,
        *,
        fab_hash: str | None = None,
        insecure: bool = False,
        root_certificates_path: str | None = None,
    ) -> None:
        """Return once a ClientApp task can start (other tasks: at once)."""
        del fab_hash, insecure, root_certificates_path
        if task_type not in (None, TaskType.CLIENT_APP):
            return
        self.reconcile()
        while not self._has_room():
            time.sleep(CAPACITY_POLL)
            self.reconcile()

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        """Fork a ClientApp task from the warm interpreter, or queue it while ``max_tasks`` run.

        Other tasks, and ClientApps when runtime dependency installation is
        on, go to Flower's executor.
        """
        if spec.task_type != TaskType.CLIENT_APP:
            return self._fallback.launch(spec)
        if spec.runtime_dependency_install:
            with warm_environment(self.cores.threads):  # its flwr-clientapp reads the threads
                return self._fallback.launch(spec)
        if not self._has_room():  # behind those waiting already
            self._queue.append((time.monotonic(), spec))
            log(
                INFO,
                "fedx: ClientApp task %d waits: %d task(s) hold a slot, at most %d at once",
                spec.task_id,
                self._holding_slots(),
                self.cores.max_tasks,
            )
            return LaunchResult.accepted()
        return self._fork(spec)

    def keeps_app(self, fab_hash: str | None) -> bool:
        """Whether a task of the FAB ``fab_hash`` keeps the warm interpreter's app modules.

        It does when Flower has installed that FAB on this node and the FAB's
        copy of the app's package has the Python files the warm interpreter
        imported, byte for byte, as the environment still has them: the task
        then runs the FAB's code either way, and importing it again would
        only cost time, in every task (``benchmarks/message_timeline.py``'s
        "app load" step).
        Decided once per FAB, once it is installed (its first task installs it).
        """
        if not fab_hash or self.app_package is None or self._app_sources is None:
            return False
        if fab_hash not in self._keeps_app:
            installed = installed_fab_dir(fab_hash)
            if installed is None:
                return False
            sources = self._app_sources
            self._keeps_app[fab_hash] = (
                package_sources(self.app_package, installed) == sources
                and package_sources(self.app_package) == sources
            )
        return self._keeps_app[fab_hash]

    def _fork(self, spec: ExecutionSpec) -> LaunchResult:
        """Fork ``spec``'s task from the warm interpreter."""
        keep_app = self.keeps_app(spec.fab_hash)
        waiting = self._context.RawValue("b", 0)
        process = self._context.Process(
            target=_task_child,
            args=(
                self.task,
                spec,
                None if keep_app else self.app_package,
                self.object_pull_wait,
                self.cores.threads,
                waiting,
            ),
            name=f"clientapp-task-{spec.task_id}",
        )
        try:
            with warm_environment(self.cores.threads):
                process.start()  # restarts the warm interpreter if it died
        except OSError as err:
            return LaunchResult.failed(f"could not fork the task from the warm interpreter: {err}")
        log(
            INFO,
            "fedx: ClientApp task %d forked from the warm interpreter: process %d (%s)",
            spec.task_id,
            process.pid,
            "the FAB's code is the warm one's" if keep_app else "imports the app from the FAB",
        )
        self._tasks[spec.task_id] = process
        self._waiting[spec.task_id] = waiting
        return LaunchResult.accepted()

    def _holding_slots(self) -> int:
        """How many tasks hold a slot: their process runs, and it is not waiting for its input."""
        return sum(
            process.exitcode is None and not self._waiting[task_id].value
            for task_id, process in self._tasks.items()
        )

    def _has_room(self) -> bool:
        """Whether one more ClientApp task may start now (none waits here, fewer than the limit hold a slot)."""
        return not self._queue and self._holding_slots() < self.cores.max_tasks

    def reconcile(self) -> None:
        """Collect finished tasks (log those that failed or crashed); start queued ones."""
        for task_id, process in list(self._tasks.items()):
            code = process.exitcode
            if code is None:
                continue
            if code < 0:
                log(
                    WARNING,
                    "fedx: the process of ClientApp task %d (pid %d) was killed by "
                    "signal %d; the SuperNode answers its message with an error once its "
                    "heartbeat expires",
                    task_id,
                    process.pid,
                    -code,
                )
            elif code != 0:
                log(
                    WARNING,
                    "fedx: the process of ClientApp task %d (pid %d) exited with code %d",
                    task_id,
                    process.pid,
                    code,
                )
            process.close()
            del self._tasks[task_id]
            del self._waiting[task_id]
        while self._queue and self._holding_slots() < self.cores.max_tasks:
            queued_at, spec = self._queue.popleft()
            waited = time.monotonic() - queued_at
            if waited > CLAIM_LAPSES:
                log(
                    WARNING,
                    "fedx: ClientApp task %d waited %.0fs for a free slot, longer than its "
                    "SuperNode holds a claim: dropped (the SuperNode hands it out again)",
                    spec.task_id,
                    waited,
                )
                continue
            result = self._fork(spec)
            if result != LaunchResult.accepted():
                log(WARNING, "fedx: ClientApp task %d: %s", spec.task_id, result.message)

    def close(self) -> None:
        """Stop the running tasks (SIGTERM, then SIGKILL), as the SuperExec stops; drop queued ones."""
        self._queue.clear()
        for process in self._tasks.values():
            if process.exitcode is None:
                process.terminate()
        deadline = time.monotonic() + STOP_GRACE
        for process in self._tasks.values():
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                process.kill()
                process.join(1.0)
        self._tasks.clear()
        self._waiting.clear()
        self._fallback.close()

    @property
    def busy(self) -> bool:
        """Whether a ClientApp task holds a slot (it runs, past its input) or waits here for one."""
        return bool(self._queue) or self._holding_slots() > 0

    @property
    def running(self) -> dict[int, int]:
        """``{task id: pid}`` of the tasks still running."""
        return {t: p.pid for t, p in self._tasks.items() if p.exitcode is None and p.pid}

    @property
    def waiting_for_input(self) -> list[int]:
        """Ids of the running tasks that wait for their input from their SuperNode (they hold no slot)."""
        return [t for t in self.running if self._waiting[t].value]

    @property
    def queued(self) -> list[int]:
        """Ids of the tasks waiting for a free slot, oldest first."""
        return [spec.task_id for _, spec in self._queue]
