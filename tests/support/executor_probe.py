"""A stand-in ClientApp module and task for the warm executor's tests.

``WarmExecutor(preload_app="tests.support.executor_probe", task=probe)`` imports this
module (and torch) in its warm interpreter and runs :func:`probe` in every
task's child. The task's "token" says what to do and where to write what
the child saw when it started: ``"<action>:<json path>"``. Actions:
``report`` (write and return), ``raise``, ``kill`` (crash after writing),
``sleep`` (write, sleep a second, then add when it ended), ``hold`` (write,
then sleep until killed), ``no-input`` (write, then ask its SuperNode for its
input through Flower's ``run_clientapp.pull_task_input``, as every task
does first, from a SuperNode that never answers: a task of a run stopped
while its SuperNode pulled the task's message).
"""

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow  # noqa: F401  # as fedx's ClientApp imports it (Hugging Face datasets): an allocator thread
import torch

#: Module state: filled at import and by each task; a task must never see another's.
IMPORTED_IN = os.getpid()
TASKS: list[int] = []


def socket_fds() -> int:
    """How many of this process's file descriptors are sockets."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


class SilentSuperNode:
    """A stand-in Runtime API client whose SuperNode never delivers the task's input."""

    def PullTaskInput(self, request):  # noqa: N802  # pylint: disable=invalid-name
        del request
        time.sleep(600)


def probe(spec) -> None:
    """Report the state the task starts from, then leave some state behind (or crash)."""
    action, path = spec.token.split(":", 1)
    run_clientapp_loaded = "flwr.supernode.runtime.run_clientapp" in sys.modules
    sockets = socket_fds()
    torch_loaded = "torch" in sys.modules
    this = sys.modules.get(__name__)  # None: dropped before the task, imported afresh below
    from flwr.supercore import heartbeat  # pylint: disable=C0415
    from flwr.supercore.inflatable.inflatable_utils import pull_objects  # pylint: disable=C0415

    import tests.support.executor_probe as module  # pylint: disable=import-outside-toplevel

    seen = {
        "started": time.monotonic(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "torch-loaded-at-start": torch_loaded,
        "run-clientapp-loaded-at-start": run_clientapp_loaded,
        "object-pulls": {
            k: pull_objects.__kwdefaults__[k] for k in ("initial_backoff", "backoff_cap")
        },
        "task-heartbeat-interval": heartbeat.HEARTBEAT_DEFAULT_INTERVAL,
        "app-module-at-start": this is not None,
        "imported-in-this-process": module.IMPORTED_IN == os.getpid(),
        "tasks-before": list(module.TASKS),
        "sockets": sockets,
        "warm-threads": len(os.listdir(f"/proc/{os.getppid()}/task")),
        "random": random.random(),
        "numpy": float(np.random.random()),
        "torch-seed": torch.initial_seed(),
        "torch": float(torch.rand(1).item()),
        "torch-threads": torch.get_num_threads(),
        "thread-variables": {
            name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
        },
    }
    Path(path).write_text(json.dumps(seen))
    # State a careless ClientApp leaves behind: the next task must not see it.
    module.TASKS.append(spec.task_id)
    torch.manual_seed(spec.task_id)
    np.random.seed(spec.task_id)
    if action == "raise":
        raise RuntimeError("the ClientApp failed")
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "hold":
        time.sleep(600)
    if action == "no-input":
        from flwr.supernode.runtime import run_clientapp  # pylint: disable=C0415

        run_clientapp.pull_task_input(SilentSuperNode())
    if action == "sleep":
        time.sleep(1.0)
        Path(path).write_text(json.dumps({**seen, "ended": time.monotonic()}))
