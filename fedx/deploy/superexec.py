"""``fedx-superexec``: Flower's SuperExec with a warm ClientApp executor.

In a real deployment Flower 1.41 runs every message a SuperNode receives in
a new ClientApp process (``flwr-clientapp``, started by the SuperExec's
``SubprocessExecutor``), and that process starts Python and imports the app
before it reads the message: for fedx's ClientApp, seconds of imports in
every message, ``import torch`` the largest part
(``benchmarks/clientapp_startups.py`` measures them). The warm executor pays that once per
SuperNode: it keeps one interpreter that has imported the ClientApp's module
(and with it torch and everything else the module imports) and forks it for
every task; the child runs Flower's own ``run_clientapp`` with the task's
token, which is all ``flwr-clientapp`` does.

Run it next to a SuperNode started with ``--isolation process``, with the
same options as ``flower-superexec`` (``--insecure`` or
``--root-certificates`` for the SuperNode's Runtime API,
``--superexec-auth-secret-file``, ``--parent-pid``, ...)::

    flower-supernode --insecure --superlink 127.0.0.1:8000 --isolation process --port 9094
    fedx-superexec --insecure --runtime-api-address 127.0.0.1:9094

and two of its own: ``--preload-app MODULE`` (default ``fedx.client_app``),
the ClientApp module to import in the warm interpreter, and ``--preload
MODULE`` (repeatable), more modules to import: by default torch,
``fedx.client.handlers``, which ``fedx.client_app`` imports only when its
first training or evaluation message arrives, and ``fedx.strategies``, where
the ClientApp's run-config check finds the methods. While it has nothing to
do it asks for tasks less and less often (``--idle-after``,
``--max-poll-interval``: :mod:`fedx.flower.superexec_executor`).

Every task starts from the warm interpreter as it was after the imports:

* nothing of an earlier task: each task is a fork of the warm interpreter,
  which never runs a task itself, so no model, data, file or connection of
  one task reaches the next (a cache the ClientApp keeps on disk does);
* the app's own code from the run's FAB: where the FAB's copy of the
  ClientApp's top-level package (``fedx`` for ``fedx.client_app``) has
  other Python files than the warm interpreter imported, or the FAB is not
  installed yet, that package's modules are dropped before the task starts,
  so ``run_clientapp`` imports them from the FAB it installed, as
  ``flwr-clientapp`` would (a cost in every task, though the libraries
  they import stay loaded); where the files are the same, byte for byte,
  the task keeps the warm modules, as they were imported
  (:meth:`WarmExecutor.keeps_app`);
* fresh randomness: torch's and numpy's global generators are reseeded from
  the OS, as a new interpreter seeds them (Python's ``random`` reseeds
  itself after a fork). Python's string hash seed is the warm interpreter's
  in every task.

Three costs of Flower's own in every task are cut: the warm
interpreter has also imported this module, Flower's ``run_clientapp`` and
``httpcore`` (else each task's process imports them itself, before it
starts and, for ``httpcore``, which httpx imports with ``run_clientapp``'s
first client, before its first request), and a
task asks its SuperNode for an object of its message that the SuperNode is
still pulling from the SuperLink again after 20 ms, then doubling up to the
SuperExec's task poll interval (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``,
Flower's 1 s by default), instead of after 1, 2, 4 ... s
(:mod:`fedx.flower.object_pulls`): a task starts
before its message's objects are all there, and used to wait a second for
them; and a FAB installed already is not unpacked and hashed again
(:func:`fedx.flower.clientapp_task.install_fab_once`).

The warm interpreter is the ``forkserver`` of Python's ``multiprocessing``:
a process started fresh (not forked from the SuperExec, which holds
connections and threads), that imports the modules, then only waits on a
local socket for fork requests; each child closes that socket before it
runs anything. It runs one thread when it forks: OpenBLAS stops its
workers before every fork, and the warm interpreter starts with
``JE_ARROW_MALLOC_CONF=background_thread:false`` (Arrow's allocator purges
memory without a thread of its own) and ``PYTORCH_NVML_BASED_CUDA_CHECK=1``
(``torch.cuda.is_available()`` at import does not initialize CUDA, which a
forked child could then not use), unless those are set already. If it dies,
the next task starts a new one.

Each task gets the SuperNode's share of the machine's cores
(:class:`fedx.deploy.cores.ClientAppCores`: ``--clientapp-threads``, else
``FEDX_CLIENTAPP_THREADS``, else the usable cores divided by
``FEDX_SUPERNODES_PER_MACHINE``, 1 by default): the warm interpreter starts
with ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` set to it, and every task
calls ``torch.set_num_threads`` with it before it runs (a forked child keeps
the thread count of the interpreter it was forked from, and Python's
forkserver is one per process, started with the environment of the first
executor that used it).

At most ``max_tasks`` tasks run at once (``--max-tasks``, else
``FEDX_CLIENTAPP_MAX_TASKS``, else the share of the cores divided by the
threads per task, at least 1). The executor says so to Flower's SuperExec
through the protocol's capacity check: while that many run, the SuperExec
claims no ClientApp task, which waits, pending, in the SuperNode until one
ends. That is where a waiting task belongs: a claimed task whose process has
not reported to the SuperNode within 30 s (Flower's task heartbeat) is taken
back and handed out again, which is how Flower's executor ends up starting
process after process for one message on a busy machine. A task launched
while the limit is reached all the same (by a caller that does not ask
first) waits in a queue here and starts when a running one ends; one that
waited longer than those 30 s is dropped with a log line instead (its claim
has lapsed, and the SuperNode hands the task out again), so it never holds
up the tasks behind it.

A task holds its slot from its fork to its end, except while it waits for
its input (its message, context, run and FAB) from its SuperNode: that
wait uses no core, and may never end. Flower 1.41's SuperNode
(``flower-supernode``) leaves a task claimable whose message's objects
never arrive when the run is stopped while it pulls them; the process
forked for it asks for them until Flower gives up (2 hours), and, holding
the only slot, kept every later task of its SuperNode, of any run, pending.
Each task's child tells the executor, through a flag in shared memory,
while it is in Flower's ``pull_task_input`` (:mod:`fedx.flower.task_input`).
``fedx-supernode`` ends such a task instead, and any task of a stopped
run; a task hears of it at its next request to its SuperNode, and its
heartbeat, one such request, goes out every 3.5-4.5 s instead of Flower's
17.5-22.5 s (:mod:`fedx.flower.stopped_runs`).

A task whose process crashes loses only its own reply: the warm interpreter
and the other tasks go on, and the SuperNode answers the message with
Flower's "ClientApp stopped responding" error once the task's heartbeat has
expired, as with Flower's executor. Tasks other than ClientApps, and every
task when runtime dependency installation is on (the task then runs in an
environment of its own, which a warm interpreter cannot be), go to Flower's
``SubprocessExecutor``.
"""

