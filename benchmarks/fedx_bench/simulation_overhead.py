"""Measure what Flower's simulation adds to a round: `flwr run` against a plain loop.

For each case (N clients, a training fraction) and strategy (FedAvg, FedMR)
the same federated training runs twice, and both report seconds per round:

* simulation: ``flwr run <this repository> --stream`` against a simulation
  SuperLink this script starts on free ports (``fedx.deploy.local``,
  ``FederationSpec(..., simulation=True)``), with ``--federation-config
  "num-supernodes=N client-resources-num-cpus=C"``. The per-round times are
  the ``round-seconds`` the fedx ServerApp writes to ``metrics.json``
  (training and the round's checkpoint, central evaluation excluded). The
  whole ``flwr run`` wall time is reported as well.
* plain loop: one process, the same run config, the same IID partitions
  (``fedx.data.load_partition``) in the same batches (``fedx.data.batch_loader``,
  as the ClientApp's), the same model (``fedx.models``), the same
  ``fedx.training.train`` call per sampled client (one model object reused,
  torch seeded per client as the ClientApp does), the same clients sampled
  (the strategies' own rules and seeds) and the same server operation
  (``fedx.ops.average`` for FedAvg; ``recombine`` and the global mean for
  FedMR), timed per round.

Round 1 is reported on its own: it includes the simulation's start-up (Ray
workers, imports, loading data), and the plain loop's first data loading.
"Per round" is the mean of rounds 2 to R; the ratio is simulation over
plain loop. The defaults: digits with the app's ``cnn`` and the
pyproject.toml training settings, IID partitions, 10 clients training all
(fraction 1.0), 100 clients with fraction 0.1 (K = 10 per round) and 1.0
(all 100), 5 rounds. ``--cases`` chooses others.

``--app`` runs other copies of the app instead of this repository (other
versions of fedx, for a before/after comparison: ``git archive <commit> |
tar -x -C <folder>``): for every case and strategy each app runs in turn,
then the plain loop (of this script's fedx) once, so that a drift of the
machine's load touches them alike. Each row shows the 1-minute load average
when its run ended (``os.getloadavg``): on a machine shared with other work,
compare only rows of one run taken at similar loads.

Threads: each simulated client gets ``--client-cpus`` CPUs (Ray then runs up
to cores / C clients at once, and gives each C torch threads). The plain
loop trains one client after the other with as many torch threads as one
simulated client has (``--plain-threads`` changes it; 0 keeps torch's
default, all cores). On a machine whose cores are busy with something else,
torch's default can make the plain loop several times slower.

The SuperLink, with everything it started, is stopped at the end; the
script then follows the processes that carry this federation's private
``FLWR_HOME`` in their environment (SuperLink, SuperExec, simulation, Ray):
it lists those alive right after the stop, waits up to ``--grace`` seconds
for them to end and lists any still running (there should be none).

Usage::

    python benchmarks/simulation_overhead.py                  # the cases above
    python benchmarks/simulation_overhead.py --cases 10:1.0 100:0.1 --rounds 4
    python benchmarks/simulation_overhead.py --strategies fedavg --local-epochs 1
    python benchmarks/simulation_overhead.py --quick          # 10 clients, 3 rounds, 1 epoch
    python benchmarks/simulation_overhead.py --cases 100:0.1 --app /tmp/fedx-main --app /tmp/fedx-new

This script reports; it is not a test, and it always exits with status 0.
"""

import argparse
import json
import os
import random
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedx.compare.plan import app_defaults
from fedx.compare.runner import toml_value
from fedx.config import RunConfig
from fedx.data import batch_loader, dataset_info, load_partition
from fedx.deploy.local import FederationSpec, LocalFederation, free_port
from fedx.models import build_model
from fedx.ops import Model, average, recombine
from fedx.outputs import METRICS_FILE
from fedx.training import get_device, train

from fedx_bench import common

APP = common.REPO
STRATEGIES = ("fedavg", "fedmr")


@dataclass(frozen=True)
class Case:
    """N simulated clients, of which ``fraction`` train each round."""

    clients: int
    fraction: float

    @property
    def label(self) -> str:
        """``N=100 f=0.1`` style."""
        return f"N={self.clients} f={self.fraction:g}"


@dataclass
class Timing:
    """Seconds of one run: round 1, the rounds after it, and the whole run."""

    first: float | None = None
    later: list[float] | None = None
    total: float | None = None
    error: str | None = None

    @property
    def per_round(self) -> float | None:
        """Mean seconds of rounds 2 to R."""
        return float(np.mean(self.later)) if self.later else None


