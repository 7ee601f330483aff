"""``fedx-supernode``: Flower's SuperNode with a shorter idle poll, and nothing left of stopped runs.

``fedx-supernode --poll-interval SECONDS [flower-supernode options]`` runs
``flower-supernode`` unchanged except for two waits of its loop: the 3 s it
waits when the SuperLink has no message for the node, and the 0.5 s between
its checks for the ClientApp's reply, become ``SECONDS`` (the reply check at
most 0.5 s; :mod:`fedx.flower.supernode_waits` says how, why, and what
happens under another Flower). Once the node has had no message for
``--idle-after`` seconds (default 10) its idle waits grow, each as long as
it has been idle beyond that, up to ``--max-poll-interval`` (default
Flower's 3 s): an idle node costs the SuperLink one pull per 3 s, and a
message after a long idle spell waits at most that. It asks the SuperLink
again for an object of a message that is not there yet after 20 ms, then
doubling up to the interval or 0.25 s (Flower: 1 s, then doubling to 10 s;
:mod:`fedx.flower.object_pulls`). ``--objects-in-flight N`` (or
``FEDX_OBJECTS_IN_FLIGHT=N``) makes it pull and push N objects of a message
at once (:mod:`fedx.flower.objects_in_flight`; Flower: 2).

With or without options, a run stopped while the SuperNode works for it
leaves nothing behind: its messages are dropped, their ClientApp tasks
ended, and each reply goes to its own message
(:mod:`fedx.flower.stopped_runs`; Flower 1.41's SuperNode keeps such a
message, and pushes every reply one message late once its task is lost).

Once Flower's SuperNode has ended (on SIGTERM: it has said goodbye to the
SuperLink and stopped its servers), the process exits at once, its output
flushed, without the interpreter's own finalization: that took another 4.5 s
on the 2-core machine, and more in a container, where it ran past the 10 s
that ``docker compose stop``/``down`` wait before SIGKILL.
"""

import argparse
import os
import sys
from collections.abc import Sequence

from fedx.flower import objects_in_flight, stopped_runs
from fedx.flower.object_pulls import FIRST_WAIT, LONGEST_WAIT, retry_object_pulls_after
from fedx.flower.supernode_waits import (
    IDLE_AFTER,
    IDLE_WAIT,
    run_flower_supernode,
    shorten_loop_waits,
)


def shorten_waits(
    interval: float, idle_after: float = IDLE_AFTER, ceiling: float = IDLE_WAIT
) -> None:
    """Make this process's Flower SuperNode loop wait ``interval`` seconds when idle after a message.

    After ``idle_after`` seconds without one its idle waits grow up to
    ``ceiling``. It asks again for an object of a message that is not there
    yet after :data:`~fedx.flower.object_pulls.FIRST_WAIT`, then doubling up
    to ``interval`` or 0.25 s, whichever is longer. Raises as
    :func:`~fedx.flower.supernode_waits.shorten_loop_waits` does.
    """
    shorten_loop_waits(interval, idle_after, ceiling)
    retry_object_pulls_after(min(interval, FIRST_WAIT), max(interval, LONGEST_WAIT))


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``fedx-supernode`` (``argv``: its arguments, when called from Python).

    From the command line (``argv`` None) the process exits as soon as
    Flower's SuperNode has ended (see the module's notes).
    """
    parser = argparse.ArgumentParser(
        prog="fedx-supernode",
        add_help=False,
        description="flower-supernode on which a stopped run leaves nothing behind, whose idle "
        "poll of the SuperLink waits --poll-interval seconds instead of 3; every other option is "
        "flower-supernode's.",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        metavar="SECONDS",
        help=f"idle wait between two pulls after a message (Flower's: {IDLE_WAIT} s)",
    )
    parser.add_argument(
        "--idle-after",
        type=float,
        default=IDLE_AFTER,
        metavar="SECONDS",
        help="with --poll-interval: how long after its last message the node keeps pulling "
        "that often; then its waits grow up to --max-poll-interval (default: %(default)g; "
        "inf: never)",
    )
    parser.add_argument(
        "--max-poll-interval",
        type=float,
        default=IDLE_WAIT,
        metavar="SECONDS",
        help="with --poll-interval: the longest idle wait (default: Flower's %(default)g s)",
    )
    parser.add_argument(
        "--objects-in-flight",
        type=int,
        metavar="N",
        help="objects of a message pulled or pushed at once (Flower's: 2, at most the cores; "
        f"default: ${objects_in_flight.VARIABLE} if set)",
    )
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, flower_args = parser.parse_known_args(argv)
    if "-h" in argv or "--help" in argv:
        parser.print_help()
        print()
    else:
        # First: the idle clock of shorten_waits then wraps the stopped-runs push, which returns
        # once per message received, replied to or dropped (the clock restarts either way).
        stopped_runs.install()
        try:
            if ours.poll_interval is not None:
                shorten_waits(ours.poll_interval, ours.idle_after, ours.max_poll_interval)
            in_flight = ours.objects_in_flight
            if in_flight is None:
                in_flight = objects_in_flight.from_environment()
            if in_flight is not None:
                objects_in_flight.set_objects_in_flight(in_flight)
        except (ValueError, RuntimeError) as err:
            raise SystemExit(f"fedx-supernode: {err}") from None
    if not from_command_line:  # called from Python (tests): Flower's exit as it comes
        run_flower_supernode(flower_args)
        return
    code: int | str | None = 0
    try:
        run_flower_supernode(flower_args)
    except SystemExit as ended:
        code = ended.code
    _exit_now(code)


def _exit_now(code: int | str | None) -> None:
    """Exit with ``code`` as ``sys.exit`` would, without the interpreter's finalization."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


if __name__ == "__main__":
    main()
