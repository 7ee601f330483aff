"""Spreading independent pieces of an operation over threads.

numpy releases the GIL inside its loops and BLAS calls, so Python threads
run the pieces in parallel. The number of threads is the number BLAS would
use (``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``, or a
``threadpoolctl.threadpool_limits`` in force), so one setting controls both;
with 1 everything runs in the calling thread. While the pieces run, BLAS
itself is held to one thread per call: a BLAS thread that waits for a core
busy with other work (Ray's training processes, say) spins and slows the
whole call down many times over, whereas a Python thread just waits its
turn.
"""

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import TypeVar

Task = TypeVar("Task")
Result = TypeVar("Result")

_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_controller = None
_lock = threading.Lock()


def thread_count() -> int:
    """How many threads an operation may use now: as many as BLAS would."""
    controller = _blas_controller()
    if controller is not None:
        blas = controller.select(user_api="blas")
        if blas.lib_controllers:
            return max(1, min(lib.num_threads for lib in blas.lib_controllers))
    return os.cpu_count() or 1


def run_tasks(
    function: Callable[[Task], Result], tasks: Sequence[Task], *, threads: int | None = None
) -> list[Result]:
    """``[function(task) for task in tasks]``, on up to ``threads`` threads.

    The calling thread works too, tasks are handed out in order as threads
    become free, and the results come back in task order. ``threads``
    defaults to :func:`thread_count`. The first exception raised by a task
    is raised here, after the other threads have stopped.
    """
    threads = min(thread_count() if threads is None else threads, len(tasks))
    if threads <= 1:
        return [function(task) for task in tasks]
    results: list = [None] * len(tasks)
    pending = iter(enumerate(tasks))
    pending_lock = threading.Lock()
    failures: list[BaseException] = []

    def work() -> None:
        while not failures:
            with pending_lock:
                item = next(pending, None)
            if item is None:
                return
            index, task = item
            try:
                results[index] = function(task)
            except BaseException as error:  # pylint: disable=broad-exception-caught
                failures.append(error)

    with _single_threaded_blas():
        helpers = [_executor().submit(work) for _ in range(threads - 1)]
        work()
        for helper in helpers:
            helper.result()
    if failures:
        raise failures[0]
    return results


def _executor() -> ThreadPoolExecutor:
    """One pool for the process, as large as the machine; calls use part of it.

    A forked child gets a pool of its own: it inherits the parent's pool
    object but not its threads, so work handed to it would never run.
    """
    global _pool, _pool_pid  # pylint: disable=global-statement
    with _lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool_pid = os.getpid()
            _pool = ThreadPoolExecutor(
                max_workers=max(1, (os.cpu_count() or 1) - 1), thread_name_prefix="fedx-ops"
            )
        return _pool


def _blas_controller():
    """threadpoolctl's view of the loaded BLAS libraries (built once: it scans them)."""
    global _controller  # pylint: disable=global-statement
    with _lock:
        if _controller is None:
            try:
                from threadpoolctl import ThreadpoolController  # pylint: disable=import-outside-toplevel
            except ImportError:  # scikit-learn brings it; without it, no BLAS control
                _controller = False
            else:
                _controller = ThreadpoolController()
        return _controller or None


def _single_threaded_blas():
    controller = _blas_controller()
    if controller is None:
        return nullcontext()
    return controller.limit(limits=1, user_api="blas")
