"""fedx's message feeder: hands the simulation engine's workers their messages when the ServerApp pushes them.

Flower's engine looks for new messages every 0.1 s, asking the run's state
for each node in turn, and each of those asks goes over every message
stored: a message waits 0.05 s on average before it runs, and with N nodes
and M messages in a round the engine spends N x M checks every 0.1 s: at
100 nodes and 100 messages, a large share of a core, all round long
(docs/results.md, "Inside the simulation"). :func:`feed_messages` takes
its place (:mod:`fedx.flower.message_feeder`): it is woken when the ServerApp pushes
messages and asks only for the nodes they are for, in the order Flower
would, one message per node and pass as Flower does; a slow pass over every
node remains as a safety net. It also tells the ServerApp's exchanges when
a reply is stored (:data:`fedx.messaging.REPLIES_STORED`), so that they
pull it at once, and announces each message it hands the workers to the
client groups' collector (:mod:`fedx.simulation.groups`), which then knows
how many of a round's messages are still on their way to the backend.
"""

import threading
import time
from queue import Queue
from typing import Any

from flwr.app import Message

from fedx.flower import linkstate_stores
from fedx.flower.message_feeder import flower_add_messages_to_queue
from fedx.messaging import REPLIES_STORED
from fedx.simulation import groups

# The feeder looks again after this long at nodes that had a message (a node gets
# one message per look, as in Flower), and at nodes with no news at all.
FEED_INTERVAL = 0.1
# ... and passes over every node this often, for a message its wake-up missed (at
# least SWEEP_SHARE times as long as a pass over every node took: such a pass costs
# nodes x stored messages checks in Flower's state, seconds at 1000 x 1000).
FEED_SWEEP_INTERVAL = 1.0
SWEEP_SHARE = 50


def feed_messages(
    state: Any,
    queue: "Queue[Message]",
    nodes_mapping: dict[int, int],
    f_stop: threading.Event,
) -> None:
    """Flower's ``add_messages_to_queue``, woken by the ServerApp's pushes instead of polling.

    It hands the engine's workers the messages stored for the simulated
    nodes, as Flower's does (through ``state.get_message_ins(node_id,
    limit=1)``: one message per node and pass, marked delivered by the
    state), but a pass asks only for the nodes that messages were just
    stored for (``state.store_message_ins`` tells it), and for the nodes that
    had one in the previous pass, :data:`FEED_INTERVAL` later; every
    :data:`FEED_SWEEP_INTERVAL` it asks for every node. Every reply the
    engine stores (``state.store_message_res``) notifies
    :data:`fedx.messaging.REPLIES_STORED`. A state it cannot hook into gets
    Flower's feeder.
    """
    wake = threading.Event()
    lock = threading.Lock()
    pushed: set[int] = set()

    def message_stored(message: Message, message_id: Any) -> None:
        if message_id:
            with lock:
                pushed.add(message.metadata.dst_node_id)
            wake.set()

    def reply_stored(message: Message, message_id: Any) -> None:
        del message, message_id
        REPLIES_STORED.notify()

    with linkstate_stores.hooked(state, message_stored, reply_stored) as hooked:
        if not hooked or not hasattr(state, "get_message_ins"):
            flower_add_messages_to_queue(state, queue, nodes_mapping, f_stop)
            return
        order = {node_id: position for position, node_id in enumerate(nodes_mapping)}
        again: set[int] = set()  # nodes that had a message in the last pass: looked at again
        again_at = next_sweep = time.monotonic() + FEED_SWEEP_INTERVAL
        with REPLIES_STORED.notifying():
            while not f_stop.is_set():
                wake.wait(FEED_INTERVAL)
                wake.clear()
                with lock:
                    nodes = set(pushed)
                    pushed.clear()
                now = time.monotonic()
                if now >= again_at:
                    nodes |= again
                    again = set()
                sweep = now >= next_sweep
                if sweep:
                    nodes = set(order)
                for node_id in sorted((n for n in nodes if n in order), key=order.__getitem__):
                    messages = state.get_message_ins(node_id=node_id, limit=1)
                    for message in messages:
                        groups.COLLECTOR.announce(message)  # on its way to the backend
                        queue.put(message)
                    if messages:
                        again.add(node_id)
                        again_at = now + FEED_INTERVAL
                if sweep:
                    took = time.monotonic() - now
                    next_sweep = now + max(FEED_SWEEP_INTERVAL, SWEEP_SHARE * took)
