"""Measure a round on real Flower processes against the same round simulated and in a plain loop.

The job: FedMR on digits with the app's ``cnn`` and training settings, IID
partitions, 3 clients all training, 5 rounds; "per round" is the mean of
rounds 2 to R (round 1 pays the start-up). It runs

* as a plain loop: one process, the same partitions, model, ``train`` call
  and recombination (``benchmarks/simulation_overhead.py``'s loop);
* in Flower's simulation: ``flwr run`` against a simulation SuperLink with
  ``num-supernodes=3``;
* on real processes, a SuperLink and 3 SuperNodes on 127.0.0.1
  (``fedx.deploy.local``), once per setup ``EXECUTOR[:POLL]``:

  - ``flower``: Flower's default executor, a fresh ``flwr-clientapp``
    process per message;
  - ``warm``: fedx's, ``fedx-superexec`` (the ClientApp's imports loaded
    once per SuperNode, a fork per message);
  - without ``:POLL``, Flower's polling everywhere: the ServerApp pulls
    replies every 3 s as Flower's ``send_and_receive`` does
    (``FEDX_REPLY_PULL_INTERVAL=3``), an idle SuperNode pulls the SuperLink
    every 3 s and its SuperExec asks for tasks every 1 s; so ``flower`` is
    Flower as shipped, the baseline of the ``/flower`` column;
  - with ``:POLL`` (seconds, e.g. ``warm:0.1``), fedx's: the ServerApp
    collects replies as they arrive (``fedx.messaging.send_and_collect``'s
    adaptive pulls), the SuperNodes pull every POLL
    (``fedx-supernode --poll-interval``) and so do their SuperExecs
    (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``), and the objects of a message
    that are not there yet are asked for again within POLL to 0.25 s
    (``fedx.flower.object_pulls``);
  - the SuperLink keeps its state in a SQLite file (``fedx-deploy``'s
    default), or in memory with ``:memory`` at the end (``warm:0.1:memory``,
    Flower's default: ``FederationSpec.superlink_database``).

Every client trains with ``--client-threads`` torch threads (default 1): the
plain loop sets it, the simulation gives each client that many CPUs
(``client-resources-num-cpus``), and the SuperNodes' ClientApps and the
ServerApp get it through ``FederationSpec``'s ``clientapp_threads`` and
``serverapp_threads`` (the simulation's actors get Ray's ``num_cpus`` and
with it the same), so that thread contention on a small machine does not
decide the comparison. ``benchmarks/fast_setup.py`` measures the README's
fast setup as typed instead, with ``fedx-deploy``'s own thread counts.

The per-round times are the ``round-seconds`` the fedx ServerApp writes to
``metrics.json`` (training and checkpoint, central evaluation excluded); the
whole run is the wall time of ``flwr run --stream`` (for real processes
once the SuperLink and SuperNodes are up and, for ``warm``, once their warm
interpreters have imported the app). Ratios are taken against the
simulation, the plain loop and ``flower`` of the same benchmark run. For each real
setup, before the job, the SuperLink's CPU time while the SuperNodes sit
idle for ``--idle-seconds`` is reported as a share of one core: what the
SuperNodes' polling costs it.

Two more measurements:

* cold start of a ClientApp process: fresh interpreters run
  ``python -c "import fedx.client_app"`` and ``python -c "import torch"``,
  alternating, ``--cold-samples`` times each (median and min);
* secure recombination on 4 SuperNodes (FedMR, ``secure-recombination=true``,
  ``--secure-rounds`` rounds of 1 local epoch): the secure stage's seconds
  per round, ``secure-seconds`` in ``metrics.json`` (from the first layer
  send to the last upload), for each setup.

Usage::

    python benchmarks/deployment.py                    # everything above
    python benchmarks/deployment.py --setups flower warm:0.1 --skip-secure
    python benchmarks/deployment.py --quick            # 4 clients, 2 rounds of 1 epoch, warm:0.1:memory only

The machine's other load shows in every figure: compare ratios taken in one
run. This script reports; it is not a test, and it always exits with status 0.
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch

from fedx import messaging
from fedx.compare.plan import app_defaults
from fedx.config import RunConfig
from fedx.deploy.local import FederationSpec, LocalFederation, free_port
from fedx.outputs import METRICS_FILE

from fedx_bench import common
from fedx_bench import simulation_overhead as overhead

APP = common.REPO
EXECUTORS = ("flower", "warm")
DEFAULT_SETUPS = ("flower", "warm", "flower:0.1", "warm:0.1", "warm:0.1:memory")
#: The ServerApp's fixed pull interval that stands for Flower's send_and_receive.
FLOWER_REPLY_PULL_INTERVAL = 3.0


Case, Timing = overhead.Case, overhead.Timing


@dataclass(frozen=True)
class Setup:
    """How the real processes run: the executor, the polls (None: Flower's), the SuperLink's database."""

    executor: str
    poll: float | None = None
    database: str = "file"

    @property
    def label(self) -> str:
        """``warm:0.1`` or ``warm:0.1:memory`` style, as given on the command line."""
        label = self.executor if self.poll is None else f"{self.executor}:{self.poll:g}"
        return label if self.database == "file" else f"{label}:{self.database}"

    @property
    def description(self) -> str:
        """Words for the report."""
        executor = "Flower's executor" if self.executor == "flower" else "warm executor"
        polls = "Flower's polls" if self.poll is None else f"fedx's polls ({self.poll:g} s)"
        database = "" if self.database == "file" else ", SuperLink in memory"
        return f"real, {executor}, {polls}{database}"

    def environment(self) -> dict[str, str]:
        """What every process of the federation gets in its environment."""
        environment = {}
        if self.poll is None:  # the ServerApp pulls replies in Flower's steps
            environment[messaging.PULL_INTERVAL_VARIABLE] = f"{FLOWER_REPLY_PULL_INTERVAL:g}"
        return environment


#: Flower's executor and Flower's polling: the baseline of the comparison.
FLOWER_AS_SHIPPED = Setup("flower")


@dataclass
class Real:
    """The job on real processes: its timing and what the idle SuperNodes cost the SuperLink."""

    setup: Setup
    timing: Timing
    idle_cpu: float | None = None  # SuperLink CPU seconds per second while the nodes idle


@dataclass
class ColdStart:
    """Seconds of fresh interpreters importing torch alone and the ClientApp module."""

    torch: list[float] = field(default_factory=list)
    client_app: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """Median ``import fedx.client_app`` over median ``import torch``."""
        return statistics.median(self.client_app) / statistics.median(self.torch)


@dataclass
class Secure:
    """Secure recombination on real processes: the secure stage's seconds per round."""

    setup: Setup
    seconds: list[float] = field(default_factory=list)
    exchanges: list[int] = field(default_factory=list)
    total: float | None = None
    error: str | None = None

    @property
    def per_round(self) -> float | None:
        """Mean ``secure-seconds`` over the rounds."""
        return statistics.mean(self.seconds) if self.seconds else None


@dataclass
class Report:
    """Everything one run of the benchmark measured."""

    plain: Timing | None = None
    simulation: Timing | None = None
    real: list[Real] = field(default_factory=list)
    cold: ColdStart | None = None
    secure: list[Secure] = field(default_factory=list)


# ----------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------


def job_overrides(arguments: argparse.Namespace, clients: int, name: str, output: Path) -> dict:
    """The run config of the job (simulation_overhead's keys), named ``name``."""
    overrides = overhead.run_overrides(arguments, Case(clients, 1.0), "fedmr", output)
    overrides["run-name"] = name
    return overrides


def metrics_rows(overrides: dict) -> list[dict]:
    """The rounds of ``metrics.json`` the run wrote (round 0 left out)."""
    path = Path(overrides["output-dir"]) / overrides["run-name"] / METRICS_FILE
    rows = json.loads(path.read_text())["rounds"] if path.exists() else []
    return [row for row in rows if row.get("round", 0) > 0]


def flwr_run_on(federation: LocalFederation, overrides: dict, timeout: float) -> tuple[float, str]:
    """``flwr run --stream`` of this app on ``federation``: wall seconds and its output."""
    start = time.perf_counter()
    done = federation.flwr(
        "run",
        str(APP),
        federation.spec.connection,
        "--stream",
        "--run-config",
        overhead.run_config_argument(overrides),
        timeout=timeout,
    )
    return time.perf_counter() - start, done.stdout + done.stderr


@contextlib.contextmanager
def federation_of(
    state_dir: Path,
    clients: int,
    setup: Setup,
    threads: int,
    timeout: float = 300.0,
    environment: dict[str, str] | None = None,
):
    """A plain-text SuperLink and ``clients`` SuperNodes on free 127.0.0.1 ports, all up.

    For the warm executor, also every SuperNode's warm interpreter. Every
    process gets ``environment`` on top of the setup's.
    """
    spec = FederationSpec(
        num_supernodes=clients,
        state_dir=state_dir,
        port=free_port(),
        supernode_ports=[free_port() for _ in range(clients)],
        insecure=True,
        executor=setup.executor,
        poll_interval=setup.poll,
        superlink_database=setup.database,
        workdir=state_dir,
        extra_environment={**setup.environment(), **(environment or {})},
        clientapp_threads=threads,
        serverapp_threads=threads,
    )
    with LocalFederation(spec) as federation:
        federation.start()
        for index in range(clients):
            federation.node_id(index, timeout=timeout)
        if setup.executor == "warm":
            for index in range(clients):
                federation.wait_for_warm_executor(index, timeout=timeout)
        yield federation


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def idle_superlink_cpu(federation: LocalFederation, seconds: float) -> float:
    """The SuperLink's CPU seconds per second while every SuperNode sits idle."""
    pid = federation.superlink.pid
    before, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - start)


