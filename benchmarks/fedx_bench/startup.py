"""Measure the start-up of the default job: seconds from `flwr run .` to its round 1.

The default job is the README's: ``flwr run . --stream --federation-config
"num-supernodes=10 client-resources-num-cpus=1"`` with pyproject.toml's run
config (FedMR on digits, 20 rounds, seed 0), against a simulation SuperLink
this script starts on a free port (``fedx.deploy.local``). For every run it
reports:

* **to round 1**: seconds from starting ``flwr run`` until its streamed log
  shows ``[ROUND 1/...]``: Ray's start, the ServerApp's imports and set-up,
  the query that lists the clients (which starts the ClientApp workers);
* **CPU to round 1**: the processor seconds spent in that time by the
  processes started for the run (``flwr run`` itself, the simulation, Ray
  and its workers; not the SuperLink, which was there before). Unlike wall
  time, it hardly moves when other work shares the machine;
* **round 1** and **rounds 2+**: ``round-seconds`` of ``metrics.json``
  (round 1 includes the first ClientApp calls of every worker);
* **whole run**: wall time of ``flwr run``;
* **accuracy**: the final central accuracy, which must not change between
  versions for the same seed (0.9583333 for the default job).

The runs share one partition cache (``FEDX_CACHE_DIR``, a fresh temporary
folder): the first run computes the partitions and the digits split, the
later ones read them, as every run after a user's first does.

``--app`` runs other copies of the app instead of this repository (other
versions of fedx, for a before/after comparison: ``git archive <commit> |
tar -x -C <folder>``), each run of each app in turn, so that a drift of the
machine's load touches all of them alike. ``flwr run`` packs the app's
folder after walking all of it: a virtual environment inside the folder
(``.venv``) costs seconds per run, so compare copies without one. Each app runs from its own folder with its own ``fedx``
(Flower puts the app's folder first on the path of the ServerApp and the
ClientApps); this script's fedx only starts the SuperLink.

Usage::

    python benchmarks/startup.py                   # the default job, 2 runs
    python benchmarks/startup.py --runs 3 --rounds 2 --app /tmp/fedx-main --app /tmp/fedx-new

This script reports; it is not a test, and it always exits with status 0.
"""

import argparse
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from fedx.deploy.local import FederationSpec, LocalFederation, free_port
from fedx.outputs import METRICS_FILE

from fedx_bench import common

APP = common.REPO
FEDERATION = "num-supernodes=10 client-resources-num-cpus=1"
ROUND_ONE = "[ROUND 1/"


def run_cpu(flwr_home: Path, since: float) -> float:
    """CPU seconds of this federation's processes started at or after ``since`` (epoch seconds).

    The federation's processes are those with its ``FLWR_HOME`` in their
    environment (every process the SuperLink starts inherits it, and so
    does ``flwr run``); those started before the run (the SuperLink, what
    is left of earlier runs) are not counted. A process's seconds include
    those of its children that it has waited for, so processes that came
    and went are counted too.
    """
    marker = str(flwr_home.resolve())
    total = 0.0
    for process in psutil.process_iter():
        try:
            if process.create_time() < since or process.environ().get("FLWR_HOME") != marker:
                continue
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


def run_once(
    env: dict, app: Path, output: Path, rounds: int | None, timeout: float, log: Path | None
) -> dict:
    """One ``flwr run`` of the default job; its timings and final accuracy."""
    flwr_home = Path(env["FLWR_HOME"])
    # Process start times are kept to 1/100 s or so.
    epoch_start = time.time() - 0.05
    settings = f'run-name="startup" output-dir="{output}"'
    if rounds is not None:
        settings += f" num-server-rounds={rounds}"
    command = common.flwr_run_command(app, FEDERATION, settings)
    start = time.perf_counter()
    first_round: list[float] = []
    cpu_first_round: list[float] = []
    lines: list[str] = []
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    # The deadline holds even when flwr prints nothing.
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(f"{time.perf_counter() - start:8.2f}  {line}")
            if not first_round and ROUND_ONE in line:
                first_round.append(time.perf_counter() - start)
                cpu_first_round.append(run_cpu(flwr_home, epoch_start))
        code = process.wait()
    finally:
        timer.cancel()
    total = time.perf_counter() - start
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(lines))
    metrics_file = output / "startup" / METRICS_FILE
    if code != 0 or not metrics_file.exists():
        return {"error": f"flwr run exited {code}:\n{''.join(lines)[-2000:]}"}
    metrics = json.loads(metrics_file.read_text())
    seconds = [row["round-seconds"] for row in metrics["rounds"] if "round-seconds" in row]
    return {
        "to-round-1": first_round[0] if first_round else None,
        "cpu-to-round-1": cpu_first_round[0] if cpu_first_round else None,
        "round-1": seconds[0],
        "later": sum(seconds[1:]) / max(len(seconds) - 1, 1),
        "total": total,
        "accuracy": metrics["final"].get("accuracy"),
    }


def seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = common.benchmark_parser(__doc__)
    parser.add_argument("--runs", type=int, default=2, help="runs of the job (default: 2)")
    parser.add_argument(
        "--rounds", type=int, default=None, help="num-server-rounds (default: the app's, 20)"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per flwr run")
    common.add_app_option(parser)
    parser.add_argument(
        "--logs",
        type=Path,
        default=None,
        help="write each run's output here, every line with its seconds since the start",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """Run the job ``--runs`` times on one SuperLink; print one line per run."""
    arguments = parse_arguments(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="fedx-startup-") as directory:
        home = Path(directory)
        spec = FederationSpec(
            0,
            home / "superlink",
            port=free_port(),
            insecure=True,
            simulation=True,
            extra_environment={"FEDX_CACHE_DIR": str(home / "cache")},
        )
        apps = arguments.app or [APP]
        print(f"flwr run <app> --federation-config {FEDERATION!r}; partition cache in {home}/cache")
        for number, app in enumerate(apps):
            print(f"  app {number}: {app}")
        print(
            f"{'run':>4}{'app':>4}{'to round 1 s':>14}{'CPU s':>8}{'round 1 s':>11}"
            f"{'rounds 2+ s':>13}{'whole s':>10}  accuracy"
        )
        with LocalFederation(spec) as federation:
            federation.start_superlink(timeout=60)
            for run in range(1, arguments.runs + 1):
                for number, app in enumerate(apps):
                    output = home / f"outputs-{run}-{number}"
                    log = arguments.logs / f"run-{run}-app-{number}.log" if arguments.logs else None
                    result = run_once(
                        spec.environment(), app, output, arguments.rounds, arguments.timeout, log
                    )
                    results.append({"run": run, "app": str(app), **result})
                    if "error" in result:
                        print(f"{run:>4}{number:>4}  {result['error']}")
                        continue
                    print(
                        f"{run:>4}{number:>4}{seconds(result['to-round-1']):>14}"
                        f"{seconds(result['cpu-to-round-1']):>8}"
                        f"{result['round-1']:>11.2f}{result['later']:>13.2f}"
                        f"{result['total']:>10.1f}  {result['accuracy']}",
                        flush=True,
                    )
    return results
