"""What the benchmarks share: their command line, /proc readings, ``flwr run`` and exit."""

import argparse
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

Value = TypeVar("Value")

KIB = 1024
#: The checkout: the app (pyproject.toml), its configs and tests, that the benchmarks run.
REPO = Path(__file__).resolve().parents[2]


def run_reporting_errors(main: Callable[[], object]) -> None:
    """Run ``main``, print any error, and exit with status 0: a benchmark reports, it never fails its caller.

    SIGTERM (``timeout``'s signal, at a step's cap) is raised as
    ``KeyboardInterrupt``, so that what was running can say where it stood.
    """

    def stopped(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stopped)
    try:
        main()
    except (Exception, KeyboardInterrupt):  # pylint: disable=broad-exception-caught
        traceback.print_exc()
    sys.exit(0)


def print_error(error: str | None, label: str = "") -> None:
    """A measurement's error, if it has one, indented on the line below its figures."""
    if error:
        print(f"  {label}: {error}" if label else f"  {error}")


def load_text() -> str:
    """The machine's load averages over 1, 5 and 15 minutes, for a report's lines."""
    return "load average " + " ".join(f"{load:.2f}" for load in os.getloadavg())


def rounds_text(arguments: argparse.Namespace) -> str:
    """The rounds of :func:`add_job_options`, and what "per round" means in a report."""
    return (
        f"{arguments.rounds} rounds of {arguments.local_epochs} local epoch(s); "
        f"per round = mean of rounds 2-{arguments.rounds}"
    )


def print_header(header: str) -> None:
    """A table's header line, and a rule under it as wide."""
    print(header)
    print("-" * len(header))


# ----------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------


def benchmark_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser that describes its script by the first paragraph of the script's docstring."""
    return argparse.ArgumentParser(description=(doc or "").split("\n\n", maxsplit=1)[0])


def add_job_options(parser: argparse.ArgumentParser, *, rounds: int, rounds_help: str) -> None:
    """The options of a benchmark that runs the app's job: rounds, local epochs, seed, timeout."""
    parser.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    parser.add_argument(
        "--local-epochs",
        type=int,
        default=None,
        help="local epochs per round (default: the app's, pyproject.toml)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per flwr run")


def check_job_options(
    parser: argparse.ArgumentParser, arguments: argparse.Namespace, app: Path
) -> None:
    """Reject fewer than 2 rounds; take the app's local epochs where none were given."""
    from fedx.compare.plan import app_defaults  # pylint: disable=import-outside-toplevel

    if arguments.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is reported on its own)")
    if arguments.local_epochs is None:
        arguments.local_epochs = int(app_defaults(app)["local-epochs"])


def option_type(
    form: str, parse: Callable[[str], Value], *, valid: Callable[[Value], bool], rule: str
) -> Callable[[str], Value]:
    """An argparse ``type``: ``parse(text)``, refused with the ``form`` it expects when ``parse``
    raises ValueError, and with the ``rule`` too when the value is not ``valid``."""

    def convert(text: str) -> Value:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {form}, got {text!r}") from None
        if not valid(value):
            raise argparse.ArgumentTypeError(f"expected {form} with {rule}, got {text!r}")
        return value

    return convert


def add_list_option(
    parser: argparse.ArgumentParser,
    flag: str,
    parse: Callable[[str], Value],
    defaults: Sequence[str],
    what: str,
    *,
    nargs: str = "+",
) -> None:
    """``flag`` takes values read by ``parse`` (:func:`option_type`); ``defaults`` are written once, as on the command line."""
    parser.add_argument(
        flag,
        nargs=nargs,
        type=parse,
        default=[parse(text) for text in defaults],
        help=f"{what} (default: {' '.join(defaults)})",
    )


def parse_quick(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    quick_help: str,
    **quick_defaults: Any,
) -> argparse.Namespace:
    """Parse ``argv`` with a ``--quick`` option that gives other defaults (explicit options still win)."""
    parser.add_argument("--quick", action="store_true", help=quick_help)
    arguments = parser.parse_args(argv)
    if arguments.quick:
        parser.set_defaults(**quick_defaults)
        arguments = parser.parse_args(argv)
    return arguments


# ----------------------------------------------------------------------
# Memory, as Linux's /proc tells it
# ----------------------------------------------------------------------


def add_app_option(parser: argparse.ArgumentParser) -> None:
    """``--app``: other copies of the app to run in turn (before/after in one benchmark run)."""
    parser.add_argument(
        "--app",
        type=Path,
        action="append",
        default=[],
        help="run this copy of the app instead of this repository (repeatable: in turn)",
    )


def add_memory_limit(parser: argparse.ArgumentParser, over_it: str) -> None:
    """``--max-memory-gib``: what a case may be estimated to need (``over_it``: what befalls one above)."""
    parser.add_argument(
        "--max-memory-gib",
        type=float,
        default=None,
        help=f"{over_it} estimated above this (default: MemAvailable)",
    )


def memory_limit(arguments: argparse.Namespace) -> int | None:
    """The bytes ``--max-memory-gib`` allows, else ``MemAvailable``; None where neither is known."""
    if arguments.max_memory_gib is not None:
        return int(arguments.max_memory_gib * 2**30)
    return available_bytes()


def proc_kib_field(path: str, field: str) -> int | None:
    """A ``kB`` field of a ``/proc`` file (``MemAvailable`` of ``/proc/meminfo``), in bytes.

    None where the file or the field is missing (not Linux).
    """
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * KIB
    except OSError:
        pass
    return None


def available_bytes() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` (Linux), else None."""
    return proc_kib_field("/proc/meminfo", "MemAvailable")


# ----------------------------------------------------------------------
# flwr run
# ----------------------------------------------------------------------


def flwr_run_command(app: Path, federation_config: str, run_config: str) -> list[str]:
    """``flwr run --stream`` of ``app`` on the local simulation, with this venv's ``flwr``."""
    return [
        str(Path(sys.executable).parent / "flwr"),
        "run",
        str(app),
        "--stream",
        "--federation-config",
        federation_config,
        "--run-config",
        run_config,
    ]
