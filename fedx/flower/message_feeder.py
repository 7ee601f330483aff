"""Change: the simulation engine's message feeder is fedx's, woken by the ServerApp's pushes.

What it changes
    The function ``add_messages_to_queue`` of
    ``flwr.server.superlink.fleet.vce.vce_api``, which the engine's
    ``run_api`` starts in a thread to hand the stored messages to its
    workers, is replaced by the feeder given to :func:`use_feeder`
    (:func:`fedx.simulation.feeder.feed_messages`, which takes the same
    arguments), in the process that calls it only.

Why
    Flower's feeder looks for new messages every 0.1 s, asking the run's
    state for each node in turn, and each ask goes over every message
    stored: a message waits 0.05 s on average before it runs, and with N
    nodes and M messages in a round the engine spends N x M checks every
    0.1 s (34 ms for 100 nodes and 100 messages on the reference machine, a
    third of a core, all round long). fedx's feeder is woken when the
    ServerApp stores messages (:mod:`fedx.flower.linkstate_stores`) and asks
    only for the nodes they are for, in the order Flower would; a slow pass
    over every node remains as a safety net.

Checked against
    flwr 1.41.0 (:data:`fedx.flower.CHECKED_FLWR`).

Under another Flower
    :func:`use_feeder` replaces nothing when ``vce_api``'s
    ``add_messages_to_queue`` is not the function this module imported, or
    takes other parameters than the feeder: it logs a warning and Flower's
    feeder runs. fedx's feeder itself hands a state it cannot hook to
    Flower's (:data:`flower_add_messages_to_queue`).
"""

import inspect
from collections.abc import Callable

from flwr.server.superlink.fleet.vce import vce_api

from fedx.flower import replace

#: Flower's message feeder, which :func:`use_feeder` replaces.
flower_add_messages_to_queue = vce_api.add_messages_to_queue

#: The Flower code this change relies on, with the fingerprint of its source
#: (SHA-256, first 16 hex digits) as checked: tests/test_flower_changes.py.
FLOWER_CODE = {
    "flwr.server.superlink.fleet.vce.vce_api:add_messages_to_queue": "953f4bd41a931a77",
    "flwr.server.superlink.fleet.vce.vce_api:run_api": "f85c0cd6e902752f",
}
#: What to re-check in that code when it changes.
RECHECK = (
    "that run_api still starts the module global add_messages_to_queue(state, queue, "
    "nodes_mapping, f_stop) in a thread, and that it still hands each node at most one "
    "message a pass through state.get_message_ins(node_id=..., limit=1), in the order of "
    "nodes_mapping, as fedx.simulation.feeder.feed_messages does"
)


def use_feeder(feeder: Callable[..., None]) -> bool:
    """Make this process's Flower simulation engine feed its workers with ``feeder``.

    Returns
    -------
    bool
        Whether the engine runs ``feeder`` now.
    """
    same_parameters = list(inspect.signature(flower_add_messages_to_queue).parameters) == list(
        inspect.signature(feeder).parameters
    )
    return replace(
        vce_api, "add_messages_to_queue", feeder, flower_add_messages_to_queue, fits=same_parameters
    )
