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
(:mod:`fedx.flower.stopped_runs`; Flower's SuperNode, 1.41 and 1.42, keeps
such a message, and pushes every reply one message late once its task is
lost).

The changes are made by :func:`fedx.flower.install`, all or none, once
their Flower code is found to be the code they were checked against. Where
it is not, the SuperNode runs as ``flower-supernode`` with one warning; with
``--poll-interval`` or ``--objects-in-flight``, which it cannot honour then,
it refuses to start and says why.

Once Flower's SuperNode has ended (on SIGTERM: it has said goodbye to the
SuperLink and stopped its servers), the process exits at once, its output
flushed, without the interpreter's own finalization: in a container that
finalization could outlast the 10 s that ``docker compose stop``/``down``
wait before SIGKILL.
"""

import argparse
import os
import sys
from collections.abc import Sequence

from fedx import flower
from fedx.flower import objects_in_flight, stopped_runs
from fedx.flower.object_pulls import FIRST_WAIT, LONGEST_WAIT
from fedx.flower.supernode_waits import IDLE_AFTER, IDLE_WAIT, check_waits, run_flower_supernode


def changes(
    poll_interval: float | None = None,
    idle_after: float = IDLE_AFTER,
    ceiling: float = IDLE_WAIT,
    in_flight: int | None = None,
) -> dict[str, dict]:
    """The changes to Flower ``fedx-supernode`` makes with these options, for :func:`fedx.flower.install`.

    The stopped runs always (unless ``FEDX_STOPPED_RUNS=flower``); with a
    ``poll_interval``, the loop's waits (its idle waits growing up to
    ``ceiling`` after ``idle_after`` seconds without a message) and the
    object pulls: an object of a message not there yet is asked for again
    after :data:`~fedx.flower.object_pulls.FIRST_WAIT`, then doubling up to
    the interval or 0.25 s, whichever is longer; with ``in_flight``, the
    objects moved at once.

    Raises
    ------
    ValueError
        When a value is not one the change takes.
    """
    made: dict[str, dict] = {}
    if stopped_runs.wanted():
        made["stopped_runs"] = {}
    if poll_interval is not None:
        check_waits(poll_interval, idle_after, ceiling)
        made["supernode_waits"] = {
            "interval": poll_interval,
            "idle_after": idle_after,
            "ceiling": ceiling,
        }
        made["object_pulls"] = {
            "first": min(poll_interval, FIRST_WAIT),
            "longest": max(poll_interval, LONGEST_WAIT),
        }
    if in_flight is not None:
        made["objects_in_flight"] = {"count": objects_in_flight.check_count(in_flight)}
    return made


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
        try:
            in_flight = ours.objects_in_flight
            if in_flight is None:
                in_flight = objects_in_flight.from_environment()
            made = changes(ours.poll_interval, ours.idle_after, ours.max_poll_interval, in_flight)
            # Options the SuperNode cannot honour under another Flower: it refuses to start.
            asked = ours.poll_interval is not None or in_flight is not None
            flower.install("fedx-supernode", made, refuse=asked)
        except flower.FlowerCodeMismatch as err:
            raise SystemExit(f"fedx-supernode: {err}; use flower-supernode") from None
        except ValueError as err:
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
