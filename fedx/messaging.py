"""Talking to nodes through a Flower Grid: waiting for them, and one exchange of messages.

Every message exchange of fedx (a round's training and evaluation, the
identification query, each step of secure recombination) goes through
:func:`send_and_collect`, so how replies are collected is decided here once.
numpy-free; Flower only.
"""

import time
from collections.abc import Iterable
from logging import INFO

from flwr.app import Message
from flwr.common import log
from flwr.serverapp import Grid


def send_and_collect(grid: Grid, messages: Iterable[Message], timeout: float) -> list[Message]:
    """Push ``messages`` and return the replies that arrive within ``timeout`` seconds.

    The messages get their ids when they are pushed, so a caller that kept
    them can match each reply to its message by ``reply_to_message_id``.
    """
    return list(grid.send_and_receive(messages=messages, timeout=timeout))


def wait_for_nodes(grid: Grid, minimum: int, timeout: float) -> list[int]:
    """The connected node ids, once ``minimum`` are connected or ``timeout`` seconds have passed.

    It never waits longer than ``timeout``: the caller decides what fewer
    nodes mean (the ServerApp stops, a strategy samples among those there).
    """
    deadline = time.monotonic() + timeout
    node_ids = list(grid.get_node_ids())
    while len(node_ids) < minimum and time.monotonic() < deadline:
        log(INFO, "Waiting for nodes: %d of %d connected", len(node_ids), minimum)
        time.sleep(min(1.0, max(deadline - time.monotonic(), 0.0)))
        node_ids = list(grid.get_node_ids())
    return node_ids
