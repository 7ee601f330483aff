"""Every change fedx makes to Flower's internals, one module each.

fedx is faster and sturdier than Flower 1.41 in places only by changing code
of Flower's that Flower offers no setting for. Each change is made at run
time, in fedx's own processes (Flower's installed files are not touched), by
one module of this package, and only by it: the rest of fedx calls these
modules and imports Flower's public API alone (``flwr.app``,
``flwr.clientapp``, ``flwr.serverapp`` with its strategies, ``flwr.common``'s
records, logger and constants).

Each module says what it changes, why (the cost it removes, as measured),
the Flower version it was checked against (:data:`CHECKED_FLWR`) and what
fedx does under another Flower; its ``FLOWER_CODE`` names the Flower code it
relies on, with a fingerprint of that code's source, and
``tests/test_flower_changes.py`` fails when that code is not the code the
change was checked against.

The changes:

- :mod:`~fedx.flower.ray_backend`: Flower's ``RayBackend`` class is replaced
  by fedx's (:class:`fedx.simulation.backend.ClusterRayBackend`).
- :mod:`~fedx.flower.clientapp_actor`: the simulation's ClientApp actors are
  fedx's class, not Flower's ``ClientAppActor``.
- :mod:`~fedx.flower.engine_threads`: the simulation engine's
  ``ThreadPoolExecutor`` runs one thread per worker the backend asks for.
- :mod:`~fedx.flower.message_feeder`: the engine's ``add_messages_to_queue``
  is replaced by fedx's feeder (:func:`fedx.simulation.feeder.feed_messages`).
- :mod:`~fedx.flower.linkstate_stores`: the run state's ``store_message_ins``
  and ``store_message_res`` are wrapped while fedx's feeder runs.
- :mod:`~fedx.flower.object_pulls`: the retry keywords of Flower's object
  pulls (``pull_objects``) are shortened.
- :mod:`~fedx.flower.objects_in_flight`: how many objects of a message
  Flower's pulls and pushes move at once (``fedx-supernode
  --objects-in-flight``, ``FEDX_OBJECTS_IN_FLIGHT``), past Flower's cap at
  the process's cores.
- :mod:`~fedx.flower.supernode_waits`: the SuperNode loop's 3 s and 0.5 s
  waits become ``fedx-supernode --poll-interval``, backing off while the
  node has nothing to do (:class:`IdleBackoff`).
- :mod:`~fedx.flower.stopped_runs`: ``fedx-supernode``'s loop drops a
  stopped run's messages and ends their tasks, and pushes each reply for
  its own message; a warm task's heartbeat tells it of its end sooner.
- :mod:`~fedx.flower.superlink_middleware`: the SuperLink app's
  ``_get_middleware`` scopes seven of its nine middleware to the requests
  they act on (``fedx-superlink``).
- :mod:`~fedx.flower.superexec_executor`: the SuperExec's ``get_executor``
  returns fedx's warm executor (``fedx-superexec``), and its task polls back
  off while it has nothing to do (:class:`IdleBackoff`).
- :mod:`~fedx.flower.clientapp_task`: a warm ClientApp task runs
  ``run_clientapp`` with an ``install_from_fab`` that finds an installed FAB
  without unpacking it.
- :mod:`~fedx.flower.task_input`: a warm ClientApp task tells its executor
  while Flower's ``pull_task_input`` waits for its input, during which it
  holds no slot of the task limit.

And one use of Flower's internals that changes nothing:

- :mod:`~fedx.flower.wire`: Flower's serialization of a ``RecordDict``, for
  the in-process loopback grid (:mod:`fedx.secure.loopback`).

Importing this package imports no module of Flower's: the ClientApp module
asks :func:`in_simulation_engine` in every process that loads it.
"""

import math
import sys
from dataclasses import dataclass
from logging import WARNING
from types import ModuleType
from typing import Any

#: The Flower release every change here was checked against.
CHECKED_FLWR = "1.41.0"

#: How long polls stay short after the last work (seconds), unless told:
#: :class:`IdleBackoff`.
IDLE_AFTER = 10.0
#: Flower's idle waits (seconds): a SuperNode's between two pulls of the
#: SuperLink (``time.sleep(3)`` in its loop), a SuperExec's between two task
#: polls (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``'s default).
SUPERNODE_IDLE_WAIT = 3
SUPEREXEC_TASK_POLL = 1.0

#: Flower's simulation engine (``vce_api``): loaded in a process that runs
#: simulated ClientApps (``flwr-simulation``, or ``run_simulation`` in process).
SIMULATION_ENGINE = "flwr.server.superlink.fleet.vce.vce_api"


def in_simulation_engine() -> bool:
    """Whether Flower's simulation engine is loaded in this process."""
    return SIMULATION_ENGINE in sys.modules


def replace(
    module: ModuleType, name: str, replacement: Any, flowers: Any, *, fits: bool = True
) -> bool:
    """Set ``module.name`` to ``replacement`` where it is still Flower's own ``flowers``.

    Where it is something else (another Flower, or another package replaced
    it), or ``fits`` is false (Flower's has changed), nothing is replaced and
    a warning says so. Idempotent.

    Returns
    -------
    bool
        Whether ``module.name`` is ``replacement`` now.
    """
    current = getattr(module, name, None)
    if current is replacement:
        return True
    if current is not flowers or not fits:
        from flwr.common import log  # pylint: disable=import-outside-toplevel

        log(
            WARNING,
            "fedx: %s.%s is not the one fedx's replacement was written for (flwr %s); kept it",
            module.__name__,
            name,
            CHECKED_FLWR,
        )
        return False
    setattr(module, name, replacement)
    return True


@dataclass(frozen=True)
class IdleBackoff:
    """How long a poller waits before its next poll, from how long it has had nothing to do.

    While it had work within the last ``idle_after`` seconds it waits
    ``interval``; after that each wait lasts as long as it has been idle
    beyond ``idle_after`` (so the waits double: 0.1, 0.1, 0.2, 0.4 ... s),
    never less than ``interval`` nor more than ``ceiling``. Work that comes
    after an idle spell therefore waits at most ``ceiling``, and at most as
    long as the spell lasted beyond ``idle_after``. ``idle_after=inf``, or a
    ``ceiling`` equal to ``interval``, is a fixed interval.

    Parameters
    ----------
    interval : float
        Seconds between two polls while there is work (after a message).
    idle_after : float
        Seconds after the last work during which the polls stay ``interval``
        apart (``inf``: always).
    ceiling : float
        The longest wait, seconds.

    Raises
    ------
    ValueError
        When ``interval`` is not positive, ``ceiling`` is below it, or
        ``idle_after`` is negative.
    """

    interval: float
    idle_after: float
    ceiling: float

    def __post_init__(self) -> None:
        if not 0 < self.interval <= self.ceiling or not math.isfinite(self.ceiling):
            raise ValueError(
                f"need 0 < interval <= ceiling < inf, got interval {self.interval} and "
                f"ceiling {self.ceiling}"
            )
        if not self.idle_after >= 0:
            raise ValueError(
                f"idle_after must be >= 0 (inf: never back off), got {self.idle_after}"
            )

    def wait(self, idle_for: float) -> float:
        """Seconds to wait before the next poll, ``idle_for`` seconds after the last work."""
        if idle_for < self.idle_after:
            return self.interval
        return min(self.ceiling, max(self.interval, idle_for - self.idle_after))
