"""Talking to nodes through a Flower Grid: one exchange of messages, and waiting for nodes.

Every message exchange of fedx (a round's training and evaluation, the
identification query, each step of secure recombination) goes through
:func:`send_and_collect`, so how replies are collected is decided here once.

Flower's ``Grid.send_and_receive`` pushes the messages and then pulls the
replies in fixed steps: every 3 s on a real SuperLink (``HttpGrid`` on
Flower 1.41, ``GrpcGrid`` on 1.36), every 0.1 s in simulation
(``InMemoryGrid``). A reply that lands just after a pull waits for the next
one, so on real processes every exchange costs up to 3 s more than the
slowest node, which adds up in protocols with several exchanges per round
(FedMR's secure recombination has 2 + 2 r_s).

:func:`send_and_collect` is the same exchange on the same public methods
(``push_messages``, then ``pull_messages`` with the message ids the push
returned) with a short pull interval that grows while nothing arrives and
starts again after every reply, in simulation and deployment alike. The
environment variable ``FEDX_REPLY_PULL_INTERVAL=SECONDS`` (read by the
ServerApp's process) replaces it with a fixed interval: fewer requests to
the SuperLink, and with ``3`` the timing of Flower's ``send_and_receive`` on
a real SuperLink (``benchmarks/deployment.py`` uses that as a baseline).

What it keeps from ``send_and_receive``: the Grid sets the message ids when
it pushes; replies the SuperLink writes itself (an error reply for a node
that went offline, whose ClientApp crashed, or whose reply objects could not
be pulled) come back like any other reply; replies are returned in the
order they arrived; ``timeout=None`` waits until every reply is in.
In fedx's own ServerApp the objects of a reply that the SuperLink hands
out while its node is still pushing them are asked for at the same pace as
the replies (:func:`pull_intervals`), not after 1, 2, 4 ... 10 s as Flower
asks: :func:`fedx.server_app.change_flower` makes that change to Flower for
its process (:mod:`fedx.flower.object_pulls`); this module itself changes
nothing of Flower's, in any project. Differences: a message the
SuperLink refused at the push (``None`` id) is logged and not waited for
(``send_and_receive`` would wait for it until the timeout), and the replies
are pulled at least once, even with ``timeout=0``.

In Flower's simulation the ServerApp and the engine that runs the
ClientApps share one process, and the engine stores each reply where the
Grid pulls from: fedx's Ray backend then calls :data:`REPLIES_STORED`'s
``notify`` (:func:`fedx.simulation.feeder.feed_messages`), which ends the pause of
every exchange waiting in the process, so a reply is pulled as soon as it
is stored. In a deployment the replies land on the SuperLink, another
process, and the pauses run their course.

numpy-free; Flower only, so every layer above ``fedx.ops`` can use it.
"""

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator
from logging import DEBUG, INFO, WARNING

from flwr.app import Message
from flwr.common import log
from flwr.serverapp import Grid

#: Seconds before the first pull after a push or a reply, and its growth factor.
FIRST_PULL_INTERVAL = 0.02
PULL_INTERVAL_GROWTH = 2.0
#: The longest pause between pulls: the most a reply waits once it is on the
#: SuperLink. Each pull is one request to the SuperLink (a few ms there).
MAX_PULL_INTERVAL = 0.25
#: Environment variable for a fixed pull interval (seconds) instead of the above.
PULL_INTERVAL_VARIABLE = "FEDX_REPLY_PULL_INTERVAL"


class ReplySignal:
    """Tells the exchanges waiting in this process that replies were stored for them to pull.

    Whatever stores replies in the process announces itself with
    :meth:`notifying` and calls :meth:`notify` after each; while none does,
    :meth:`pause` is a plain ``time.sleep``.
    """

    def __init__(self) -> None:
        self._stored = threading.Condition()
        self._count = 0
        self._notifiers = 0

    @property
    def count(self) -> int:
        """How many times :meth:`notify` was called."""
        with self._stored:
            return self._count

    @contextlib.contextmanager
    def notifying(self) -> Iterator[None]:
        """While the block runs, pauses end at :meth:`notify`."""
        with self._stored:
            self._notifiers += 1
        try:
            yield
        finally:
            with self._stored:
                self._notifiers -= 1

    def notify(self) -> None:
        """Replies were stored: end every :meth:`pause`."""
        with self._stored:
            self._count += 1
            self._stored.notify_all()

    def pause(self, seen: int, seconds: float) -> None:
        """Sleep ``seconds``, or less when replies are stored after :attr:`count` was ``seen``."""
        with self._stored:
            if self._notifiers:
                self._stored.wait_for(lambda: self._count != seen, seconds)
                return
        time.sleep(seconds)


