"""Flower's executor and ClientApps slow to start: one process per message, or one every 30 s.

Flower 1.41's SuperExec claims a ClientApp task of its SuperNode and starts
a ``flwr-clientapp`` process for it. The claim lasts 30 s
(``flwr.common.constant.HEARTBEAT_DEFAULT_INTERVAL``): a process that has not
asked the SuperNode for its message by then finds its task handed back to
the pending ones, and the SuperExec starts another process for it at its next
poll while the first is still starting; the first then fails. A ClientApp
whose start takes longer than 30 s never runs, and every 30 s one more
process starts beside the others, which slows the next start further: the
23-25 ``flwr-clientapp`` processes issue 27 saw in one container.

Two measurements:

1. **Start-up.** K processes at once, each importing what ``flwr-clientapp``
   imports before its first request (the app itself is loaded after it), on
   this machine: the seconds until the last one is ready (``--at-once``).
2. **Launches.** Two SuperNodes with Flower's executor (``fedx-deploy``'s
   federation, ``benchmarks/deployment.py``'s ``flower`` setup) run
   deployment.py's job (digits FedMR) for ``--window`` seconds, every
   ``flwr-clientapp`` process held D seconds at its very start (a
   ``sitecustomize`` on ``PYTHONPATH``: a stand-in for a start slowed by a
   busy machine, ``--delays``): the rounds done, the ClientApp messages they
   took (each node's identity query, then one training message per round),
   the ``flwr-clientapp`` processes started, and the most alive at once.

fedx's warm executor (``fedx-superexec``, ``fedx-deploy --executor warm``)
claims a task only when it has room to run it (``--max-tasks``), and starts
it by a fork of an interpreter that has imported everything already.

Usage::

    python benchmarks/clientapp_startups.py
    python benchmarks/clientapp_startups.py --at-once 1 8 --delays 0 35 --window 100

It reports; it is not a test, and it always exits with status 0.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from fedx_bench import common, deployment

SUPERNODES = 2
#: What flwr-clientapp imports before it asks its SuperNode for the message.
CLIENTAPP_ENTRY = "import flwr.supernode.cli.flwr_clientapp, flwr.supernode.runtime.run_clientapp"
#: Holds every flwr-clientapp process FEDX_BENCH_START_DELAY seconds at its start, and logs it.
SITECUSTOMIZE = """
import os, sys, time
if len(sys.orig_argv) > 1 and os.path.basename(sys.orig_argv[1]) == "flwr-clientapp":
    with open(os.environ["FEDX_BENCH_START_LOG"], "a") as log:
        log.write(f"{time.time()} {os.getpid()}\\n")
    time.sleep(float(os.environ["FEDX_BENCH_START_DELAY"]))
"""


def startup_seconds(at_once: int) -> float:
    """Seconds until the last of ``at_once`` processes importing flwr-clientapp's entry is done."""
    start = time.perf_counter()
    processes = [
        subprocess.Popen([sys.executable, "-c", CLIENTAPP_ENTRY])  # pylint: disable=consider-using-with
        for _ in range(at_once)
    ]
    for process in processes:
        process.wait()
    return time.perf_counter() - start


class ProcessCounter(threading.Thread):
    """The most ``flwr-clientapp`` processes alive at once, sampled every 0.2 s."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.most = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.2):
            alive = 0
            for process in psutil.process_iter(["cmdline"]):
                cmdline = process.info["cmdline"] or []
                alive += any(os.path.basename(part) == "flwr-clientapp" for part in cmdline[:2])
            self.most = max(self.most, alive)


def launches(arguments: argparse.Namespace, delay: float, home: Path) -> dict:
    """The job on Flower's executor for ``--window`` seconds, every ClientApp start held ``delay`` s."""
    shim = home / "shim"
    shim.mkdir(parents=True)
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    start_log = home / "starts.log"
    start_log.touch()
    environment = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")])),
        "FEDX_BENCH_START_LOG": str(start_log),
        "FEDX_BENCH_START_DELAY": f"{delay:g}",
    }
    overrides = deployment.job_overrides(arguments, SUPERNODES, "startups", home / "outputs")
    counter = ProcessCounter()
    with deployment.federation_of(
        home / "state", SUPERNODES, deployment.FLOWER_AS_SHIPPED, 1, environment=environment
    ) as federation:
        counter.start()
        try:
            deployment.flwr_run_on(federation, overrides, timeout=arguments.window)
        except subprocess.TimeoutExpired:
            pass  # the window is over; leaving the federation stops the run
        finally:
            counter.stopped.set()
    counter.join()
    rounds = deployment.metrics_rows(overrides)
    return {
        # Each round's training message to every node, and before round 1 the
        # ServerApp's query of every node's identity (partition id).
        "messages": SUPERNODES * (len(rounds) + 1) if rounds else 0,
        "rounds": len(rounds),
        "started": len(start_log.read_text().splitlines()),
        "most": counter.most,
    }


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.benchmark_parser(__doc__)
    parser.add_argument("--at-once", type=int, nargs="+", default=[1, 4, 12, 24])
    parser.add_argument(
        "--delays", type=float, nargs="+", default=[0.0, 20.0, 35.0],
        help="seconds each flwr-clientapp is held at its start",
    )  # fmt: skip
    parser.add_argument("--window", type=float, default=120.0, help="seconds of each run")
    common.add_job_options(parser, rounds=3, rounds_help="rounds of the job")
    arguments = parser.parse_args(argv)
    common.check_job_options(parser, arguments, common.REPO)
    arguments.clients, arguments.client_threads = SUPERNODES, 1
    return arguments


def main(argv: Sequence[str] | None = None) -> None:
    """Run both measurements and print them."""
    arguments = parse_arguments(argv)
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start")
    print("start-up: processes importing flwr-clientapp's entry at once -> seconds until all are")
    for count in arguments.at_once:
        print(f"  {count:>3} at once: {startup_seconds(count):6.1f} s", flush=True)
    print(
        f"launches: {SUPERNODES} SuperNodes, Flower's executor, {arguments.window:g} s of the job "
        f"({arguments.rounds} rounds); each flwr-clientapp held D s at its start"
    )
    print(f"  {'D (s)':>6} {'rounds':>6} {'messages':>8} {'started':>8} {'at once':>7}")
    for delay in arguments.delays:
        with tempfile.TemporaryDirectory(prefix="fedx-startups-") as directory:
            found = launches(arguments, delay, Path(directory))
        print(
            f"  {delay:>6g} {found['rounds']:>6} {found['messages']:>8} {found['started']:>8} "
            f"{found['most']:>7}",
            flush=True,
        )
    print(f"load {os.getloadavg()[0]:.1f} at the end")
