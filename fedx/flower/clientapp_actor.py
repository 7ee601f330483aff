"""Change: the simulation's ClientApp actors are fedx's class, not Flower's ``ClientAppActor``.

What it changes
    Flower's ``RayBackend`` runs ClientApps in actors of its
    ``ClientAppActor`` (``flwr.simulation.ray_transport.ray_actor``); fedx's
    backend (:mod:`fedx.flower.ray_backend`) creates actors of
    :class:`fedx.simulation.actor.ClientAppActor` instead: the same
    arguments, the same ``run`` and the same errors, which Flower's engine
    (``vce_api.worker``) turns into its error replies. This module hands the
    actor those error classes of Flower's ClientApp.

Why
    Flower's actor class sits in the ``flwr.simulation`` package, whose
    import (the simulation engine and its state) costs every actor 0.6-0.7 s
    on 2 cores before it loads the ClientApp, on the way to round 1
    (docs/results.md, time to round 1). fedx's actor module imports Ray,
    Flower's ClientApp and what the app imports, nothing else.

Checked against
    flwr 1.41.0 (:data:`fedx.flower.CHECKED_FLWR`).

Under another Flower
    fedx's actors run only under fedx's backend, which is used only where
    Flower's ``RayBackend`` is the class it extends
    (:func:`fedx.flower.ray_backend.use_backend`); elsewhere Flower's actors
    run. This module has no check of its own at run time: its test catches
    a Flower whose actor or error handling changed.
"""

from flwr.clientapp.client_app import ClientAppException, LoadClientAppError

__all__ = ["ClientAppException", "LoadClientAppError"]

#: The Flower code this change relies on, with the fingerprint of its source
#: (SHA-256, first 16 hex digits) as checked: tests/test_flower_changes.py.
FLOWER_CODE = {
    "flwr.simulation.ray_transport.ray_actor:VirtualClientEngineActor": "a64283908b1ec170",
    "flwr.server.superlink.fleet.vce.vce_api:worker": "60f308688ba34fb5",
}
#: What to re-check in that code when it changes.
RECHECK = (
    "that fedx.simulation.actor.ClientAppActor still takes Flower's actor arguments, "
    "answers run(client_app_fn, message, cid, context) with (cid, message, context) and "
    "raises LoadClientAppError and ClientAppException as Flower's does, and that the "
    "engine's worker still turns those two into its error replies"
)