# ----------------------------------------------------------------------
# Run configuration
# ----------------------------------------------------------------------


def run_overrides(arguments: argparse.Namespace, case: Case, strategy: str, output: Path) -> dict:
    """The run-config keys this benchmark sets; everything else keeps its default."""
    return {
        "strategy": strategy,
        "num-server-rounds": arguments.rounds,
        "seed": arguments.seed,
        "partitioning": "iid",
        "fraction-train": case.fraction,
        "min-available-nodes": case.clients,
        "fraction-evaluate": 0.0,
        # Central evaluation is left out of round-seconds; once, at the end, is enough.
        "eval-every": arguments.rounds,
        "local-epochs": arguments.local_epochs,
        "round-timeout": 1800.0,
        "run-name": f"{strategy}-{case.clients}-{case.fraction:g}",
        "output-dir": str(output),
    }


def run_config_argument(overrides: dict) -> str:
    """``key=value ...`` for ``flwr run --run-config``."""
    return " ".join(f"{key}={toml_value(value)}" for key, value in overrides.items())


# ----------------------------------------------------------------------
# The plain loop
# ----------------------------------------------------------------------


Sampler = Callable[[], list[int]]


def fedavg_sampler(cfg: RunConfig, num_clients: int) -> Sampler:
    """Flower's FedAvg rule: ``random.sample`` of max(N f, min) clients, seeded as the app does."""
    rng = random.Random(cfg.seed)
    size = max(int(num_clients * cfg.fraction_train), cfg.min_train_nodes)

    def sample() -> list[int]:
        return rng.sample(range(num_clients), size)

    return sample


def fedmr_sampler(cfg: RunConfig, num_clients: int) -> tuple[Sampler, np.random.Generator]:
    """fedx's multi-model sampling (positions in the client-ordered node list), FedMR's stream."""
    sampling, method, _ = np.random.SeedSequence(cfg.seed).spawn(3)
    sampling_rng, method_rng = np.random.default_rng(sampling), np.random.default_rng(method)
    size = min(max(int(num_clients * cfg.fraction_train), cfg.min_train_nodes), num_clients)

    def sample() -> list[int]:
        return [int(p) for p in sampling_rng.choice(num_clients, size=size, replace=False)]

    return sample, method_rng


def local_training(
    cfg: RunConfig,
    model: torch.nn.Module,
    weights: Model,
    client: int,
    num_clients: int,
    server_round: int,
) -> tuple[Model, int]:
    """What the ClientApp does with one training message: train on the client's share."""
    torch.manual_seed(cfg.seed * 1_000_003 + server_round * 1009 + client)
    partition = load_partition(cfg.dataset, client, num_clients, **cfg.partition_settings())
    model.load_state_dict({name: torch.from_numpy(array) for name, array in weights.items()})
    train(
        model,
        batch_loader(partition, cfg.batch_size, shuffle=True),
        epochs=cfg.local_epochs,
        learning_rate=cfg.learning_rate,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        device=get_device(),
    )
    trained = {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()}
    return trained, len(partition)


def plain_loop(cfg: RunConfig, num_clients: int) -> list[float]:
    """Run the strategy's rounds in this process; return the seconds of every round."""
    info = dataset_info(cfg.dataset)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, info.input_shape, info.num_classes)
    initial = {name: tensor.numpy().copy() for name, tensor in model.state_dict().items()}
    if cfg.strategy == "fedavg":
        sample, method_rng = fedavg_sampler(cfg, num_clients), None
    else:
        sample, method_rng = fedmr_sampler(cfg, num_clients)
    global_model, pool = initial, []
    seconds = []
    for server_round in range(1, cfg.num_server_rounds + 1):
        start = time.perf_counter()
        clients = sample()
        pool = pool or [initial] * len(clients)
        sent = [global_model] * len(clients) if method_rng is None else pool
        results = [
            local_training(cfg, model, weights, client, num_clients, server_round)
            for client, weights in zip(clients, sent, strict=True)
        ]
        trained = [weights for weights, _ in results]
        if method_rng is None:
            global_model = average(trained, weights=[examples for _, examples in results])
        else:
            pool = recombine(trained, method_rng, grouping=cfg["grouping"])
            global_model = average(trained)
        seconds.append(time.perf_counter() - start)
    return seconds


def time_plain(cfg: RunConfig, num_clients: int) -> Timing:
    """The plain loop's round times, as a :class:`Timing`."""
    start = time.perf_counter()
    seconds = plain_loop(cfg, num_clients)
    return Timing(first=seconds[0], later=seconds[1:], total=time.perf_counter() - start)


