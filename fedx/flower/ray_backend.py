"""Change: Flower's simulation engine builds fedx's Ray backend instead of Flower's.

What it changes
    The class ``RayBackend`` of
    ``flwr.server.superlink.fleet.vce.backend.raybackend``, which Flower's
    ``start_vce`` imports from that module each time it builds the
    simulation's backend, is replaced by a subclass of it
    (:class:`fedx.simulation.backend.ClusterRayBackend`), in the process
    that calls :func:`use_backend` only. The subclass keeps Flower's backend
    configuration and overrides ``init_ray``, ``build``, ``num_workers``,
    ``is_worker_idle``, ``process_message`` and ``terminate``: its actor
    pool (:class:`fedx.simulation.pool.ActorPool`) takes the place of
    Flower's ``BasicActorPool`` and sizes itself by Flower's rule
    (``pool_size_from_resources``).

Why
    On a Ray cluster of several machines Flower's pool gives messages to
    actors whose node died for the rest of the run and never uses a node
    that joins later; fedx's pool drops lost actors, runs their messages
    again elsewhere and grows where the cluster has room. It also queues a
    message behind a busy actor while more wait than there are actors (the
    round trip through the engine, a sizeable share of a small client's
    training), passes models of up to 2 MiB inline in Ray calls when it
    starts Ray itself (a small model's round trip is faster inline than
    through the object store: docs/results.md, "Inside the simulation"),
    and starts a local Ray without a runtime env, so that Ray's prestarted
    workers host the actors (no ``setup_worker.py`` start per worker): with
    fedx's actor class (:mod:`fedx.flower.clientapp_actor`), the time from
    ``ray.init``'s return until two actors have loaded the ClientApp about
    halved (docs/results-record.md, "The simulation's fixed costs").

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`): the same code.
    Neither release has a backend registry or a setting that names the
    backend's class: ``start_vce`` imports ``RayBackend`` from its module.

Under another Flower
    The simulation's changes (this one, :mod:`~fedx.flower.clientapp_actor`,
    :mod:`~fedx.flower.linkstate_stores`, :mod:`~fedx.flower.engine_threads`,
    :mod:`~fedx.flower.message_feeder`) are made all or none
    (:func:`fedx.flower.install`): where any code they rely on differs,
    Flower's backend, threads and feeder run the simulation, with one warning.
"""

from typing import Any

from fedx.flower import flowers_own, replace
from fedx.flower._fingerprints import flower_code

#: Where Flower's engine finds its backend class.
MODULE = "flwr.server.superlink.fleet.vce.backend.raybackend"

#: The Flower code this change relies on (its fingerprints: fedx.flower._fingerprints).
FLOWER_CODE = flower_code(
    "flwr.server.superlink.fleet.vce.backend.raybackend:RayBackend",
    "flwr.server.superlink.fleet.vce.backend.backend:Backend",
    "flwr.server.superlink.fleet.vce.vce_api:start_vce",
    "flwr.simulation.ray_transport.ray_actor:pool_size_from_resources",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that start_vce still imports RayBackend from its module when it builds the backend, "
    "that fedx.simulation.backend.ClusterRayBackend still overrides every method of Backend "
    "that RayBackend implements (init_ray and the backend config's keys included), and that "
    "fedx.simulation.ray_cluster.actors_per_node is still pool_size_from_resources's rule"
)


def raybackend() -> Any:
    """Flower's module of its Ray backend (imported on first use)."""
    import importlib  # pylint: disable=import-outside-toplevel

    return importlib.import_module(MODULE)


def __getattr__(name: str) -> Any:
    # Flower's classes, imported when first asked for: FlowerRayBackend (which fedx's
    # extends, the class this change replaces) and its BackendConfig.
    if name == "FlowerRayBackend":
        return flowers_own(raybackend(), "RayBackend")
    if name == "BackendConfig":
        from flwr.server.superlink.fleet.vce.backend.backend import (  # pylint: disable=C0415
            BackendConfig,
        )

        return BackendConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def apply(backend: type):
    """Make this process's Flower simulation engine build ``backend`` (a subclass of Flower's).

    Made by :func:`fedx.flower.install`; returns what undoes it.
    """
    return replace(raybackend(), "RayBackend", backend)
