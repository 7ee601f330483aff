"""``fedx-supernode``: Flower's SuperNode with a shorter idle poll.

Flower 1.41's SuperNode asks the SuperLink for a message, and when there is
none it waits 3 s before asking again (``time.sleep(3)`` in
``flwr.supernode.start_client_internal``); while its ClientApp works it
checks for the reply every 0.5 s. Neither is a flag or an environment
variable. Between two exchanges every node is idle, so every exchange
starts up to 3 s late on each node (a round of secure recombination has
eight exchanges).

``fedx-supernode --poll-interval SECONDS [flower-supernode options]`` runs
``flower-supernode`` unchanged except for those two waits, which become
``SECONDS`` (the reply check at most 0.5 s), and so does the first wait
before it asks the SuperLink again for an object of a message that is not
there yet (Flower: 1 s, :mod:`fedx.object_pulls`); without
``--poll-interval`` it is ``flower-supernode``. ``--objects-in-flight N``
(or ``FEDX_OBJECTS_IN_FLIGHT=N``) makes it pull and push N objects of a
message at once (:mod:`fedx.flower.objects_in_flight`; Flower: 2). It does this at run time, in
its own process, by giving that module a ``time`` whose ``sleep`` shortens
exactly those waits; Flower's installed files are not touched. It refuses
to start when the module no longer has those waits (another Flower).

The cost: an idle SuperNode sends the SuperLink one pull request per
interval instead of one per 3 s, so N idle SuperNodes cost the SuperLink N /
interval requests per second (``benchmarks/deployment.py`` measures the
SuperLink's CPU time for it).
"""

import argparse
import inspect
import sys
import time
from collections.abc import Sequence

import flwr.supernode.start_client_internal as supernode_loop

from fedx.flower import objects_in_flight
from fedx.object_pulls import retry_object_pulls_after

#: The waits of Flower 1.41's SuperNode loop that the interval replaces.
IDLE_WAIT = 3
REPLY_WAIT = 0.5


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


def shorten_waits(interval: float) -> None:
    """Make this process's Flower SuperNode loop wait ``interval`` seconds when idle.

    Its first wait for an object of a message that is not there yet becomes
    ``interval`` too (at most Flower's 1 s).

    Raises
    ------
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
    retry_object_pulls_after(interval)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``fedx-supernode``."""
    # pylint: disable=import-outside-toplevel
    from flwr.supernode.cli import flower_supernode

    parser = argparse.ArgumentParser(
        prog="fedx-supernode",
        add_help=False,
        description="flower-supernode whose idle poll of the SuperLink waits --poll-interval "
        "seconds instead of 3; every other option is flower-supernode's.",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        metavar="SECONDS",
        help=f"idle wait between two pulls (Flower's: {IDLE_WAIT} s)",
    )
    parser.add_argument(
        "--objects-in-flight",
        type=int,
        metavar="N",
        help="objects of a message pulled or pushed at once (Flower's: 2, at most the cores; "
        f"default: ${objects_in_flight.VARIABLE} if set)",
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, flower_args = parser.parse_known_args(argv)
    if "-h" in argv or "--help" in argv:
        parser.print_help()
        print()
    else:
        try:
            if ours.poll_interval is not None:
                shorten_waits(ours.poll_interval)
            in_flight = ours.objects_in_flight
            if in_flight is None:
                in_flight = objects_in_flight.from_environment()
            if in_flight is not None:
                objects_in_flight.set_objects_in_flight(in_flight)
        except (ValueError, RuntimeError) as err:
            raise SystemExit(f"fedx-supernode: {err}") from None
    sys.argv = [sys.argv[0], *flower_args]
    flower_supernode()


if __name__ == "__main__":
    main()
