"""Change: the simulation engine runs one thread per worker its backend asks for.

What it changes
    The name ``ThreadPoolExecutor`` in
    ``flwr.server.superlink.fleet.vce.vce_api``, which the engine's
    ``run_api`` looks up when it starts its worker loops, is replaced by
    :class:`ThreadPerWorker`, in the simulation's process only
    (:func:`apply`, through :func:`fedx.flower.install`).

Why
    ``run_api`` submits one endless worker loop per ``backend.num_workers``
    to a ``ThreadPoolExecutor()`` of default size, min(32, cores + 4) of the
    machine that runs the simulation: beyond that, actors of the backend are
    never used. On a Ray cluster whose nodes hold more ClientApp actors than
    the head has cores + 4, the rest of the cluster idled; and fedx's backend
    asks for room to grow when nodes join
    (:data:`fedx.simulation.backend.JOIN_HEADROOM`).

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`): the same code.
    The pool's size is no setting of Flower's.

Under another Flower
    Made with the simulation's other changes, all or none
    (:mod:`~fedx.flower.ray_backend` says how): the engine keeps its own
    threads, with one warning.
"""

import importlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fedx.flower import replace
from fedx.flower._fingerprints import flower_code

#: Flower's simulation engine.
VCE_API = "flwr.server.superlink.fleet.vce.vce_api"

#: The Flower code this change relies on (its fingerprints: fedx.flower._fingerprints).
FLOWER_CODE = flower_code(
    "flwr.server.superlink.fleet.vce.vce_api:run_api",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that run_api still runs backend.num_workers endless worker loops in the module "
    "global ThreadPoolExecutor(), looked up when it starts them"
)


class ThreadPerWorker(ThreadPoolExecutor):
    """A ThreadPoolExecutor that runs every task it is given at once.

    Flower's engine submits one endless worker loop per backend worker; with
    the default size only min(32, cores + 4) loops ever run.
    """

    def __init__(self, max_workers: int | None = None, *args: Any, **kwargs: Any) -> None:
        # Threads start lazily, one per submitted loop: a large bound costs nothing.
        super().__init__(max_workers or 1_000_000, *args, **kwargs)


def apply():
    """Make this process's Flower simulation engine run every worker loop in a thread of its own.

    Made by :func:`fedx.flower.install`; returns what undoes it.
    """
    return replace(importlib.import_module(VCE_API), "ThreadPoolExecutor", ThreadPerWorker)
