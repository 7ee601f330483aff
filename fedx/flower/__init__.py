"""Every change fedx makes to Flower's internals, one module each, made by one installer.

fedx is faster and sturdier than Flower 1.41 and 1.42 in places only by
changing code of Flower's that Flower offers no setting, flag or extension
point for (docs/flower-changes.md says which seams were looked for). Each
change is made at run time, in fedx's own processes (Flower's installed files
are not touched), by one module of this package, and only by it: the rest of
fedx calls these modules and imports Flower's public API alone
(``flwr.app``, ``flwr.clientapp``, ``flwr.serverapp`` with its strategies,
``flwr.common``'s records, logger and constants).

Each module says what it changes, why (the cost it removes, as measured),
the Flower releases it was checked against (:data:`CHECKED_FLWR`) and what
fedx does under another Flower; its ``FLOWER_CODE`` names the Flower code it
relies on, with the fingerprint of that code's source in each checked
release (one table for all: :mod:`fedx.flower._fingerprints`), and its
``apply`` makes the change. A process makes its changes with
one call of :func:`install`, which checks every fingerprint against the code
the process runs first, then makes all of the changes in one order
(:data:`ORDER`), or, where any differs (another Flower, a patch release,
another package's replacement), none, with one warning that names the change
and the releases it was checked against: Flower's own code then runs.

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
  its own message.
- :mod:`~fedx.flower.task_heartbeat`: a warm ClientApp task's heartbeat
  tells it of its end sooner.
- :mod:`~fedx.flower.superlink_middleware`: the SuperLink app's
  ``_get_middleware`` scopes Flower's middleware to the requests they act
  on (``fedx-superlink``).
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

Importing this package, or any module of it, imports none of Flower's
internals (``tests/unit/test_flower_changes.py`` checks it): a change imports the
Flower code it changes when it is checked and made.
"""

import math
import sys
from dataclasses import dataclass

from fedx.flower._installer import (
    CHECKED_FLWR,
    ORDER,
    PROCESSES,
    FlowerCodeMismatch,
    Installation,
    fingerprint,
    flowers_own,
    install,
    replace,
)

__all__ = [
    "CHECKED_FLWR",
    "ORDER",
    "PROCESSES",
    "FlowerCodeMismatch",
    "IdleBackoff",
    "Installation",
    "fingerprint",
    "flowers_own",
    "in_simulation_engine",
    "install",
    "replace",
]

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
    """Whether Flower's simulation engine is loaded in this process (not in a Ray actor).

    Flower's own ClientApp actors, which run where fedx's engine parts are
    not made (:func:`install` found another Flower), import the engine's
    package too; they run no engine.
    """
    if SIMULATION_ENGINE not in sys.modules:
        return False
    ray = sys.modules.get("ray")
    return not (
        ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id()
    )


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
