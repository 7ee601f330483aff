"""Change: the SuperNode loop's idle and reply waits (``fedx-supernode --poll-interval``).

What it changes
    The module global ``time`` of ``flwr.supernode.start_client_internal``
    is replaced, in ``fedx-supernode``'s process only (:func:`apply`, through
    :func:`fedx.flower.install`), by
    :class:`ShortWaits`: the ``time`` module, whose ``sleep`` changes two
    waits of the loop. ``start_client_internal`` waits ``time.sleep(3)``
    when the SuperLink had no message for the node; ``_push_messages`` checks
    every ``time.sleep(0.5)`` whether the ClientApp's reply is there. The
    idle wait follows an :class:`IdleBackoff`: the interval while the node
    had a message (or connected) within the last ``idle_after`` seconds,
    then longer and longer waits up to a ceiling (Flower's 3 s by default); the reply check
    lasts the interval (at most 0.5 s), and ends as soon as the ClientApp
    stores its reply or an object of it on the node: the NodeState's
    ``store_message_and_object_tree`` and ``store_object``, through which the
    Runtime API stores what a ClientApp pushes, are wrapped on the node's
    state object (``setattr``; the class is not touched) to wake it. (The
    same check also waits for each of the reply's objects before it goes
    on to the SuperLink.) To know when the node last had a
    message, the loop's module global ``_push_messages``, which the loop
    calls once for every message it received and returns once the reply is
    sent, is wrapped: Flower's function (in ``fedx-supernode``, the one of
    :mod:`fedx.flower.stopped_runs`, which also returns when it drops the
    message) runs as before, and its return restarts the idle clock. Every
    other sleep is the ``time`` module's. Flower's installed files are not
    touched.

Why
    Neither wait is a flag or an environment variable. Between two
    exchanges every node is idle, so every exchange started up to 3 s late
    on each node (a round of secure recombination has eight exchanges). With
    the warm executor and a 0.1 s poll a round of the deployment benchmark
    and the secure stage take a fraction of the time they take with
    Flower's executor and polls (docs/results.md, "What each part of the fast setup
    gives"; docs/results-record.md, "Run 4: where a warm message's seconds
    went, and the fixed costs cut", with the other cuts of that run).
    Polling that often all the time cost an idle federation: the README's
    fast setup (3 SuperNodes, 0.1 s) kept a good part of a core busy doing
    nothing, much of it in the SuperLink answering the SuperNodes' pulls
    (docs/results-record.md, "Idle federations: the polls back off").
    Backing off after ``idle_after`` seconds without a message keeps every
    exchange of a run on the short interval (in the fast setup a node's
    next message comes well within ``idle_after`` of its reply) and brings
    an idle node back to Flower's
    one pull per 3 s (``benchmarks/idle_federation.py``). A reply that
    arrives between two checks of the interval waited half of it on average
    (0.05 s of every exchange at 0.1 s); woken, it goes on at once.

Checked against
    flwr 1.41.0 and 1.42.0 (:data:`fedx.flower.CHECKED_FLWR`): the same code.
    ``flower-supernode`` has no flag or setting for either wait.

Under another Flower
    Where the loop, its push or the node state's stores are not the code
    checked, :func:`fedx.flower.install` makes none of ``fedx-supernode``'s
    changes, and ``fedx-supernode --poll-interval`` refuses to start, naming
    the code that differs (use ``flower-supernode``).
"""

import functools
import importlib
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from fedx.flower import IDLE_AFTER, SUPERNODE_IDLE_WAIT, IdleBackoff, replace
from fedx.flower._fingerprints import flower_code

#: Flower's SuperNode loop (the module whose globals this changes).
LOOP = "flwr.supernode.start_client_internal"
#: The waits of Flower's SuperNode loop (1.41, 1.42) that the interval replaces.
IDLE_WAIT = SUPERNODE_IDLE_WAIT
REPLY_WAIT = 0.5
#: The node state's methods through which the Runtime API stores what a ClientApp pushes.
STORES = ("store_message_and_object_tree", "store_object")

#: The Flower code this change relies on (its fingerprints: fedx.flower._fingerprints).
FLOWER_CODE = flower_code(
    "flwr.supernode.start_client_internal:start_client_internal",
    "flwr.supernode.start_client_internal:_push_messages",
    "flwr.supernode.nodestate.in_memory_nodestate:InMemoryNodeState.store_message_and_object_tree",
    "flwr.supercore.corestate.in_memory_corestate:InMemoryCoreState.store_object",
    "flwr.supernode.servicer.runtime.runtime_handlers:push_messages",
    "flwr.supernode.servicer.runtime.runtime_handlers:push_object",
)
#: What to re-check in that code when it changes.
RECHECK = (
    "that the loop still sleeps time.sleep(3) when the SuperLink has no message and "
    "time.sleep(0.5) between its checks for the ClientApp's reply, through the module's "
    "own `time`, and sleeps those lengths nowhere else; and that it calls the module "
    "global _push_messages once for each message it received, returning once the reply is "
    "sent (or given up), with state= the node's state; and that the Runtime API stores a "
    "ClientApp's reply with state.store_message_and_object_tree and its objects with "
    "state.store_object, on that same state object"
)