import argparse
import contextlib
import hashlib
import importlib.util
import multiprocessing
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from ctypes import c_byte
from logging import INFO, WARNING
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

from flwr.common import log
from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL

from fedx import flower
from fedx.deploy.cores import (
    MAX_TASKS_VARIABLE,
    SUPERNODES_VARIABLE,
    THREADS_VARIABLE,
    ClientAppCores,
    thread_environment,
)
from fedx.flower import IDLE_AFTER, IdleBackoff, clientapp_task
from fedx.flower.clientapp_task import installed_fab_dir, run_clientapp_task
from fedx.flower.object_pulls import FIRST_WAIT, FLOWER_INITIAL_BACKOFF
from fedx.flower.superexec_executor import (
    FLOWER_TASK_POLL_INTERVAL,
    ExecutionSpec,
    ExecutorConfig,
    ExecutorType,
    LaunchResult,
    SubprocessExecutor,
    TaskPollWaits,
    TaskType,
    get_executor,
    run_flower_superexec,
    task_poll_interval,
)

DEFAULT_PRELOAD_APP = "fedx.client_app"
#: torch, what fedx's ClientApp imports on its first training or evaluation
#: message (``fedx.client_app.HANDLERS_MODULE``), and the strategies' modules,
#: where :mod:`fedx.registry` finds the methods whose keys the ClientApp checks
#: the run config against: without them every task would import them.
DEFAULT_PRELOAD = ("torch", "fedx.client.handlers", "fedx.strategies")
#: Environment of the warm interpreter (where not set already): no allocator
#: thread, no CUDA initialized before a fork.
WARM_ENVIRONMENT = {
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
}
#: What every task's process runs besides the app: this module (whose
#: functions the task's process is given), Flower's ``run_clientapp`` with
#: fedx's change to it, and the Flower code the task's changes rely on, checked
#: once here (``fedx.flower._warm``).
TASK_MODULES = (__name__, "fedx.flower._warm", *clientapp_task.TASK_MODULES)
#: Seconds a running task gets to stop on SIGTERM when the SuperExec stops.
STOP_GRACE = 10.0
#: Seconds a claimed task may take to report to its SuperNode before the
#: SuperNode takes it back and hands it out again: a task queued here longer
#: than that is dropped.
CLAIM_LAPSES = float(HEARTBEAT_DEFAULT_INTERVAL)
#: How often :meth:`WarmExecutor.wait_for_capacity` looks for an ended task.
CAPACITY_POLL = 0.05


