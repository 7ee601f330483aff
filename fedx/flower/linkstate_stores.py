"""Change: the run state's stores of messages and replies are wrapped while fedx's feeder runs.

What it changes
    The methods ``store_message_ins`` and ``store_message_res`` of the
    simulation run's ``LinkState`` object (Flower's ``InMemoryLinkState``, shared
    by the ServerApp's grid and the engine in the simulation's process) are
    wrapped on that object (``setattr``; the class is not touched) for as
    long as :func:`hooked` holds them: each call is Flower's, then a
    callback. Leaving the block removes the wrappers.

Why
    fedx's feeder (:func:`fedx.simulation.feeder.feed_messages`) is woken
    when the ServerApp stores a message instead of polling every node every
    0.1 s (:mod:`fedx.flower.message_feeder` says what that costs), and a
    reply the engine stores ends the pause of the ServerApp's exchanges
    waiting for it (:data:`fedx.messaging.REPLIES_STORED`), so that they pull
    it at once instead of at their next 20-250 ms pull.

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`): the same code.

Under another Flower
    Checked with the simulation's other changes, all or none
    (:mod:`~fedx.flower.ray_backend` says how): fedx's feeder, the one user
    of these hooks, does not run then. A state without those two methods is
    not hooked (:func:`hooked` yields ``False``): fedx's feeder then hands
    it to Flower's feeder, and the exchanges pull at their own pace.
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from fedx.flower._fingerprints import flower_code

#: ``callback(message, message_id)``, after Flower's method stored ``message``
#: (``message_id`` as it returned it: ``None`` or empty when it did not store it).
StoreCallback = Callable[[Any, Any], None]

#: The state's methods wrapped: storing a message, storing a reply.
HOOKED = ("store_message_ins", "store_message_res")

#: The Flower code this change relies on (its fingerprints: fedx.flower._fingerprints).
FLOWER_CODE = flower_code(
    "flwr.server.superlink.linkstate.in_memory_linkstate:InMemoryLinkState.store_message_ins",
    "flwr.server.superlink.linkstate.in_memory_linkstate:InMemoryLinkState.store_message_res",
    "flwr.server.superlink.linkstate.in_memory_linkstate:InMemoryLinkState.get_message_ins",
    "flwr.server.superlink.fleet.vce.vce_api:put_message_into_state",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that the ServerApp's grid stores every message through state.store_message_ins and "
    "the engine every reply through state.store_message_res of the same state object "
    "(put_message_into_state), each returning the message id, and that get_message_ins "
    "marks what it returns as delivered"
)


@contextlib.contextmanager
def hooked(
    state: Any, on_message_stored: StoreCallback, on_reply_stored: StoreCallback
) -> Iterator[bool]:
    """While the block runs, call back after every message and reply ``state`` stores.

    Yields
    ------
    bool
        Whether the state is hooked (``False``: it lacks those methods).
    """
    store, store_reply = (getattr(state, name, None) for name in HOOKED)
    if store is None or store_reply is None:
        yield False
        return

    def store_message_ins(message: Any) -> Any:
        message_id = store(message)
        on_message_stored(message, message_id)
        return message_id

    def store_message_res(message: Any) -> Any:
        message_id = store_reply(message)
        on_reply_stored(message, message_id)
        return message_id

    hooks = {"store_message_ins": store_message_ins, "store_message_res": store_message_res}
    for name, hook in hooks.items():
        setattr(state, name, hook)
    try:
        yield True
    finally:
        for name, hook in hooks.items():
            if vars(state).get(name) is hook:
                delattr(state, name)