def time_real(
    arguments: argparse.Namespace, home: Path, federation: LocalFederation, setup: Setup
) -> Real:
    """The job on ``federation``'s SuperNodes, set up as ``setup``."""
    overrides = job_overrides(
        arguments, federation.spec.num_supernodes, f"real-{setup.label}", home / "outputs"
    )
    real = Real(setup, Timing())
    if arguments.idle_seconds > 0:
        real.idle_cpu = idle_superlink_cpu(federation, arguments.idle_seconds)
    total, output = flwr_run_on(federation, overrides, arguments.timeout)
    seconds = [row["round-seconds"] for row in metrics_rows(overrides) if "round-seconds" in row]
    if len(seconds) != arguments.rounds:
        real.timing = Timing(
            total=total, error=f"{len(seconds)} round(s) recorded:\n{output[-2000:]}"
        )
    else:
        real.timing = Timing(first=seconds[0], later=seconds[1:], total=total)
    return real


def time_simulation(arguments: argparse.Namespace, home: Path) -> Timing:
    """The job in Flower's simulation (``simulation_overhead``'s ``flwr run``)."""
    overrides = job_overrides(arguments, arguments.clients, "simulation", home / "outputs")
    spec = FederationSpec(0, home / "simulation", port=free_port(), insecure=True, simulation=True)
    with LocalFederation(spec) as federation:
        federation.start_superlink(timeout=60)
        return overhead.flwr_run(
            spec.environment(),
            APP,
            Case(arguments.clients, 1.0),
            arguments.client_threads,
            overrides,
            arguments.timeout,
        )


