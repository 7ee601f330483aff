"""What a warm executor's interpreter and its forked tasks run (:mod:`fedx.deploy.warm_executor`).

The warm interpreter is started with :func:`warm_environment` and reports
what it has imported (:func:`report_preloaded`); each task's child forgets
the app's own modules where the run's FAB has other files
(:func:`package_sources` compares them), reseeds torch and numpy, sets its
threads (:func:`_fresh_start`), installs the task's changes to Flower and
runs the task (:func:`_task_child`).
"""

import contextlib
import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from ctypes import c_byte
from multiprocessing.connection import Connection
from pathlib import Path

from fedx import flower
from fedx.deploy.cores import thread_environment
from fedx.flower.object_pulls import FIRST_WAIT
from fedx.flower.superexec_executor import ExecutionSpec

#: Environment of the warm interpreter (where not set already): no allocator
#: thread, no CUDA initialized before a fork.
WARM_ENVIRONMENT = {
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
}


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
def warm_environment(threads: int):
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


def report_preloaded(modules: Sequence[str], connection: Connection) -> None:
    """The warm-up child: which of ``modules`` the warm interpreter has imported, and its pid."""
    connection.send(([m for m in modules if m in sys.modules], os.getppid()))
    connection.close()