# ----------------------------------------------------------------------
# The simulation
# ----------------------------------------------------------------------


def flwr_run(
    env: dict, app: Path, case: Case, client_cpus: float, overrides: dict, timeout: float
) -> Timing:
    """``flwr run`` the app in the simulation; round times from its ``metrics.json``."""
    federation = f"num-supernodes={case.clients} client-resources-num-cpus={client_cpus:g}"
    command = common.flwr_run_command(app, federation, run_config_argument(overrides))
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return Timing(error=f"flwr run did not finish within {timeout:g}s")
    total = time.perf_counter() - start
    metrics = Path(overrides["output-dir"]) / overrides["run-name"] / METRICS_FILE
    rounds = json.loads(metrics.read_text())["rounds"] if metrics.exists() else []
    seconds = [row["round-seconds"] for row in rounds if "round-seconds" in row]
    if done.returncode != 0 or len(seconds) != overrides["num-server-rounds"]:
        tail = (done.stdout + done.stderr)[-2000:]
        return Timing(
            total=total,
            error=f"flwr run exited {done.returncode} with "
            f"{len(seconds)} round(s) recorded:\n{tail}",
        )
    return Timing(first=seconds[0], later=seconds[1:], total=total)


def federation_processes(flwr_home: Path) -> dict[int, str]:
    """Live processes started for this federation, by pid (Linux ``/proc``).

    Every process the SuperLink starts (SuperExec, the simulation, Ray's
    processes and workers) inherits its ``FLWR_HOME``, which is unique to
    this run, so other Flower runs on the machine are never counted.
    """
    marker = f"FLWR_HOME={flwr_home.resolve()}".encode()
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if state != "Z":
            found[int(entry.name)] = command.strip()
    return found


# ----------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------