def package_sources(package: str, directory: Path | None = None) -> dict[str, str] | None:
    """``{path: SHA-256}`` of the Python files of ``package``, paths relative to its folder.

    The folder is ``directory / package``, or, without ``directory``, the one
    this interpreter imports ``package`` from. ``None`` when there is no such
    single folder (a namespace package spread over several, a module).
    """
    if directory is None:
        spec = importlib.util.find_spec(package)
        locations = list(spec.submodule_search_locations or []) if spec else []
        if len(locations) != 1:
            return None
        root = Path(locations[0])
    else:
        root = directory / package
    if not root.is_dir():
        return None
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def _fresh_start(app_package: str | None, threads: int) -> None:
    """In a task's child: forget the app's own modules (unless ``None``), reseed torch and numpy, set its threads."""
    if app_package:
        for name in [n for n in sys.modules if n == app_package or n.startswith(app_package + ".")]:
            del sys.modules[name]
    # The thread variables of this process's environment reach a torch imported
    # from now on; one the warm interpreter imported keeps the count it read.
    os.environ.update(thread_environment(threads))
    # From the OS, as in a new interpreter (the forked child has the warm one's state).
    if (torch := sys.modules.get("torch")) is not None:
        torch.set_num_threads(threads)
        torch.seed()
    if (numpy := sys.modules.get("numpy")) is not None:
        numpy.random.seed()


def _task_child(
    task: Callable[[ExecutionSpec], None],
    spec: ExecutionSpec,
    app_package: str | None,
    object_pull_wait: float,
    threads: int,
    waiting: c_byte,
) -> None:
    """What a task's forked child runs.

    ``waiting``, a shared byte, is 1 while the task waits for its input from its SuperNode.
    """
    _fresh_start(app_package, threads)
    # The task's changes to Flower, all or none (fedx.flower): asking its own SuperNode costs
    # little, so it asks again for an object soon, then doubling up to the poll interval; it
    # finds an installed FAB without unpacking it; it says while it waits for its input; its
    # heartbeat tells it of its end within seconds.
    flower.install(
        "clientapp-task",
        {
            "object_pulls": {
                "first": min(object_pull_wait, FIRST_WAIT),
                "longest": object_pull_wait,
            },
            "clientapp_task": {},
            "task_input": {"waiting": lambda now: setattr(waiting, "value", int(now))},
            "task_heartbeat": {},
        },
    )
    task(spec)


@contextlib.contextmanager
def _warm_environment(threads: int):
    """The environment a new warm interpreter (or Flower's ClientApp process) gets, while it starts.

    :data:`WARM_ENVIRONMENT` where not set already, and the thread variables
    for ``threads`` whatever they were.
    """
    added = {k: v for k, v in WARM_ENVIRONMENT.items() if k not in os.environ}
    added.update(thread_environment(threads))
    saved = {key: os.environ.get(key) for key in added}
    os.environ.update(added)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value


def _report_preloaded(modules: Sequence[str], connection: Connection) -> None:
    """The warm-up child: which of ``modules`` the warm interpreter has imported, and its pid."""
    connection.send(([m for m in modules if m in sys.modules], os.getppid()))
    connection.close()


