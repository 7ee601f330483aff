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
    import (the simulation engine and its state) costs every actor time
    before it loads the ClientApp, on the way to round 1 (measured in
    docs/results-record.md, "The simulation's fixed costs"). fedx's actor
    module imports Ray, Flower's ClientApp and what the app imports, nothing
    else.

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`): the same code.
    Flower's backend takes no actor class: fedx's backend
    (:mod:`~fedx.flower.ray_backend`) is what creates these actors.

Under another Flower
    fedx's actors run only under fedx's backend, and this change is checked
    with the simulation's other changes, all or none
    (:mod:`~fedx.flower.ray_backend` says how): where the actor or the
    engine's error handling differs, Flower's backend and actors run, with
    one warning.
"""

from typing import Any

from fedx.flower._fingerprints import flower_code

#: Flower's ClientApp errors, which this module hands fedx's actor (imported when asked for).
FLOWER_ERRORS = ("ClientAppException", "LoadClientAppError")


def __getattr__(name: str) -> Any:
    # Flower's ClientApp errors, imported when first asked for (by the actor's module).
    if name in FLOWER_ERRORS:
        from flwr.clientapp import client_app  # pylint: disable=import-outside-toplevel

        return getattr(client_app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The Flower code this change relies on (its fingerprints: fedx.flower._fingerprints).
FLOWER_CODE = flower_code(
    "flwr.simulation.ray_transport.ray_actor:VirtualClientEngineActor",
    "flwr.server.superlink.fleet.vce.vce_api:worker",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that fedx.simulation.actor.ClientAppActor still takes Flower's actor arguments, "
    "answers run(client_app_fn, message, cid, context) with (cid, message, context) and "
    "raises LoadClientAppError and ClientAppException as Flower's does, and that the "
    "engine's worker still turns those two into its error replies"
)