def seconds_text(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


@dataclass
class Row:
    """One case and strategy: the simulation of one app against the plain loop."""

    case: Case
    strategy: str
    app: int  # position in the --app list
    simulation: Timing
    plain: Timing
    load: float  # 1-minute load average when the simulation ended

    @property
    def ratio(self) -> float | None:
        """Simulation over plain loop, per round."""
        if self.simulation.per_round and self.plain.per_round:
            return self.simulation.per_round / self.plain.per_round
        return None


def print_row(row: Row) -> None:
    """One line: per-round seconds of both, their ratio, round 1, the run's wall time, the load."""
    ratio = "" if row.ratio is None else f"{row.ratio:.2f}"
    simulation, plain = row.simulation, row.plain
    print(
        f"{row.case.label:<14}{row.strategy:<8}{row.app:>4}{seconds_text(simulation.per_round):>10}"
        f"{seconds_text(plain.per_round):>10}{ratio:>8}{seconds_text(simulation.first):>10}"
        f"{seconds_text(plain.first):>10}{seconds_text(simulation.total):>11}"
        f"{seconds_text(plain.total):>10}{row.load:>7.1f}",
        flush=True,
    )
    common.print_error(simulation.error, "simulation")


def print_header(arguments: argparse.Namespace) -> None:
    print(
        f"digits, cnn, IID; {common.rounds_text(arguments)}; plain loop: torch "
        f"{torch.get_num_threads()} thread(s) on {get_device()}; simulation: "
        f"client-resources-num-cpus={arguments.client_cpus:g} on {os.cpu_count()} cores"
    )
    for number, app in enumerate(arguments.app):
        print(f"  app {number}: {app}")
    print(f"{'':26}{'s/round':>20}{'':>8}{'round 1 s':>20}{'whole run s':>21}")
    print(
        f"{'case':<14}{'strategy':<8}{'app':>4}{'flower':>10}{'plain':>10}{'ratio':>8}"
        f"{'flower':>10}{'plain':>10}{'flwr run':>11}{'plain':>10}{'load':>7}"
    )


# ----------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------


def _case(text: str) -> Case:
    clients, fraction = text.split(":")
    return Case(int(clients), float(fraction))


#: ``N:fraction`` (``100:0.1``) as a :class:`Case`.
parse_case = common.option_type(
    "N:fraction such as 100:0.1",
    _case,
    valid=lambda case: case.clients >= 2 and 0.0 < case.fraction <= 1.0,
    rule="N >= 2 and a fraction in (0, 1]",
)


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options; ``--quick`` changes the defaults of cases, rounds and epochs."""
    parser = common.benchmark_parser(__doc__)
    common.add_list_option(
        parser, "--cases", parse_case, ("10:1.0", "100:0.1", "100:1.0"), "N:fraction per case"
    )
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    common.add_job_options(parser, rounds=5, rounds_help="rounds per run (at least 2)")
    parser.add_argument(
        "--client-cpus",
        type=float,
        default=1.0,
        help="client-resources-num-cpus of the simulation (default: 1)",
    )
    parser.add_argument(
        "--plain-threads",
        type=int,
        default=None,
        help="torch threads of the plain loop (default: --client-cpus; 0: torch's)",
    )
    common.add_app_option(parser)
    parser.add_argument(
        "--grace",
        type=float,
        default=60.0,
        help="seconds to wait for the federation's processes to end after the stop",
    )
    arguments = common.parse_quick(
        parser,
        argv,
        "10 clients (fraction 1.0), 3 rounds, 1 local epoch",
        cases=[Case(10, 1.0)],
        rounds=3,
        local_epochs=1,
        timeout=600.0,
    )
    common.check_job_options(parser, arguments, APP)
    if arguments.plain_threads is None:
        arguments.plain_threads = max(1, int(arguments.client_cpus))
    arguments.app = arguments.app or [APP]
    return arguments


@dataclass
class Report:
    """Everything a run of the benchmark measured."""

    rows: list[Row]
    processes_while_running: int  # the federation's processes just before it stopped
    after_stop: dict[int, str]  # those alive right after LocalFederation stopped it
    left: dict[int, str]  # those still alive after the grace period
    gone_after: float | None  # seconds after the stop when none was left; None: some still are


def wait_until_gone(flwr_home: Path, grace: float) -> tuple[dict[int, str], float | None]:
    """Poll the federation's processes for up to ``grace`` seconds after the stop.

    Returns the processes still alive at the end and when the last one was
    gone (None when some still are).
    """
    start = time.monotonic()
    while True:
        alive = federation_processes(flwr_home)
        elapsed = time.monotonic() - start
        if not alive:
            return {}, elapsed
        if elapsed >= grace:
            return alive, None
        time.sleep(0.5)


def run_all(arguments: argparse.Namespace, home: Path) -> Report:
    """Start the SuperLink, run every case both ways, stop the SuperLink and check."""
    rows = []
    spec = FederationSpec(0, home / "superlink", port=free_port(), insecure=True, simulation=True)
    with LocalFederation(spec) as federation:
        federation.start_superlink(timeout=60)
        for case in arguments.cases:
            for strategy in arguments.strategies:
                overrides = run_overrides(arguments, case, strategy, home / "outputs")
                runs = []
                for number, app in enumerate(arguments.app):
                    simulation = flwr_run(
                        spec.environment(),
                        app,
                        case,
                        arguments.client_cpus,
                        {**overrides, "run-name": f"{overrides['run-name']}-app{number}"},
                        arguments.timeout,
                    )
                    runs.append((number, simulation, os.getloadavg()[0]))
                cfg = RunConfig.from_mapping({**app_defaults(APP), **overrides})
                try:
                    plain = time_plain(cfg, case.clients)
                except Exception as err:  # a report, not a test: show the failure and go on
                    traceback.print_exc()
                    plain = Timing(error=repr(err))
                for number, simulation, load in runs:
                    row = Row(case, strategy, number, simulation, plain, load)
                    print_row(row)
                    rows.append(row)
                common.print_error(plain.error, "plain loop")
        running = len(federation_processes(spec.flwr_home))
    after_stop = federation_processes(spec.flwr_home)
    left, gone_after = wait_until_gone(spec.flwr_home, arguments.grace)
    return Report(rows, running, after_stop, left, gone_after)


def main(argv: Sequence[str] | None = None) -> Report:
    """Run the benchmark, print its table; return what it measured."""
    arguments = parse_arguments(argv)
    threads = torch.get_num_threads()
    if arguments.plain_threads > 0:
        torch.set_num_threads(arguments.plain_threads)
    try:
        print_header(arguments)
        with tempfile.TemporaryDirectory(prefix="fedx-overhead-") as directory:
            report = run_all(arguments, Path(directory))
    finally:
        torch.set_num_threads(threads)  # main() may run inside another program
    print(
        f"processes of the federation: {report.processes_while_running} before stopping it, "
        f"{len(report.after_stop)} right after"
    )
    for pid, command in sorted(report.after_stop.items()):
        print(f"  alive after the stop: {pid} {command[:160]}")
    if report.gone_after is not None:
        print(f"none left running {report.gone_after:.1f}s after the stop")
    for pid, command in sorted(report.left.items()):
        print(f"  STILL RUNNING after {arguments.grace:g}s: {pid} {command[:160]}")
    return report
