"""``fedx-compare``: several methods × seeds × settings in Flower simulation, one table.

Examples
--------
FedAvg against FedMR on the digits settings, three seeds each::

    fedx-compare configs/digits-cnn-dir0.1.toml configs/digits-cnn-iid.toml \\
        --methods fedavg,fedmr --seeds 0,1,2 --out comparisons/digits

Running the same command again skips the finished runs and rewrites the
report; ``--report-only`` only rewrites the report. While a run goes, one
line says its round of R, its latest accuracy and the grid's time so far and
left (:mod:`fedx.compare.progress`): rewritten in place on a terminal, a
plain line every ``--progress-interval`` seconds in a log.
"""

import argparse
import os
import shutil
import signal
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fedx
from fedx.compare.plan import Setting, app_defaults, comparison_methods, default_methods, plan_runs
from fedx.compare.progress import GridProgress
from fedx.compare.report import SUMMARY_MARKDOWN, write_report
from fedx.compare.runner import ComparisonRunner, RunOutcome, finished_record
from fedx.config import ConfigError
from fedx.registry import comma_list


def default_app_dir() -> Path | None:
    """The fedx project folder when fedx runs from a checkout (``pip install -e .``)."""
    candidate = Path(fedx.__file__).resolve().parents[1]
    return candidate if (candidate / "pyproject.toml").is_file() else None


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` with a TOML value (``3``, ``0.1``, ``true``, ``"x"``); else a string."""
    key, separator, value = text.partition("=")
    if not separator or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        parsed = tomllib.loads(f"value = {value}")["value"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key.strip(), parsed


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` as integers."""
    try:
        seeds = [int(item) for item in comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"seeds are comma-separated integers, got {text!r}"
        ) from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"seeds must be distinct integers >= 0, got {text!r}")
    return seeds


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedx-compare",
        description="Compare federated-learning methods in Flower simulation: every "
        "setting x method x seed is one `flwr run`; writes results.md, results.csv, "
        "runs.csv and one learning-curve plot per setting.",
    )
    parser.add_argument("settings", nargs="+", type=Path, help="run-config TOML files")
    parser.add_argument(
        "--methods",
        default=",".join(default_methods()),
        help=f"comma-separated, from {', '.join(comparison_methods())} (default: %(default)s)",
    )
    parser.add_argument(
        "--seeds",
        type=parse_seeds,
        default=[0, 1, 2],
        help="comma-separated seeds (default: 0,1,2)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="output folder; running again into it skips finished runs",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        type=parse_override,
        default=[],
        metavar="KEY=VALUE",
        help="run-config value for every run, e.g. num-server-rounds=5",
    )
    parser.add_argument(
        "--num-supernodes",
        type=int,
        help="simulated clients (default: each setting's min-available-nodes)",
    )
    parser.add_argument(
        "--client-cpus",
        type=float,
        default=1.0,
        help="CPUs per simulated ClientApp (default: %(default)s)",
    )
    parser.add_argument(
        "--client-gpus",
        type=float,
        default=0.0,
        help="GPUs per simulated ClientApp, e.g. 0.25 (default: %(default)s)",
    )
    parser.add_argument(
        "--target",
        type=float,
        help="accuracy for 'rounds to target' (default: 95%% of the "
        "best method's mean final accuracy in each setting)",
    )
    parser.add_argument(
        "--run-timeout",
        type=float,
        default=6 * 3600,
        help="seconds one run may take (default: %(default)g)",
    )
    parser.add_argument(
        "--app",
        type=Path,
        default=default_app_dir(),
        help="the Flower app folder (default: this fedx checkout)",
    )
    parser.add_argument(
        "--progress-interval",
        type=float,
        default=60.0,
        help="when the output is not a terminal: seconds between two lines on the running "
        "run's round, accuracy and the grid's time left (default: %(default)g; on a "
        "terminal one line is updated in place)",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="only rewrite the report from the finished runs"
    )
    return parser


def _client_resources(args: argparse.Namespace) -> str:
    resources = f"client-resources-num-cpus={args.client_cpus:g}"
    if args.client_gpus:
        resources += f" client-resources-num-gpus={args.client_gpus:g}"
    return resources


def _progress(total: int) -> Callable[[int, RunOutcome], None]:
    def report(index: int, outcome: RunOutcome) -> None:
        line = f"[{index + 1}/{total}] {outcome.run.label}: "
        if outcome.status == "failed":
            line += (
                f"FAILED after {outcome.wall_seconds:.0f} s: {outcome.detail} "
                f"(log: {outcome.run.directory / 'flwr-run.log'})"
            )
        elif outcome.status == "diverged":
            line += f"DIVERGED after {outcome.wall_seconds:.0f} s: {outcome.detail}"
        elif outcome.status == "skipped":
            line += f"{outcome.detail}, skipped"
        else:
            line += f"finished in {outcome.wall_seconds:.0f} s"
        print(line, flush=True)

    return report


def _stop_cleanly_on_signals() -> None:
    """Turn SIGTERM and SIGINT into exceptions, so the SuperLink and its runs are stopped.

    A process started in the background (``nohup ... &``) inherits SIGINT
    as ignored, and SIGTERM would end it without cleaning up: both would
    leave the SuperLink and a running simulation behind.
    """

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


def main(argv: list[str] | None = None) -> int:
    """Plan, run and report; exit status 0 when every run finished or diverged, 1 otherwise, 2 on bad input."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.app is None:
        parser.error("cannot find the fedx app folder: pass --app")
    try:
        defaults = app_defaults(args.app)
        settings = [Setting.load(path) for path in args.settings]
        if len({s.name for s in settings}) != len(settings):
            raise ConfigError("two settings have the same file name")
        methods = list(comma_list(args.methods))
        runs = plan_runs(
            settings,
            methods,
            args.seeds,
            dict(args.overrides),
            defaults,
            args.out.resolve(),
            args.num_supernodes,
        )
        for run in runs:
            finished_record(run)  # refuses, before anything runs, to mix in other settings
    except ConfigError as error:
        print(f"fedx-compare: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    _stop_cleanly_on_signals()
    outcomes: list[RunOutcome] = []
    if not args.report_only:
        print(
            f"fedx-compare: {len(runs)} runs ({len(settings)} settings x {len(methods)} "
            f"methods x {len(args.seeds)} seeds) into {args.out.resolve()}",
            flush=True,
        )
        state_dir = args.out.resolve() / f".superlink-{os.getpid()}"
        try:
            with ComparisonRunner(
                args.app.resolve(), state_dir, _client_resources(args), args.run_timeout
            ) as runner:
                progress = GridProgress(runs, interval=args.progress_interval)
                outcomes = runner.run_all(runs, _progress(len(runs)), progress)
        except KeyboardInterrupt:
            print(
                "fedx-compare: interrupted; the same command resumes after the finished runs",
                file=sys.stderr,
                flush=True,
            )
            return 130
        finally:
            shutil.rmtree(state_dir, ignore_errors=True)  # the runs' logs are in their folders
    rows, paths = write_report(args.out, runs, args.target)
    if paths:
        print(
            f"fedx-compare: {len(rows)} table rows; wrote {', '.join(str(p) for p in paths)}",
            flush=True,
        )
        print((args.out / SUMMARY_MARKDOWN).read_text(), flush=True)
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        print(f"fedx-compare: {len(failed)} of {len(runs)} runs failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
