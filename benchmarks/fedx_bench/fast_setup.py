"""Time the README's fast setup, the command as a user types it, against the same job simulated.

The command, read from the README (its one line that starts ``fedx-deploy
up``; today ``fedx-deploy up --insecure --supernodes 3 --executor warm
--poll-interval 0.1 --superlink-database memory --run .``), runs in the
app's folder as typed, with nothing exported first: this
script's environment goes to it without the thread variables
(``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
``FEDX_CLIENTAPP_THREADS``, ``FEDX_SERVERAPP_THREADS``,
``FEDX_SUPERNODES_PER_MACHINE``), so the threads are whatever ``fedx-deploy``
itself gives the processes. Added to it is only where things go and which
job runs: ``--port`` and ``--supernode-port`` (free ports, so that another
federation on the machine does not matter), ``--state-dir`` (a temporary
folder) and ``--run-config`` with the job's keys.

The job is ``benchmarks/deployment.py``'s, which the issue's figures came
from: FedMR on digits, the app's ``cnn`` and training settings, IID
partitions, 3 clients all training, 5 rounds, central evaluation once at the
end; per round is the mean of rounds 2 to R of the ``round-seconds`` the
ServerApp writes to ``metrics.json``. The simulation is ``deployment.py``'s
too: ``flwr run`` against a simulation SuperLink with ``num-supernodes=3
client-resources-num-cpus=1``.

Each repeat runs the simulation, then the command in every app folder in
turn (in the opposite order every other repeat; ``--app``, repeatable, default this repository: other copies of fedx
for a before/after comparison, ``git archive <commit> | tar -x -C
<folder>``; the command then runs with that folder first on ``PYTHONPATH``,
so ``fedx-deploy`` and the processes it starts run that copy's fedx), and
prints each one's seconds per round, its ratio to the simulation of the same
repeat, and the load average around it. The README's target: at most 2x.

``--trace`` runs every command with ``benchmarks/message_timeline.py``'s
tracer in all its processes and prints, per app folder, where each training
exchange's seconds went (the median over exchanges 3 on, nodes and repeats,
step by step: the message timeline), and what the round spends outside its
exchange (the ServerApp's aggregation and checkpoint). The tracer costs a
little time of its own: take the ratios from runs without it.

Usage::

    python benchmarks/fast_setup.py
    python benchmarks/fast_setup.py --repeats 2 --app /tmp/fedx-main --app .
    python benchmarks/fast_setup.py --repeats 2 --trace --app /tmp/fedx-main --app .

This script reports; it is not a test, and it always exits with status 0.
"""

import argparse
import contextlib
import io
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedx_bench import common, deployment
from fedx_bench import message_timeline as timeline
from fedx_bench import simulation_overhead as overhead

Timing = overhead.Timing


def readme_command(readme: Path = common.REPO / "README.md") -> list[str]:
    """The README's fast-setup command, word for word: its one line that starts ``fedx-deploy up``."""
    lines = [line.strip() for line in readme.read_text().splitlines()]
    commands = [line.split() for line in lines if line.startswith("fedx-deploy up ")]
    if len(commands) != 1:
        raise RuntimeError(f"{readme} should give one 'fedx-deploy up' line, found {len(commands)}")
    return commands[0]


#: The command of the README's fast setup, word for word.
FAST_SETUP = readme_command()
CLIENTS = 3
#: What a user has not exported: the command decides the threads itself.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "FEDX_CLIENTAPP_THREADS",
    "FEDX_SERVERAPP_THREADS",
    "FEDX_SUPERNODES_PER_MACHINE",
    "FEDX_CLIENTAPP_MAX_TASKS",
)
TARGET = 2.0


@dataclass
class Repeat:
    """One repeat: the simulation, and the command in each app folder."""

    simulation: Timing
    commands: dict[Path, Timing] = field(default_factory=dict)
    loads: dict[str, str] = field(default_factory=dict)
    #: With ``--trace``: per app folder, ``{step: [seconds, per exchange and node]}``.
    steps: dict[Path, dict[str, list[float]]] = field(default_factory=dict)


