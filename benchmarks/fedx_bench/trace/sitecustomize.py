"""Timestamps of one message's way through real Flower processes (``benchmarks/message_timeline.py``).

Put this folder on ``PYTHONPATH`` and set ``FEDX_TRACE_FILE``: every Python
process of the federation (SuperLink, ServerApp, SuperNodes, SuperExecs, the
ClientApps they fork) then appends one line per call of the functions in
:data:`TARGETS` to that file: ``monotonic start, seconds, pid, parent pid, program,
function, summary``. Functions marked ``?`` are polled; only their calls that
return something are written. ``time.monotonic`` is the machine's clock, the
same in every process. Without ``FEDX_TRACE_FILE`` nothing is patched.
"""

import functools
import importlib.abc
import os
import sys
import time

TARGETS = {
    # ServerApp
    "fedx.messaging": ["send_and_collect"],
    "flwr.superlink.grid.http_grid": ["HttpGrid.push_messages", "HttpGrid.pull_messages?"],
    # SuperLink
    "flwr.server.superlink.linkstate.sql_linkstate": [
        "SqlLinkState.store_message_ins",
        "SqlLinkState.get_message_ins?",
        "SqlLinkState.store_message_res",
        "SqlLinkState.get_message_res?",
    ],
    "flwr.superlink.servicer.runtime.runtime_handlers": ["push_object", "pull_object"],
    "flwr.superlink.servicer.fleet.fleet_handlers": ["push_object", "pull_object"],
    # SuperNode: its loop and its Runtime API
    "flwr.supernode.start_client_internal": ["_pull_and_store_message?", "_push_messages"],
    "flwr.supernode.servicer.runtime.runtime_handlers": [
        "acquire_task?",
        "pull_task_input",
        "pull_messages",
        "confirm_message_received",
        "push_messages",
        "push_object",
        "push_task_output",
    ],
    # SuperExec and the forked task
    "fedx.deploy.warm_executor": ["WarmExecutor.launch"],
    "fedx.deploy.warm_task": ["_task_child", "_fresh_start"],
    "fedx.flower.clientapp_task": ["install_fab_once"],
    "flwr.supernode.runtime.run_clientapp": [
        "run_clientapp",
        "pull_task_input",
        "install_from_fab",
        "get_load_client_app_fn",
        "push_message",
        "flwr_exit",
        "start_parent_process_monitor",
        "RuntimeHttpClient.from_server_address",
        "HeartbeatSender.start",
        "HeartbeatSender.stop",
    ],
    "flwr.clientapp.utils": ["get_load_client_app_fn"],
    "flwr.clientapp.client_app": ["ClientApp.__call__"],
    "fedx.client.task": ["ClientTask.training_data", "ClientTask.model", "ClientTask.__init__"],
    "fedx.client_app": ["train", "evaluate"],
    # CUDA starting in a forked task (a GPU node): torch calls it on the first CUDA work
    "torch.cuda": ["_lazy_init"],
    # a forked task's process, until os._exit
    "multiprocessing.process": ["BaseProcess._bootstrap"],
}

TRACE_FILE = os.environ.get("FEDX_TRACE_FILE")
PROGRAM = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


def _write(start: float, seconds: float, name: str, summary: str) -> None:
    line = f"{start:.4f} {seconds:.4f} {os.getpid()} {os.getppid()} {PROGRAM} {name} {summary}\n"
    fd = os.open(TRACE_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _summary(result) -> str:
    if hasattr(result, "ByteSize"):  # a protobuf message
        return f"len={result.ByteSize()}"
    try:
        return f"len={len(result)}"
    except TypeError:
        return type(result).__name__


def _wrap(function, name: str, polled: bool, wrap_result: bool):
    if getattr(function, "__fedx_traced__", False):
        return function

    @functools.wraps(function)
    def traced(*args, **kwargs):
        start = time.monotonic()
        try:
            result = function(*args, **kwargs)
        except BaseException as err:
            _write(start, time.monotonic() - start, name, f"raised:{type(err).__name__}")
            raise
        if not polled or (result is not None and result != [] and _summary(result) != "len=0"):
            _write(start, time.monotonic() - start, name, _summary(result))
        if wrap_result and callable(result):
            return _wrap(result, name + "()", False, False)
        return result

    traced.__fedx_traced__ = True
    return traced


def _patch(module) -> None:
    for target in TARGETS.get(module.__name__, []):
        polled = target.endswith("?")
        path = target.rstrip("?").split(".")
        owner = module
        for part in path[:-1]:
            owner = getattr(owner, part, None)
        if owner is None or not hasattr(owner, path[-1]):
            continue
        original = (
            owner.__dict__.get(path[-1]) if isinstance(owner, type) else getattr(owner, path[-1])
        )
        if original is None:
            continue
        wrap_result = path[-1] == "get_load_client_app_fn"
        if isinstance(original, (classmethod, staticmethod)):
            wrapped = type(original)(
                _wrap(original.__func__, target.rstrip("?"), polled, wrap_result)
            )
        else:
            wrapped = _wrap(original, target.rstrip("?"), polled, wrap_result)
        setattr(owner, path[-1], wrapped)


class _Patcher(importlib.abc.MetaPathFinder):
    """Patches the modules of :data:`TARGETS` right after they are executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                execute = spec.loader.exec_module

                def exec_module(module, execute=execute):
                    execute(module)
                    _patch(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


if TRACE_FILE:
    for _name in list(TARGETS):
        if _name in sys.modules:
            _patch(sys.modules[_name])
    sys.meta_path.insert(0, _Patcher())
