"""What the README's fast setup costs while it does nothing: each process's CPU, idle.

The README's ``fedx-deploy up`` line (``benchmarks/fast_setup.py`` reads it)
starts without its ``--run`` (and with free ports and a temporary state
folder, as ``fast_setup.py`` runs it): a SuperLink, 3 SuperNodes with their
warm executors, and nothing to do. Once it says it is up, the CPU time
(user + system) of every process it started is read at the start and end of
each window (``--after``: seconds after it is up, ``--seconds`` long), and
printed per kind of process as a share of one core, with the load average
beside it. The windows show the polls as they are right after the federation
came up (or a run ended: the idle backoff of ``fedx-supernode`` and
``fedx-superexec`` starts with short polls) and once they have backed off.

``--app``, repeatable, runs other copies of fedx in turn (ABBA over the
repeats), as ``fast_setup.py`` does: ``git archive <commit> | tar -x -C
<folder>`` for a before/after comparison.

Usage::

    python benchmarks/idle_federation.py
    python benchmarks/idle_federation.py --repeats 2 --app /tmp/fedx-before --app .

This script reports; it is not a test, and it always exits with status 0.
"""

import argparse
import os
import queue
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from fedx_bench import common, fast_setup

#: What the processes are called in the report, found from their command lines.
KINDS = (
    ("fedx-superlink", "SuperLink"),
    ("flower-superlink", "SuperLink"),
    ("flower-superexec", "SuperLink's SuperExec"),
    ("fedx-supernode", "SuperNodes"),
    ("flower-supernode", "SuperNodes"),
    ("fedx-superexec", "SuperNodes' SuperExecs"),
    ("multiprocessing.forkserver", "warm interpreters"),
    ("fedx-deploy", "fedx-deploy"),
)
UP_LINE = "SuperLink on "


def idle_command() -> list[str]:
    """The README's fast-setup command without its ``--run APP``."""
    command = list(fast_setup.FAST_SETUP)
    if "--run" in command:
        at = command.index("--run")
        del command[at : at + 2]
    return command


def kind_of(process: psutil.Process) -> str:
    """What ``process`` is in a fast-setup federation (its command line says)."""
    try:
        line = " ".join(process.cmdline())
    except psutil.Error:
        return "ended"
    for needle, kind in KINDS:
        if needle in line:
            return kind
    return "other"


def cpu_seconds(processes: Sequence[psutil.Process]) -> dict[int, tuple[str, float]]:
    """``{pid: (kind, user + system CPU seconds)}`` of the processes still running."""
    seconds = {}
    for process in processes:
        try:
            times = process.cpu_times()
            seconds[process.pid] = (kind_of(process), times.user + times.system)
        except psutil.Error:
            continue
    return seconds


def tree(root: psutil.Process) -> list[psutil.Process]:
    """``root`` and every process below it."""
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


@dataclass
class Window:
    """One window: CPU seconds per second, per kind of process, and the load around it."""

    after: float
    seconds: float
    share: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    load: str = ""

    @property
    def total(self) -> float:
        return sum(self.share.values())


def measure(root: psutil.Process, after: float, seconds: float, up_at: float) -> Window:
    """The CPU of ``root``'s processes from ``after`` to ``after + seconds`` after ``up_at``."""
    time.sleep(max(0.0, up_at + after - time.monotonic()))
    start_time = time.monotonic()
    start = cpu_seconds(tree(root))
    time.sleep(seconds)
    end = cpu_seconds(tree(root))
    elapsed = time.monotonic() - start_time
    window = Window(after, seconds, load=common.load_text())
    used: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for pid, (kind, cpu) in end.items():
        used[kind] += cpu - start.get(pid, (kind, 0.0))[1]
        counts[kind] += 1
    window.share = {kind: value / elapsed for kind, value in used.items()}
    window.counts = dict(counts)
    return window


def _reader(stream, lines: "queue.Queue[str | None]") -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def idle_run(app: Path, home: Path, arguments: argparse.Namespace) -> list[Window] | str:
    """The idle federation of ``app``'s copy of fedx, measured in each window (or an error)."""
    command = [*idle_command(), *fast_setup.placement(home)]
    process = subprocess.Popen(  # pylint: disable=consider-using-with
        command,
        cwd=app,
        env=fast_setup.command_environment(app),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_reader, args=(process.stdout, lines), daemon=True).start()
    output = []
    try:
        deadline = time.monotonic() + arguments.timeout
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                return f"not up after {arguments.timeout:g}s:\n{''.join(output)[-2000:]}"
            if line is None:
                return f"exit {process.wait()} before it was up:\n{''.join(output)[-2000:]}"
            output.append(line)
            if line.startswith(UP_LINE):
                break
        up_at = time.monotonic()
        root = psutil.Process(process.pid)
        return [measure(root, after, arguments.seconds, up_at) for after in arguments.after]
    finally:
        process.send_signal(signal.SIGINT)  # fedx-deploy stops its federation on Ctrl-C
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def print_windows(app: Path, windows: list[Window]) -> None:
    for window in windows:
        parts = ", ".join(
            f"{kind} {100 * share:.1f}%"
            + (f" ({window.counts[kind]})" if window.counts.get(kind, 1) > 1 else "")
            for kind, share in sorted(window.share.items(), key=lambda item: -item[1])
        )
        print(
            f"  {str(app):<40} {window.after:>4g}-{window.after + window.seconds:g} s after up: "
            f"{100 * window.total:5.1f}% of a core in all ({window.load}): {parts}",
            flush=True,
        )


def print_summary(apps: Sequence[Path], results: dict[Path, list[list[Window]]]) -> None:
    print("median over the repeats, % of one core, all processes together")
    for app in apps:
        runs = results.get(app, [])
        if not runs:
            print(f"  {app}: no complete run")
            continue
        for index, _ in enumerate(runs[0]):
            totals = [100 * run[index].total for run in runs]
            window = runs[0][index]
            print(
                f"  {str(app):<40} {window.after:>4g}-{window.after + window.seconds:g} s: "
                f"{statistics.median(totals):.1f}% ({', '.join(f'{t:.1f}' for t in totals)})"
            )


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = common.benchmark_parser(__doc__)
    common.add_app_option(parser)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each window")
    parser.add_argument(
        "--after",
        type=float,
        nargs="+",
        default=[0.0, 30.0],
        help="when each window starts, seconds after the federation is up (default: 0 30)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to come up")
    arguments = parser.parse_args(argv)
    arguments.app = [app.resolve() for app in arguments.app] or [common.REPO]
    return arguments


def main(argv: Sequence[str] | None = None) -> dict[Path, list[list[Window]]]:
    """Run the benchmark, print what it measured; return it."""
    arguments = parse_arguments(argv)
    print(
        f"{' '.join(idle_command())}\nidle, {arguments.seconds:g}-s windows starting "
        f"{', '.join(f'{a:g}' for a in arguments.after)} s after it is up; {os.cpu_count()} "
        f"cores ({common.load_text()} at start)",
        flush=True,
    )
    results: dict[Path, list[list[Window]]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="fedx-idle-") as directory:
        home = Path(directory)
        for index in range(arguments.repeats):
            order = list(enumerate(arguments.app))
            print(f"repeat {index + 1}")
            for number, app in order if index % 2 == 0 else order[::-1]:
                windows = idle_run(app, home / f"idle-{index}-{number}", arguments)
                if isinstance(windows, str):
                    common.print_error(windows, str(app))
                    continue
                print_windows(app, windows)
                results[app].append(windows)
    print_summary(arguments.app, results)
    print(f"{common.load_text()} at the end")
    return results