def placement(home: Path) -> list[str]:
    """The options that put a fast-setup federation on free ports and its state under ``home``."""
    port = free_ports(1 + CLIENTS)
    return [
        "--port",
        str(port),
        "--supernode-port",
        str(port + 1),
        "--state-dir",
        str(home / "state"),
    ]


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive TCP ports on 127.0.0.1 that nobody listens on now."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - count)
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"found no {count} free consecutive ports")


def command_environment(app: Path, trace: Path | None = None) -> dict[str, str]:
    """This environment, without thread settings, with ``app``'s fedx first on the path.

    With ``trace``, the message timeline's tracer writes there from every process.
    """
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    first = [str(app), *([str(timeline.TRACER)] if trace else [])]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*first, env.get("PYTHONPATH")]))
    if trace:
        env["FEDX_TRACE_FILE"] = str(trace)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_command(
    app: Path, home: Path, overrides: dict, timeout: float, trace: Path | None = None
) -> Timing:
    """The fast-setup command in ``app``'s folder (traced into ``trace``); its rounds from ``metrics.json``."""
    command = [
        *FAST_SETUP,
        *placement(home),
        "--run-config",
        overhead.run_config_argument(overrides),
    ]
    start = time.perf_counter()
    process = subprocess.Popen(  # pylint: disable=consider-using-with
        command,
        cwd=app,
        env=command_environment(app, trace),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        output = f"timed out after {timeout:g}s\n{stop_command(process)}"
    except BaseException:  # this script stopped: its federation too
        stop_command(process)
        raise
    total = time.perf_counter() - start
    seconds = [row["round-seconds"] for row in deployment.metrics_rows(overrides)]
    if process.returncode != 0 or len(seconds) != overrides["num-server-rounds"]:
        return Timing(
            total=total,
            error=f"exit {process.returncode}, {len(seconds)} round(s) recorded:\n{output[-2000:]}",
        )
    return Timing(first=seconds[0], later=seconds[1:], total=total)


def stop_command(process: subprocess.Popen) -> str:
    """Stop a ``fedx-deploy`` command as Ctrl-C does (its federation with it); its output."""
    process.send_signal(signal.SIGINT)
    try:
        output, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    return output or ""


def job(arguments: argparse.Namespace, name: str, output: Path) -> dict:
    """The run config of the job (deployment.py's), named ``name``."""
    return deployment.job_overrides(arguments, CLIENTS, name, output)


def _seconds(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_repeat(index: int, repeat: Repeat) -> None:
    simulation = repeat.simulation.per_round
    print(
        f"repeat {index + 1}: simulation {_seconds(simulation)} s/round "
        f"({repeat.loads['simulation']})"
    )
    common.print_error(repeat.simulation.error, "simulation")
    for app, timing in repeat.commands.items():
        ratio = f"{timing.per_round / simulation:.1f}x" if timing.per_round and simulation else "-"
        print(
            f"  {str(app):<40} {_seconds(timing.per_round):>7} s/round {ratio:>6} the "
            f"simulation; round 1 {_seconds(timing.first)} s, whole command "
            f"{_seconds(timing.total, 1)} s ({repeat.loads[str(app)]}); rounds 2-: "
            f"{', '.join(f'{s:.1f}' for s in timing.later or [])}",
            flush=True,
        )
        common.print_error(timing.error, str(app))


def trace_steps(trace: Path) -> dict[str, list[float]]:
    """Each step's seconds in a traced run (message_timeline's analysis, printed quietly)."""
    calls = timeline.read_trace(trace)
    with contextlib.redirect_stdout(io.StringIO()):
        return timeline.analyse(calls, timeline.nodes_in(calls), first=3, show=0)


def print_steps(apps: Sequence[Path], repeats: Sequence[Repeat]) -> None:
    """The message timeline's steps, median seconds per app folder, side by side."""
    steps: dict[str, dict[Path, list[float]]] = {}
    for repeat in repeats:
        for app, took in repeat.steps.items():
            for step, values in took.items():
                steps.setdefault(step, {}).setdefault(app, []).extend(values)
    if not steps:
        return
    print("where a training exchange's seconds go (median over exchanges 3-, nodes, repeats):")
    print(f"{'step':<54}" + "".join(f"{app.name[-12:]:>14}" for app in apps))
    for step, by_app in steps.items():
        cells = [by_app.get(app) for app in apps]
        print(
            f"{step:<54}"
            + "".join(f"{statistics.median(c):>14.3f}" if c else f"{'-':>14}" for c in cells)
        )
    outside = []
    for app in apps:
        rounds = [r.commands[app].per_round for r in repeats if r.commands[app].per_round]
        exchanges = steps.get("the exchange", {}).get(app)
        if rounds and exchanges:
            outside.append(statistics.median(rounds) - statistics.median(exchanges))
        else:
            outside.append(None)
    print(
        f"{'the round outside its exchange (server work)':<54}"
        + "".join(f"{o:>14.3f}" if o is not None else f"{'-':>14}" for o in outside)
    )


def print_summary(apps: Sequence[Path], repeats: Sequence[Repeat]) -> None:
    print(f"median over {len(repeats)} repeat(s); target: at most {TARGET:g}x the simulation")
    for app in apps:
        pairs = [
            (r.commands[app].per_round, r.simulation.per_round)
            for r in repeats
            if r.commands[app].per_round and r.simulation.per_round
        ]
        if not pairs:
            print(f"  {app}: no complete run")
            continue
        per_round = statistics.median(p for p, _ in pairs)
        ratio = statistics.median(p / s for p, s in pairs)
        print(f"  {str(app):<40} {per_round:.2f} s/round, {ratio:.1f}x the simulation")


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = common.benchmark_parser(__doc__)
    common.add_app_option(parser)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--trace", action="store_true", help="trace every process: where each exchange's time goes"
    )
    common.add_job_options(parser, rounds=5, rounds_help="rounds of the job (at least 2)")
    arguments = parser.parse_args(argv)
    common.check_job_options(parser, arguments, common.REPO)
    arguments.app = [app.resolve() for app in arguments.app] or [common.REPO]
    # What deployment.py's job and simulation read.
    arguments.clients, arguments.client_threads = CLIENTS, 1
    return arguments


def main(argv: Sequence[str] | None = None) -> list[Repeat]:
    """Run the benchmark, print what it measured; return it."""
    arguments = parse_arguments(argv)
    print(
        f"{' '.join(FAST_SETUP)}\nagainst the simulation: FedMR on digits, cnn, IID, {CLIENTS} "
        f"clients, {common.rounds_text(arguments)}; {os.cpu_count()} cores "
        f"({common.load_text()} at start)",
        flush=True,
    )
    repeats = []
    with tempfile.TemporaryDirectory(prefix="fedx-fast-setup-") as directory:
        home = Path(directory)
        for index in range(arguments.repeats):
            simulation = deployment.time_simulation(arguments, home / f"simulation-{index}")
            repeat = Repeat(simulation, loads={"simulation": common.load_text()})
            # A B, then B A: a drift of the machine's load touches every copy alike.
            order = list(enumerate(arguments.app))
            for number, app in order if index % 2 == 0 else order[::-1]:
                run_home = home / f"command-{index}-{number}"
                overrides = job(arguments, "fast-setup", run_home / "outputs")
                trace = run_home / "trace.txt" if arguments.trace else None
                repeat.commands[app] = run_command(
                    app, run_home, overrides, arguments.timeout, trace
                )
                repeat.loads[str(app)] = common.load_text()
                if trace is not None and trace.exists():
                    repeat.steps[app] = trace_steps(trace)
            print_repeat(index, repeat)
            repeats.append(repeat)
    print_summary(arguments.app, repeats)
    print_steps(arguments.app, repeats)
    print(f"{common.load_text()} at the end")
    return repeats