class ShortWaits:
    """``time`` for Flower's SuperNode loop: its idle wait follows ``backoff``, its reply check lasts the interval."""

    def __init__(self, backoff: IdleBackoff) -> None:
        self.backoff = backoff
        #: When the node last had a message (``time.monotonic``): its first idle wait (it has
        #: just connected), then each reply sent.
        self.last_message: float | None = None
        #: Set when a ClientApp stores a reply or an object on the node (:meth:`watch`).
        self.stored = threading.Event()

    @property
    def interval(self) -> float:
        """The idle wait after a message."""
        return self.backoff.interval

    def message_done(self) -> None:
        """The node has sent its reply to a message: short polls again."""
        self.last_message = time.monotonic()

    def watch(self, state: Any) -> None:
        """End the reply waits when a ClientApp stores a reply or an object in ``state``.

        Wraps the state object's :data:`STORES` (once; ``None`` or a state
        without them is left as it is).
        """
        for name in STORES:
            store = getattr(state, name, None)
            if store is None or getattr(store, "__fedx_wakes__", False):
                continue

            @functools.wraps(store)
            def store_then_wake(*args, __store=store, **kwargs):
                try:
                    return __store(*args, **kwargs)
                finally:
                    self.stored.set()

            store_then_wake.__fedx_wakes__ = True  # type: ignore[attr-defined]
            setattr(state, name, store_then_wake)

    def sleep(self, seconds: float) -> None:
        """Sleep, changing the loop's idle (3 s) and reply (0.5 s) waits."""
        if seconds == IDLE_WAIT:
            now = time.monotonic()
            if self.last_message is None:
                self.last_message = now
            seconds = self.backoff.wait(now - self.last_message)
        elif seconds == REPLY_WAIT:
            # The loop checks again right after: what was stored before the clear is seen then.
            if self.stored.wait(min(REPLY_WAIT, self.interval)):
                self.stored.clear()
            return
        time.sleep(seconds)

    def __getattr__(self, name: str):
        return getattr(time, name)


def supernode_loop() -> Any:
    """Flower's SuperNode loop module (imported on first use)."""
    return importlib.import_module(LOOP)


def check_waits(
    interval: float, idle_after: float = IDLE_AFTER, ceiling: float = IDLE_WAIT
) -> None:
    """Raise ``ValueError`` unless the waits are ones :func:`shorten_loop_waits` takes."""
    if not 0 < interval <= IDLE_WAIT:
        raise ValueError(f"the poll interval must be in (0, {IDLE_WAIT}] s, got {interval}")
    if not interval <= ceiling <= IDLE_WAIT:
        raise ValueError(
            f"the longest idle wait must be in [{interval}, {IDLE_WAIT}] s (from the poll "
            f"interval to Flower's), got {ceiling}"
        )
    IdleBackoff(interval, idle_after, ceiling)


def shorten_loop_waits(
    interval: float, idle_after: float = IDLE_AFTER, ceiling: float = IDLE_WAIT
) -> ShortWaits:
    """Make this process's Flower SuperNode loop wait ``interval`` seconds when idle after a message.

    Once the node has had no message for ``idle_after`` seconds its idle
    waits grow to ``ceiling`` (:class:`IdleBackoff`). Returns the loop's new
    ``time``. :func:`apply` is the change as :func:`fedx.flower.install` makes it.

    Raises
    ------
    ValueError
        When ``interval`` is not in (0, 3] seconds, ``ceiling`` not in
        [``interval``, 3] or ``idle_after`` negative.
    """
    check_waits(interval, idle_after, ceiling)
    loop = supernode_loop()
    waits = ShortWaits(IdleBackoff(interval, idle_after, ceiling))
    push_messages = loop._push_messages  # pylint: disable=protected-access
    if getattr(push_messages, "__fedx_idle_clock__", False):  # ours, from an earlier call
        push_messages = push_messages.__wrapped__

    @functools.wraps(push_messages)
    def push_then_poll_often(*args, **kwargs):
        waits.watch(kwargs.get("state"))
        try:
            return push_messages(*args, **kwargs)
        finally:
            waits.message_done()

    push_then_poll_often.__fedx_idle_clock__ = True  # type: ignore[attr-defined]
    replace(loop, "_push_messages", push_then_poll_often)
    replace(loop, "time", waits)
    return waits


def apply(interval: float, idle_after: float = IDLE_AFTER, ceiling: float = IDLE_WAIT):
    """The change (:func:`shorten_loop_waits`), as :func:`fedx.flower.install` makes it.

    Returns what undoes it.
    """
    loop = supernode_loop()
    before = {name: getattr(loop, name) for name in ("_push_messages", "time")}
    shorten_loop_waits(interval, idle_after, ceiling)

    def undo() -> None:
        for name, value in before.items():
            setattr(loop, name, value)

    return undo


def run_flower_supernode(arguments: Sequence[str]) -> None:
    """Run Flower's ``flower-supernode`` command in this process with ``arguments``."""
    # pylint: disable=import-outside-toplevel
    from flwr.supernode.cli import flower_supernode

    sys.argv = [sys.argv[0], *arguments]
    flower_supernode()
