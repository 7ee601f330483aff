"""Change: the simulation engine's message feeder is fedx's, woken by the ServerApp's pushes.

What it changes
    The function ``add_messages_to_queue`` of
    ``flwr.server.superlink.fleet.vce.vce_api``, which the engine's
    ``run_api`` starts in a thread to hand the stored messages to its
    workers, is replaced by the feeder given to :func:`apply`
    (:func:`fedx.simulation.feeder.feed_messages`, which takes the same
    arguments), in the simulation's process only.

Why
    Flower's feeder looks for new messages every 0.1 s, asking the run's
    state for each node in turn, and each ask goes over every message
    stored: a message waits 0.05 s on average before it runs, and with N
    nodes and M messages in a round the engine spends N x M checks every
    0.1 s: at 100 nodes and 100 messages, a large share of a core, all
    round long (docs/results.md, "Inside the simulation"). fedx's feeder
    is woken when the ServerApp stores messages
    (:mod:`fedx.flower.linkstate_stores`) and asks only for the nodes they
    are for, in the order Flower would; a slow pass over every node remains
    as a safety net.

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`): the same code.
    The feeder's 0.1 s is no setting of Flower's.

Under another Flower
    Made with the simulation's other changes, all or none
    (:mod:`~fedx.flower.ray_backend` says how): Flower's feeder runs, with
    one warning. fedx's feeder itself hands a state it cannot hook to
    Flower's (:func:`flower_add_messages_to_queue`).
"""

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from fedx.flower import flowers_own, replace
from fedx.flower._fingerprints import flower_code

#: Flower's simulation engine.
VCE_API = "flwr.server.superlink.fleet.vce.vce_api"


def flower_add_messages_to_queue(*args: Any, **kwargs: Any) -> None:
    """Flower's own message feeder (the one :func:`apply` replaces)."""
    flowers_own(importlib.import_module(VCE_API), "add_messages_to_queue")(*args, **kwargs)


#: The Flower code this change relies on (its fingerprints: fedx.flower._fingerprints).
FLOWER_CODE = flower_code(
    "flwr.server.superlink.fleet.vce.vce_api:add_messages_to_queue",
    "flwr.server.superlink.fleet.vce.vce_api:run_api",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that run_api still starts the module global add_messages_to_queue(state, queue, "
    "nodes_mapping, f_stop) in a thread, and that it still hands each node at most one "
    "message a pass through state.get_message_ins(node_id=..., limit=1), in the order of "
    "nodes_mapping, as fedx.simulation.feeder.feed_messages does"
)


def apply(feeder: Callable[..., None]):
    """Make this process's Flower simulation engine feed its workers with ``feeder``.

    Made by :func:`fedx.flower.install`; returns what undoes it.

    Raises
    ------
    TypeError
        When ``feeder`` does not take Flower's feeder's parameters.
    """
    vce_api = importlib.import_module(VCE_API)
    flowers = flowers_own(vce_api, "add_messages_to_queue")
    if list(inspect.signature(flowers).parameters) != list(inspect.signature(feeder).parameters):
        raise TypeError(f"{feeder} does not take the parameters of Flower's feeder")
    return replace(vce_api, "add_messages_to_queue", feeder)