def time_plain(arguments: argparse.Namespace, home: Path) -> Timing:
    """The job as a plain loop in this process."""
    overrides = job_overrides(arguments, arguments.clients, "plain", home / "outputs")
    cfg = RunConfig.from_mapping({**app_defaults(APP), **overrides})
    threads = torch.get_num_threads()
    torch.set_num_threads(arguments.client_threads)
    try:
        return overhead.time_plain(cfg, arguments.clients)
    finally:
        torch.set_num_threads(threads)  # main() may run inside another program


def cold_start(samples: int) -> ColdStart:
    """Fresh interpreters importing torch alone and fedx.client_app, alternating."""
    result = ColdStart()
    for _ in range(samples):
        for statement, times in (
            ("import torch", result.torch),
            ("import fedx.client_app", result.client_app),
        ):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", statement], check=True, timeout=600)
            times.append(time.perf_counter() - start)
    return result


def secure_round(
    arguments: argparse.Namespace, home: Path, federation: LocalFederation, setup: Setup
) -> Secure:
    """FedMR with secure recombination on ``federation``'s 4 SuperNodes; ``secure-seconds`` per round."""
    secure = Secure(setup)
    overrides = job_overrides(arguments, 4, f"secure-{setup.label}", home / "outputs")
    overrides.update(
        {
            "num-server-rounds": arguments.secure_rounds,
            "local-epochs": 1,
            "eval-every": arguments.secure_rounds,
            "secure-recombination": True,
        }
    )
    secure.total, output = flwr_run_on(federation, overrides, arguments.timeout)
    rows = metrics_rows(overrides)
    secure.seconds = [row["secure-seconds"] for row in rows if "secure-seconds" in row]
    secure.exchanges = [int(row["secure-exchanges"]) for row in rows if "secure-exchanges" in row]
    if len(secure.seconds) != arguments.secure_rounds:
        secure.error = f"{len(secure.seconds)} round(s) recorded:\n{output[-2000:]}"
    return secure


