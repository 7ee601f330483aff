"""Change: the SuperNode loop's idle and reply waits (``fedx-supernode --poll-interval``).

What it changes
    The module global ``time`` of ``flwr.supernode.start_client_internal``
    is replaced, in the process that calls :func:`shorten_loop_waits` only, by
    :class:`ShortWaits`: the ``time`` module, whose ``sleep`` changes two
    waits of the loop. ``start_client_internal`` waits ``time.sleep(3)``
    when the SuperLink had no message for the node; ``_push_messages`` checks
    every ``time.sleep(0.5)`` whether the ClientApp's reply is there. The
    idle wait follows an :class:`IdleBackoff`: the interval while the node
    had a message (or connected) within the last ``idle_after`` seconds,
    then longer and longer waits up to a ceiling (Flower's 3 s by default); the reply check
    lasts the interval (at most 0.5 s). To know when the node last had a
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
    took 1.78 s against 8.35 s with Flower's executor and polls, and the
    secure stage 6.1 s against 65.4 s (docs/results.md, Run 4, with the
    other cuts of that run). Polling that often all the time cost an idle
    federation: the README's fast setup (3 SuperNodes, 0.1 s) used 53% of a
    core doing nothing, 20-28% of it in the SuperLink answering the
    SuperNodes' pulls. Backing off after ``idle_after`` seconds without a
    message keeps every exchange of a run on the short interval (a node's
    next message comes 1-3 s after its reply in the fast setup, a few
    seconds at most under load) and brings an idle node back to Flower's
    one pull per 3 s (``benchmarks/idle_federation.py``).

Checked against
    flwr 1.41.0 (:data:`fedx.flower.CHECKED_FLWR`).

Under another Flower
    :func:`shorten_loop_waits` reads the loop module's source and raises
    ``RuntimeError`` when it has no ``time.sleep(3)`` or
    ``time.sleep(0.5)`` to shorten, or no ``_push_messages`` to wrap:
    ``fedx-supernode --poll-interval`` refuses to start and says to use
    ``flower-supernode``.
"""

import functools
import inspect
import sys
import time
from collections.abc import Sequence

import flwr.supernode.start_client_internal as supernode_loop

from fedx.flower import IDLE_AFTER, SUPERNODE_IDLE_WAIT, IdleBackoff

#: The waits of Flower 1.41's SuperNode loop that the interval replaces.
IDLE_WAIT = SUPERNODE_IDLE_WAIT
REPLY_WAIT = 0.5

#: The Flower code this change relies on, with the fingerprint of its source
#: (SHA-256, first 16 hex digits) as checked: tests/test_flower_changes.py.
FLOWER_CODE = {
    "flwr.supernode.start_client_internal:start_client_internal": "9e89a6eb68fbec68",
    "flwr.supernode.start_client_internal:_push_messages": "00bb86faffdec114",
}
#: What to re-check in that code when it changes.
RECHECK = (
    "that the loop still sleeps time.sleep(3) when the SuperLink has no message and "
    "time.sleep(0.5) between its checks for the ClientApp's reply, through the module's "
    "own `time`, and sleeps those lengths nowhere else; and that it calls the module "
    "global _push_messages once for each message it received, returning once the reply is "
    "sent (or given up)"
)


class ShortWaits:
    """``time`` for Flower's SuperNode loop: its idle wait follows ``backoff``, its reply check lasts the interval."""

    def __init__(self, backoff: IdleBackoff) -> None:
        self.backoff = backoff
        #: When the node last had a message (``time.monotonic``): its first idle wait (it has
        #: just connected), then each reply sent.
        self.last_message: float | None = None

    @property
    def interval(self) -> float:
        """The idle wait after a message."""
        return self.backoff.interval

    def message_done(self) -> None:
        """The node has sent its reply to a message: short polls again."""
        self.last_message = time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Sleep, changing the loop's idle (3 s) and reply (0.5 s) waits."""
        if seconds == IDLE_WAIT:
            now = time.monotonic()
            if self.last_message is None:
                self.last_message = now
            seconds = self.backoff.wait(now - self.last_message)
        elif seconds == REPLY_WAIT:
            seconds = min(REPLY_WAIT, self.interval)
        time.sleep(seconds)

    def __getattr__(self, name: str):
        return getattr(time, name)


def shorten_loop_waits(
    interval: float, idle_after: float = IDLE_AFTER, ceiling: float = IDLE_WAIT
) -> ShortWaits:
    """Make this process's Flower SuperNode loop wait ``interval`` seconds when idle after a message.

    Once the node has had no message for ``idle_after`` seconds its idle
    waits grow to ``ceiling`` (:class:`IdleBackoff`). Returns the loop's new ``time``.

    Raises
    ------
    ValueError
        When ``interval`` is not in (0, 3] seconds, ``ceiling`` not in
        [``interval``, 3] or ``idle_after`` negative.
    RuntimeError
        When Flower's SuperNode loop does not have the waits this replaces.
    """
    if not 0 < interval <= IDLE_WAIT:
        raise ValueError(f"the poll interval must be in (0, {IDLE_WAIT}] s, got {interval}")
    if not interval <= ceiling <= IDLE_WAIT:
        raise ValueError(
            f"the longest idle wait must be in [{interval}, {IDLE_WAIT}] s (from the poll "
            f"interval to Flower's), got {ceiling}"
        )
    backoff = IdleBackoff(interval, idle_after, ceiling)
    source = inspect.getsource(supernode_loop)
    if f"time.sleep({IDLE_WAIT})" not in source or f"time.sleep({REPLY_WAIT})" not in source:
        raise RuntimeError(
            "this Flower's SuperNode loop has no time.sleep(3) / time.sleep(0.5) to shorten "
            "(fedx-supernode is written for flwr 1.41); use flower-supernode"
        )
    push_messages = getattr(supernode_loop, "_push_messages", None)
    if not callable(push_messages):
        raise RuntimeError(
            "this Flower's SuperNode loop has no _push_messages (fedx-supernode is written for "
            "flwr 1.41); use flower-supernode"
        )
    waits = ShortWaits(backoff)
    if getattr(push_messages, "__fedx_idle_clock__", False):  # ours, from an earlier call
        push_messages = push_messages.__wrapped__

    @functools.wraps(push_messages)
    def push_then_poll_often(*args, **kwargs):
        try:
            return push_messages(*args, **kwargs)
        finally:
            waits.message_done()

    push_then_poll_often.__fedx_idle_clock__ = True  # type: ignore[attr-defined]
    supernode_loop._push_messages = push_then_poll_often  # pylint: disable=protected-access
    supernode_loop.time = waits  # type: ignore[assignment]
    return waits


def run_flower_supernode(arguments: Sequence[str]) -> None:
    """Run Flower's ``flower-supernode`` command in this process with ``arguments``."""
    # pylint: disable=import-outside-toplevel
    from flwr.supernode.cli import flower_supernode

    sys.argv = [sys.argv[0], *arguments]
    flower_supernode()
