"""Change: the SuperNode loop's idle and reply waits (``fedx-supernode --poll-interval``).

What it changes
    The module global ``time`` of ``flwr.supernode.start_client_internal``
    is replaced, in the process that calls :func:`shorten_loop_waits` only, by
    :class:`ShortWaits`: the ``time`` module, whose ``sleep`` shortens two
    waits of the loop. ``start_client_internal`` waits ``time.sleep(3)``
    when the SuperLink had no message for the node; ``_push_messages`` checks
    every ``time.sleep(0.5)`` whether the ClientApp's reply is there. Both
    become the interval (the reply check at most 0.5 s); every other sleep
    is the ``time`` module's. Flower's installed files are not touched.

Why
    Neither wait is a flag or an environment variable. Between two
    exchanges every node is idle, so every exchange started up to 3 s late
    on each node (a round of secure recombination has eight exchanges). With
    the warm executor and a 0.1 s poll a round of the deployment benchmark
    took 1.78 s against 8.35 s with Flower's executor and polls, and the
    secure stage 6.1 s against 65.4 s (docs/results.md, Run 4, with the
    other cuts of that run). The cost: an idle SuperNode asks the SuperLink
    for a message once per interval instead of once per 3 s, so N idle
    SuperNodes cost the SuperLink N / interval requests per second
    (``benchmarks/deployment.py --idle-seconds`` measures the SuperLink's
    CPU time for it).

Checked against
    flwr 1.41.0 (:data:`fedx.flower.CHECKED_FLWR`).

Under another Flower
    :func:`shorten_loop_waits` reads the loop module's source and raises
    ``RuntimeError`` when it has no ``time.sleep(3)`` or
    ``time.sleep(0.5)`` to shorten: ``fedx-supernode --poll-interval``
    refuses to start and says to use ``flower-supernode``.
"""

import inspect
import sys
import time
from collections.abc import Sequence

import flwr.supernode.start_client_internal as supernode_loop

#: The waits of Flower 1.41's SuperNode loop that the interval replaces.
IDLE_WAIT = 3
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
    "own `time`, and sleeps those lengths nowhere else"
)


class ShortWaits:
    """``time`` for Flower's SuperNode loop, whose idle and reply waits last ``interval``."""

    def __init__(self, interval: float) -> None:
        self.interval = interval

    def sleep(self, seconds: float) -> None:
        """Sleep, shortening the loop's idle (3 s) and reply (0.5 s) waits."""
        if seconds == IDLE_WAIT:
            seconds = self.interval
        elif seconds == REPLY_WAIT:
            seconds = min(REPLY_WAIT, self.interval)
        time.sleep(seconds)

    def __getattr__(self, name: str):
        return getattr(time, name)


def shorten_loop_waits(interval: float) -> None:
    """Make this process's Flower SuperNode loop wait ``interval`` seconds when idle.

    Raises
    ------
    ValueError
        When ``interval`` is not in (0, 3] seconds.
    RuntimeError
        When Flower's SuperNode loop does not have the waits this replaces.
    """
    if not 0 < interval <= IDLE_WAIT:
        raise ValueError(f"the poll interval must be in (0, {IDLE_WAIT}] s, got {interval}")
    source = inspect.getsource(supernode_loop)
    if f"time.sleep({IDLE_WAIT})" not in source or f"time.sleep({REPLY_WAIT})" not in source:
        raise RuntimeError(
            "this Flower's SuperNode loop has no time.sleep(3) / time.sleep(0.5) to shorten "
            "(fedx-supernode is written for flwr 1.41); use flower-supernode"
        )
    supernode_loop.time = ShortWaits(interval)  # type: ignore[assignment]


def run_flower_supernode(arguments: Sequence[str]) -> None:
    """Run Flower's ``flower-supernode`` command in this process with ``arguments``."""
    # pylint: disable=import-outside-toplevel
    from flwr.supernode.cli import flower_supernode

    sys.argv = [sys.argv[0], *arguments]
    flower_supernode()