def run_setup(
    arguments: argparse.Namespace, home: Path, setup: Setup
) -> tuple[Real, Secure | None]:
    """The job, then the secure rounds, on federations set up as ``setup``.

    With ``--clients 4`` both run on one federation; otherwise the secure
    rounds get one of 4 SuperNodes of their own.
    """
    secure = None
    with federation_of(
        home / f"{setup.label}-{arguments.clients}",
        arguments.clients,
        setup,
        arguments.client_threads,
    ) as federation:
        real = time_real(arguments, home, federation, setup)
        if not arguments.skip_secure and arguments.clients == 4:
            secure = secure_round(arguments, home, federation, setup)
    if not arguments.skip_secure and secure is None:
        with federation_of(
            home / f"{setup.label}-4", 4, setup, arguments.client_threads
        ) as federation:
            secure = secure_round(arguments, home, federation, setup)
    return real, secure


# ----------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------


def _text(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _ratio(numerator: float | None, denominator: float | None) -> str:
    return f"{numerator / denominator:.2f}" if numerator and denominator else ""


def flower_baseline(runs: Sequence[Real] | Sequence[Secure]):
    """The run of Flower as shipped (setup ``flower``) among ``runs``, if it was measured."""
    return next((run for run in runs if run.setup == FLOWER_AS_SHIPPED), None)


def print_job(report: Report) -> None:
    """One line per way of running the job, with its ratios to the simulation, the plain loop
    and Flower as shipped."""
    simulation = report.simulation.per_round if report.simulation else None
    plain = report.plain.per_round if report.plain else None
    baseline = flower_baseline(report.real)
    flower = baseline.timing.per_round if baseline else None
    rows = [("plain loop", report.plain, None), ("simulation", report.simulation, None)]
    rows += [(real.setup.description, real.timing, real.idle_cpu) for real in report.real]
    print(
        f"{'':<46}{'s/round':>9}{'/sim':>7}{'/plain':>8}{'/flower':>9}{'round 1 s':>11}"
        f"{'whole run s':>13}{'idle SuperLink CPU':>20}"
    )
    for label, timing, idle in rows:
        if timing is None:
            continue
        idle_text = "" if idle is None else f"{100 * idle:.1f}%"
        print(
            f"{label:<46}{_text(timing.per_round):>9}{_ratio(timing.per_round, simulation):>7}"
            f"{_ratio(timing.per_round, plain):>8}{_ratio(timing.per_round, flower):>9}"
            f"{_text(timing.first):>11}{_text(timing.total, 1):>13}{idle_text:>20}"
        )
        common.print_error(timing.error, label)


def print_cold(cold: ColdStart) -> None:
    print(
        f"cold start, fresh interpreters, {len(cold.torch)} each: import torch median "
        f"{statistics.median(cold.torch):.2f} s (min {min(cold.torch):.2f}), import "
        f"fedx.client_app median {statistics.median(cold.client_app):.2f} s (min "
        f"{min(cold.client_app):.2f}): ratio {cold.ratio:.2f}"
    )


def print_secure(secure: Secure, baseline: Secure | None) -> None:
    rounds = ", ".join(f"{s:.1f}" for s in secure.seconds)
    ratio = ""
    if baseline is not None and baseline is not secure and secure.per_round and baseline.per_round:
        ratio = f", {baseline.per_round / secure.per_round:.1f}x faster than {baseline.setup.label}"
    elif secure is baseline:
        ratio = " (the baseline: Flower as shipped)"
    print(
        f"secure recombination, 4 SuperNodes, {secure.setup.description}: secure stage "
        f"{_text(secure.per_round)} s/round{ratio} (rounds: {rounds}; exchanges per round "
        f"{secure.exchanges}); whole run {_text(secure.total, 1)} s"
    )
    common.print_error(secure.error)


# ----------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------


def _setup(text: str) -> Setup:
    executor, *rest = text.split(":")
    database = "memory" if rest and rest[-1] == "memory" else "file"
    if database == "memory":
        rest.pop()
    if len(rest) > 1:
        raise ValueError(text)
    return Setup(executor, float(rest[0]) if rest else None, database)


#: ``warm``, ``warm:0.1`` or ``warm:0.1:memory`` as a :class:`Setup`.
parse_setup = common.option_type(
    "EXECUTOR[:SECONDS][:memory]",
    _setup,
    valid=lambda setup: (
        setup.executor in EXECUTORS and (setup.poll is None or 0.01 <= setup.poll <= 3)
    ),
    rule=f"EXECUTOR in {EXECUTORS} and SECONDS in [0.01, 3]",
)


def add_job_options(parser: argparse.ArgumentParser, rounds: int) -> None:
    """The job's options (clients, their torch threads, rounds, epochs ...), here and in message_timeline.py."""
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument(
        "--client-threads",
        type=int,
        default=1,
        help="torch threads of each client, every way of running (default: 1)",
    )
    common.add_job_options(parser, rounds=rounds, rounds_help="rounds of the job (at least 2)")


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options; ``--quick`` changes the defaults."""
    parser = common.benchmark_parser(__doc__)
    common.add_list_option(
        parser,
        "--setups",
        parse_setup,
        DEFAULT_SETUPS,
        "real-process runs, EXECUTOR[:POLL]",
        nargs="*",
    )
    parser.add_argument("--skip-simulation", action="store_true")
    parser.add_argument("--skip-plain", action="store_true")
    parser.add_argument("--skip-secure", action="store_true")
    add_job_options(parser, rounds=5)
    parser.add_argument("--secure-rounds", type=int, default=3)
    parser.add_argument("--cold-samples", type=int, default=3, help="0 skips the cold start")
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=20.0,
        help="how long to measure the SuperLink with idle SuperNodes (0: not)",
    )
    arguments = common.parse_quick(
        parser,
        argv,
        "4 clients, 2 rounds of 1 epoch on warm:0.1:memory only (the secure round on "
        "the same SuperNodes), no simulation, 1 secure round, "
        "1 cold-start sample, 3 s idle",
        setups=[parse_setup("warm:0.1:memory")],
        skip_simulation=True,
        rounds=2,
        clients=4,
        local_epochs=1,
        secure_rounds=1,
        cold_samples=1,
        idle_seconds=3.0,
        timeout=600.0,
    )
    common.check_job_options(parser, arguments, APP)
    return arguments


def _attempt(what: str, step, failed):
    """``step()``, or ``failed(error)`` after printing the traceback (a report, not a test)."""
    started = time.monotonic()
    try:
        result = step()
    except Exception as err:  # pylint: disable=broad-exception-caught
        traceback.print_exc()
        result = failed(repr(err))
    print(f"  {what}: {time.monotonic() - started:.0f} s; {common.load_text()}", flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> Report:
    """Run the benchmark, print what it measured; return it."""
    arguments = parse_arguments(argv)
    report = Report()
    print(
        f"FedMR on digits, cnn, IID, {arguments.clients} clients, {common.rounds_text(arguments)}; "
        f"{arguments.client_threads} torch thread(s) per client; {os.cpu_count()} cores, shared "
        f"with whatever else runs ({common.load_text()} at start)",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="fedx-deployment-") as directory:
        home = Path(directory)
        if not arguments.skip_plain:
            report.plain = _attempt(
                "plain loop", lambda: time_plain(arguments, home), lambda e: Timing(error=e)
            )
        if not arguments.skip_simulation:
            report.simulation = _attempt(
                "simulation", lambda: time_simulation(arguments, home), lambda e: Timing(error=e)
            )
        secure: list[Secure | None] = []
        for setup in arguments.setups:
            real, secure_run = _attempt(
                setup.description,
                lambda s=setup: run_setup(arguments, home, s),
                lambda e, s=setup: (
                    Real(s, Timing(error=e)),
                    None if arguments.skip_secure else Secure(s, error=e),
                ),
            )
            report.real.append(real)
            secure.append(secure_run)
        print_job(report)
        if arguments.cold_samples > 0:
            report.cold = cold_start(arguments.cold_samples)
            print_cold(report.cold)
        report.secure = [run for run in secure if run is not None]
        for run in report.secure:
            print_secure(run, flower_baseline(report.secure) or report.secure[0])
    print(f"{common.load_text()} at the end")
    return report