#: Notified by whatever stores replies in this process (fedx's Ray backend, in simulation).
REPLIES_STORED = ReplySignal()


def pull_intervals() -> tuple[float, float]:
    """The first and the longest pause between pulls: fixed by the environment, or adaptive.

    Raises
    ------
    ValueError
        When :data:`PULL_INTERVAL_VARIABLE` is set to something other than a
        positive number of seconds.
    """
    text = os.environ.get(PULL_INTERVAL_VARIABLE, "").strip()
    if not text:
        return FIRST_PULL_INTERVAL, MAX_PULL_INTERVAL
    try:
        fixed = float(text)
    except ValueError:
        fixed = float("nan")
    if not 0 < fixed < float("inf"):
        raise ValueError(
            f"{PULL_INTERVAL_VARIABLE} must be a positive number of seconds, got {text!r}"
        )
    return fixed, fixed


def send_and_collect(
    grid: Grid,
    messages: Iterable[Message],
    timeout: float | None,
    *,
    first_interval: float | None = None,
    max_interval: float | None = None,
) -> list[Message]:
    """Push ``messages``, then pull until every reply is in or ``timeout`` seconds passed.

    Parameters
    ----------
    grid : Grid
        The ServerApp's Grid (or a wrapper of it). An object without
        ``push_messages``/``pull_messages`` (an in-process test grid) is
        asked through its ``send_and_receive``.
    messages : Iterable[Message]
        One message per destination node.
    timeout : float or None
        Seconds to wait for replies after the push; ``None`` waits for all.
    first_interval, max_interval : float, optional
        The pause before the first pull (and after each pull that brought
        replies) and the longest pause; in between each pause doubles.
        Default: :func:`pull_intervals`.

    Returns
    -------
    list[Message]
        The replies that came within the timeout, in the order they arrived,
        error replies included.
    """
    default_first, default_max = pull_intervals()
    first_interval = default_first if first_interval is None else first_interval
    max_interval = default_max if max_interval is None else max_interval
    if first_interval <= 0 or max_interval < first_interval:
        raise ValueError(
            f"need 0 < first_interval <= max_interval, got {first_interval} and {max_interval}"
        )
    if not (hasattr(grid, "push_messages") and hasattr(grid, "pull_messages")):
        return list(grid.send_and_receive(messages, timeout=timeout))
    messages = list(messages)
    if not messages:
        return []
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    pushed = {message_id for message_id in grid.push_messages(messages) if message_id}
    # The Grid set each message's id when it pushed it; keep only what the
    # logs need, so that the messages' contents can be freed while we wait.
    destinations = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
    if len(pushed) < len(messages):
        refused = sorted(node for mid, node in destinations.items() if mid not in pushed)
        log(
            WARNING,
            "%d of %d message(s) could not be pushed (to node(s) %s); not waiting for them",
            len(messages) - len(pushed),
            len(messages),
            refused or "unknown",
        )
    del messages
    waiting = set(pushed)
    replies: list[Message] = []
    interval = first_interval
    while waiting:
        stored = REPLIES_STORED.count  # a reply stored after this is pulled without a pause
        arrived = list(grid.pull_messages(waiting))
        replies.extend(arrived)
        waiting.difference_update(reply.metadata.reply_to_message_id for reply in arrived)
        if not waiting:
            break
        interval = first_interval if arrived else min(interval * PULL_INTERVAL_GROWTH, max_interval)
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            break
        REPLIES_STORED.pause(
            stored, interval if deadline is None else min(interval, deadline - now)
        )
    if waiting:
        missing = sorted(
            (destinations.get(message_id, message_id) for message_id in waiting), key=str
        )
        log(
            WARNING,
            "%d of %d node(s) did not reply within %gs: %s",
            len(waiting),
            len(pushed),
            timeout,
            missing,
        )
    log(DEBUG, "%d repl(ies) in %.2fs", len(replies), time.monotonic() - started)
    return replies


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