class WarmExecutor:
    """A Flower SuperExec executor that forks ClientApp tasks from a warm interpreter.

    It implements Flower's executor protocol
    (``flwr.supercore.superexec.executor.Executor``); see the module's
    docstring for what a task starts from.

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
            target=_report_preloaded, args=(self.modules, sender), name="fedx-warm-up"
        )
        with _warm_environment(self.cores.threads):
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
            with _warm_environment(self.cores.threads):  # its flwr-clientapp reads the threads
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
            with _warm_environment(self.cores.threads):
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


# ----------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedx-superexec",
        add_help=False,
        description="flower-superexec with fedx's warm ClientApp executor; every other option "
        "is flower-superexec's (see flower-superexec --help).",
    )
    parser.add_argument(
        "--preload-app",
        default=DEFAULT_PRELOAD_APP,
        metavar="MODULE",
        help="the ClientApp module the warm interpreter imports "
        f"(default: {DEFAULT_PRELOAD_APP}; '' for none)",
    )
    parser.add_argument(
        "--preload",
        action="append",
        metavar="MODULE",
        help="a module the warm interpreter imports too (repeatable; "
        f"default: {', '.join(DEFAULT_PRELOAD)})",
    )
    parser.add_argument(
        "--clientapp-threads",
        type=int,
        metavar="N",
        help=f"torch threads of each ClientApp (default: ${THREADS_VARIABLE}, else this "
        f"machine's usable cores divided by ${SUPERNODES_VARIABLE}, 1 if unset)",
    )
    parser.add_argument(
        "--idle-after",
        type=float,
        default=IDLE_AFTER,
        metavar="SECONDS",
        help="how long after its last ClientApp task the SuperExec keeps asking for tasks "
        "every $FLWR_SUPEREXEC_TASK_POLL_INTERVAL seconds; then its waits grow up to "
        "--max-poll-interval (default: %(default)g; inf: never)",
    )
    parser.add_argument(
        "--max-poll-interval",
        type=float,
        default=FLOWER_TASK_POLL_INTERVAL,
        metavar="SECONDS",
        help="the longest wait between two task polls (default: Flower's %(default)g s)",
    )
    parser.add_argument(
        "--max-tasks",
        type=int,
        metavar="N",
        help=f"ClientApps running at once; more wait in the SuperNode (default: "
        f"${MAX_TASKS_VARIABLE}, else the cores divided by the threads of each, at least 1)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``fedx-superexec``: Flower's SuperExec, with the warm executor."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        _parser().print_help()
        print()
    ours, flower_args = _parser().parse_known_args(argv)
    preload = DEFAULT_PRELOAD if ours.preload is None else [m for m in ours.preload if m]
    try:  # the options, else the environment, else this machine's cores
        cores = ClientAppCores.resolve(threads=ours.clientapp_threads, max_tasks=ours.max_tasks)
        interval = task_poll_interval()
        # Between two task polls: the interval after a task, up to the ceiling once idle.
        waits = TaskPollWaits(
            IdleBackoff(interval, ours.idle_after, max(interval, ours.max_poll_interval))
        )
    except ValueError as err:
        raise SystemExit(f"fedx-superexec: {err}") from None

    def executor_factory(
        executor_type: ExecutorType,
        executor_config: ExecutorConfig | None = None,
        *,
        insecure: bool = False,
        root_certificates_path: str | None = None,
    ):
        if executor_type == ExecutorType.SUBPROCESS:  # flower-superexec's default
            warm = WarmExecutor(
                ours.preload_app or None,
                preload,
                object_pull_wait=interval,
                cores=cores,
            )
            waits.busy = lambda: warm.busy
            return warm
        return get_executor(
            executor_type,
            executor_config,
            insecure=insecure,
            root_certificates_path=root_certificates_path,
        )

    # Flower's SuperExec builds its executor with this factory, called once at
    # start: everything else (polling, TLS, authentication, plugins, signals)
    # stays Flower's own. Without it fedx-superexec has no purpose: on a Flower
    # whose code is not the code checked, it refuses to start.
    try:
        flower.install(
            "fedx-superexec",
            {"superexec_executor": {"factory": executor_factory, "waits": waits}},
            refuse=True,
        )
    except flower.FlowerCodeMismatch as err:
        raise SystemExit(f"fedx-superexec: {err}; use flower-superexec") from None
    run_flower_superexec(flower_args)


if __name__ == "__main__":
    main()
