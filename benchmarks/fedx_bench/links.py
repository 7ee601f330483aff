"""Rounds over slow, distant links: a ResNet-20- and a VGG-16-sized round against the floor.

The hosts (``benchmarks/fedx_bench/slow_links.py``): the SuperLink on a host of its own,
each of ``--supernodes`` K SuperNodes on a site of its own, every host on a
link of its own to a router, each direction of each link limited to
``--rate`` Mbit/s (default 100) by ``tc tbf``, and the router's relay
holding every byte ``--delay`` seconds each way (default 25 ms: a round
trip of 50 ms) between the sites and the SuperLink.

The job: the numpy test app (``tests/wire_app``) with ``model=resnet20`` or
``model=vgg16``: FedMR, every node in every round, sends each node its pool
model holding exactly that fedx model's state dict (names, shapes, dtypes;
ResNet-20 1.10 MB in 128 arrays, VGG-16 61.0 MB in 32 arrays), packed
(one array per model, :mod:`fedx.arrays`) as fedx's ServerApp sends it to
fedx's ClientApp, or as a standard ``ArrayRecord`` (``+wire=standard``); the ClientApp changes every array by one step
without training (a numpy add: a few ms for ResNet-20, ~50 ms for VGG-16),
so that all of it crosses back, and replies. A round is then the transfer
and the fixed costs of an exchange. Seconds per round: the mean of rounds 2
to R (``--rounds``, default 4) of the ServerApp's own clock between round
ends (round 1 also pays the start-up).

The floor of a round, what no protocol can beat on these links::

    floor = 2 · K·M / B  +  2 · RTT

* M: the model's bytes (its arrays' bytes); B: ``--rate``; RTT: twice
  ``--delay``.
* The bottleneck is the SuperLink's link: it carries K·M down (the K
  instructions) and K·M up (the K replies), a site's link M each way. The
  ServerApp sends all instructions at once and the link is shared, so the
  replies' K·M follow the instructions' K·M: 2·K·M/B. (Serving the nodes one
  at a time would overlap one node's reply with the next node's
  instruction, (K+1)·M/B; no federated system does that, and the floor here
  does not assume it.)
* The exchange hops over the long links: SuperLink → SuperNode (the
  instruction) and SuperNode → SuperLink (the reply), one round trip each
  at least (a pull: the request, then the data; a push: the data, then its
  acknowledgment). The ServerApp's hop to the SuperLink and the ClientApp's
  to its SuperNode are on one host each: no delay, no limit, not in the
  floor.
* Ethernet, IP and TCP headers (1514 bytes on the link for 1448 of data)
  and HTTP and Flower's framing are not in M: they are part of what a
  protocol costs over the floor. The benchmark prints what the SuperLink's
  link carried as ``tc`` counts it.

Setups, each on a fresh federation on the same hosts (``--setups``; a setup
is a base and ``+``-joined levers):

* ``fast``: fedx's fast setup, the README's: the warm executor, 0.1 s polls,
  the SuperLink in memory and its middleware scoped (``fedx-deploy up
  --executor warm --poll-interval 0.1 --superlink-database memory
  --superlink fedx``), models packed;
* ``flower``: Flower's executor and polls, the SuperLink in memory, models
  standard;
* ``+wire=packed|standard``: how models travel: packed, one array per model
  (the ServerApp asks the nodes whether they read it, as fedx's does), or
  as standard ``ArrayRecord`` s, one array each;
* ``+inflight=N``: fedx's ``objects_in_flight`` (``fedx-deploy up
  --objects-in-flight N``): every process pulls and pushes N objects of a
  message at once (:mod:`fedx.flower.objects_in_flight`; Flower: 2);
* ``+flwr-inflight=N``: Flower's own ``FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PULLS``
  and ``..._PUSHES`` set to N in every process, which Flower caps at the
  process's cores (2 here);
* ``+superlink=flower``: ``flower-superlink`` as shipped instead of
  ``fedx-superlink``, Flower's SuperLink with its HTTP middleware scoped
  to the requests it acts on (:mod:`fedx.flower.superlink_middleware`);
* ``+chunk=MB``: Flower's ``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE`` (5 MB):
  arrays larger than it travel as several objects.

For each setup it prints seconds per round, the floor and the ratio, the
requests the SuperNodes sent the SuperLink per round (counted by the relay,
by kind), the bytes the SuperLink's link carried per round over K·M each
way, and what the SuperLink process held: its peak resident memory and
threads during the run. Before the rounds it measures the links themselves
(a round trip through the relay and a 10 MB transfer from a site to the
SuperLink's host): on a busy machine the relay itself may fall short of the
rate, and then the floor is out of reach for reasons of the machine.

Usage::

    python benchmarks/links.py                                  # resnet20, vgg16; fast and its levers
    python benchmarks/links.py --models resnet20 --setups fast fast+inflight=16
    python benchmarks/links.py --quick                          # resnet20, 2 SuperNodes, 3 rounds, fast

Needs root and iproute2 (network namespaces, ``tc``). It reports; it is
not a test, and it always exits with status 0.
"""

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from fedx_bench import common, slow_links

APP = common.REPO / "tests" / "wire_app"
MODELS = ("resnet20", "vgg16")
DEFAULT_SETUPS = (
    "fast+inflight=4+wire=standard",
    "fast+inflight=4",
    "fast+wire=standard",
    "fast",
)
#: Flower's own settings, read when its modules are imported.
FLOWER_PULLS, FLOWER_PUSHES = (
    "FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PULLS",
    "FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PUSHES",
)
FLOWER_CHUNK = "FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE"
MB = 1e6


@dataclass(frozen=True)
class Setup:
    """A base (``fast`` or ``flower``) and its levers, as given on the command line."""

    label: str

    @property
    def base(self) -> str:
        return self.label.split("+", 1)[0]

    @property
    def levers(self) -> dict[str, str]:
        return dict(part.split("=", 1) for part in self.label.split("+")[1:])

    def spec_options(self) -> dict:
        """What the base and fedx's levers set on :class:`fedx.deploy.local.FederationSpec`."""
        options: dict = {
            "executor": "flower",
            "poll_interval": None,
            "superlink_database": "memory",
        }
        if self.base == "fast":
            options.update(executor="warm", poll_interval=0.1, superlink="fedx")
        if "superlink" in self.levers:
            options["superlink"] = self.levers["superlink"]
        if "inflight" in self.levers:
            options["objects_in_flight"] = int(self.levers["inflight"])
        return options

    def environment(self) -> dict[str, str]:
        """What the levers set in every process's environment."""
        environment = {"OMP_NUM_THREADS": "1"}
        for lever, value in self.levers.items():
            if lever == "flwr-inflight":
                environment[FLOWER_PULLS] = environment[FLOWER_PUSHES] = value
            elif lever == "chunk":
                environment[FLOWER_CHUNK] = str(int(float(value) * MB))
        return environment

    @property
    def wire(self) -> str:
        """How models travel: ``packed`` (the fast base) or ``standard``."""
        return self.levers.get("wire", "packed" if self.base == "fast" else "standard")


def setup_type(text: str) -> Setup:
    """A ``--setups`` entry, checked."""
    setup = Setup(text)
    if setup.base not in ("fast", "flower"):
        raise argparse.ArgumentTypeError(f"a setup starts with fast or flower, got {text!r}")
    try:
        levers = setup.levers
    except ValueError:
        raise argparse.ArgumentTypeError(f"levers are +NAME=VALUE, got {text!r}") from None
    for lever, value in levers.items():
        if lever not in ("flwr-inflight", "inflight", "chunk", "superlink", "wire"):
            raise argparse.ArgumentTypeError(f"unknown lever {lever!r} in {text!r}")
        if lever == "superlink":
            if value not in ("flower", "fedx"):
                raise argparse.ArgumentTypeError(f"superlink is flower or fedx in {text!r}")
        elif lever == "wire":
            if value not in ("packed", "standard"):
                raise argparse.ArgumentTypeError(f"wire is packed or standard in {text!r}")
        elif not float(value) > 0:
            raise argparse.ArgumentTypeError(f"{lever} must be positive in {text!r}")
    return setup


@dataclass
class Floor:
    """The floor of a round and its parts."""

    model_bytes: int
    supernodes: int
    rate_mbit: float
    delay: float

    @property
    def transfer(self) -> float:
        """2 · K·M / B: the SuperLink's link, down then up."""
        return 2 * self.supernodes * self.model_bytes * 8 / (self.rate_mbit * 1e6)

    @property
    def round_trips(self) -> float:
        """One round trip per long hop: the instruction's and the reply's."""
        return 2 * 2 * self.delay

    @property
    def seconds(self) -> float:
        return self.transfer + self.round_trips


@dataclass
class Outcome:
    """One setup's run: round seconds and what the links and the SuperLink saw."""

    setup: Setup
    rounds: list[float] = field(default_factory=list)  # rounds 2..R
    first: float | None = None
    # From round 2's start to the run's end:
    requests: dict[str, int] = field(default_factory=dict)  # all routes, by kind
    link: dict[str, int] = field(default_factory=dict)  # bytes on the SuperLink's link, each way
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds by host/program
    superlink_rss: int = 0
    superlink_threads: int = 0

    @property
    def superlink_cpu(self) -> float:
        """CPU seconds of the SuperLink's process (its host's ``*superlink`` program)."""
        return sum(
            seconds
            for name, seconds in self.cpu.items()
            if name.startswith(f"{slow_links.LINK}/") and name.endswith("superlink")
        )

    error: str | None = None

    @property
    def per_round(self) -> float | None:
        return statistics.mean(self.rounds) if self.rounds else None


# ----------------------------------------------------------------------
# Measurements
# ----------------------------------------------------------------------


class PeakSampler:
    """Samples a process's resident memory and threads every ``interval`` s, keeping the peaks."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.process, self.interval = psutil.Process(pid), interval
        self.rss = self.threads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.rss = max(self.rss, self.process.memory_info().rss)
                self.threads = max(self.threads, self.process.num_threads())
            except psutil.Error:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Snapshot:
    """What the relay, the links and the hosts' processes had counted at one moment."""

    relayed: dict[str, dict]
    carried: dict[str, int]
    cpu: dict[str, float]

    @classmethod
    def take(cls, wan: slow_links.Wan) -> "Snapshot":
        assert wan.relay is not None
        return cls(wan.relay.stats(), wan.link_bytes()[slow_links.LINK], wan.cpu_seconds())


def record_between(outcome: "Outcome", first: Snapshot, last: Snapshot) -> None:
    """Requests, the SuperLink's link bytes and CPU seconds from ``first`` to ``last``."""
    for route, counts in last.relayed.items():
        for kind, count in counts["requests"].items():
            before = first.relayed[route]["requests"].get(kind, 0)
            outcome.requests[kind] = outcome.requests.get(kind, 0) + count - before
    outcome.link = {way: last.carried[way] - first.carried[way] for way in last.carried}
    outcome.cpu = {name: last.cpu[name] - first.cpu.get(name, 0.0) for name in last.cpu}


def run_setup(
    wan: slow_links.Wan, model: str, setup: Setup, arguments: argparse.Namespace, home: Path
) -> Outcome:
    """The job with ``model`` on a fresh federation on ``wan``, set up as ``setup``.

    The counts (requests, bytes, CPU) are taken from the start of round 2 to
    the start of round R, while the ServerApp runs.
    """
    outcome = Outcome(setup)
    state = home / f"{len(list(home.iterdir())):02d}-{model}-{setup.label}"
    spec = slow_links.linked_spec(
        wan,
        state,
        workdir=state,
        extra_environment=setup.environment(),
        **setup.spec_options(),
    )
    result_file = state / "result.json"
    run_config = (
        f'model="{model}" num-server-rounds={arguments.rounds} min-nodes={arguments.supernodes} '
        f'round-timeout={arguments.timeout} result-file="{result_file}" wire="{setup.wire}"'
    )
    round_two, round_last = (f"[ROUND {r}/{arguments.rounds}]" for r in (2, arguments.rounds))
    output: list[str] = []
    with slow_links.LinkedFederation(spec, wan) as federation:
        federation.start()
        for index in range(arguments.supernodes):
            federation.node_id(index, timeout=300)
            if spec.executor == "warm":
                federation.wait_for_warm_executor(index, timeout=300)
        assert federation.superlink is not None
        with PeakSampler(federation.superlink.pid) as peaks, wan.inside(slow_links.LINK):
            run = subprocess.Popen(  # pylint: disable=consider-using-with
                [str(spec.bin_dir / "flwr"), "run", str(APP), spec.connection, "--stream",
                 "--run-config", run_config],
                env=spec.environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, start_new_session=True,
            )  # fmt: skip
            first = last = None
            try:
                assert run.stdout is not None
                for line in run.stdout:
                    output.append(line)
                    if first is None and round_two in line:
                        first = Snapshot.take(wan)
                    elif first is not None and last is None and round_last in line:
                        last = Snapshot.take(wan)
                run.wait(timeout=60)
            finally:
                if run.poll() is None:
                    os.killpg(run.pid, signal.SIGKILL)
                    run.wait()
        outcome.superlink_rss, outcome.superlink_threads = peaks.rss, peaks.threads
    (state / "flwr-run.log").write_text("".join(output))
    if first is None or last is None or not result_file.exists():
        outcome.error = f"no result (see {state}):\n{''.join(output)[-3000:]}"
        return outcome
    summary = json.loads(result_file.read_text())
    result = summary["strategies"]["fedmr"]
    if setup.wire == "packed" and summary["wire"]["sent-standard"]:
        outcome.error = f"models went standard: {summary['wire']} (see {state})"
        return outcome
    if any(int(slots) != arguments.supernodes for slots in result["trained-slots"].values()):
        outcome.error = (
            f"replies were dropped: trained slots {result['trained-slots']} (see {state})"
        )
        return outcome
    record_between(outcome, first, last)
    seconds = result["round-seconds"]
    values = [seconds[key] for key in sorted(seconds, key=int)]
    outcome.first, outcome.rounds = values[0], values[1:]
    return outcome


def model_bytes(model: str) -> int:
    """The bytes of ``model``'s state dict, as the app builds it."""
    import torch  # pylint: disable=import-outside-toplevel

    from fedx.models import build_model  # pylint: disable=import-outside-toplevel

    torch.set_num_threads(1)
    state = build_model(model, (3, 32, 32), 10).state_dict()
    return sum(tensor.numel() * tensor.element_size() for tensor in state.values())


# ----------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------


def print_link_check(wan: slow_links.Wan, arguments: argparse.Namespace) -> None:
    """The links as the relay delivers them: a round trip, and a transfer's rate."""
    check = slow_links.probe(wan, slow_links.site(0), 10_000_000)
    print(
        f"links: round trip {check.round_trip * 1000:.1f} ms (set: {2000 * arguments.delay:g} ms); "
        f"10 MB site -> SuperLink host in {check.seconds:.2f} s = {check.mbit:.1f} Mbit/s "
        f"(set: {arguments.rate:g}; TCP over Ethernet carries at most "
        f"{arguments.rate * 1448 / 1514:.1f})"
    )


def print_model(
    model: str, floor: Floor, outcomes: list[Outcome], arguments: argparse.Namespace
) -> None:
    """One model's table; requests, link bytes and CPU per round over rounds 2 to R-1."""
    k, rounds = floor.supernodes, arguments.rounds - 2
    print(
        f"\n{model}: M = {floor.model_bytes / MB:.2f} MB, K = {k}, B = {floor.rate_mbit:g} Mbit/s, "
        f"RTT = {2000 * floor.delay:g} ms\n"
        f"floor = 2·K·M/B {floor.transfer:.3f} s + 2·RTT {floor.round_trips:.3f} s "
        f"= {floor.seconds:.3f} s (target: {arguments.target:g}x = "
        f"{arguments.target * floor.seconds:.3f} s)"
    )
    header = (
        f"{'setup':<26} {'s/round':>8} {'ratio':>6} {'round 1':>8} {'requests':>8} "
        f"{'down/KM':>7} {'up/KM':>6} {'CPU s':>6} {'SL CPU':>6} {'SL MB':>6} {'SL thr':>6}"
    )
    print(header)
    print("-" * len(header))
    for outcome in outcomes:
        if outcome.per_round is None:
            print(f"{outcome.setup.label:<26} failed")
            common.print_error(outcome.error)
            continue
        km = k * floor.model_bytes * rounds
        print(
            f"{outcome.setup.label:<26} {outcome.per_round:>8.3f} "
            f"{outcome.per_round / floor.seconds:>6.2f} {outcome.first:>8.2f} "
            f"{sum(outcome.requests.values()) / rounds:>8.0f} "
            f"{outcome.link['down'] / km:>7.3f} {outcome.link['up'] / km:>6.3f} "
            f"{sum(outcome.cpu.values()) / rounds:>6.2f} {outcome.superlink_cpu / rounds:>6.2f} "
            f"{outcome.superlink_rss / MB:>6.0f} {outcome.superlink_threads:>6}"
        )
    print(
        "(requests: the SuperNodes' to the SuperLink; down/KM, up/KM: bytes on the SuperLink's "
        "link over K·M; CPU s: every process of every host; SL CPU: the SuperLink's; all per "
        "round, rounds 2 to R-1. SL MB, SL thr: the SuperLink's peak resident memory and threads)"
    )
    for outcome in outcomes:
        if outcome.per_round is None:
            continue
        kinds = ", ".join(
            f"{kind} {count / rounds:.0f}"
            for kind, count in sorted(outcome.requests.items())
            if count
        )
        cpu = ", ".join(
            f"{name} {seconds / rounds:.2f}"
            for name, seconds in sorted(outcome.cpu.items())
            if seconds / rounds >= 0.05
        )
        spread = ", ".join(f"{s:.2f}" for s in outcome.rounds)
        print(
            f"  {outcome.setup.label}: rounds 2+ {spread} s\n"
            f"    requests per round: {kinds}\n    CPU s per round: {cpu}"
        )


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = common.benchmark_parser(__doc__)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument(
        "--setups", nargs="+", type=setup_type, default=[Setup(s) for s in DEFAULT_SETUPS]
    )
    parser.add_argument("--supernodes", type=int, default=2, help="K (default 2)")
    parser.add_argument("--rounds", type=int, default=4, help="R: rounds 2..R are measured")
    parser.add_argument("--rate", type=float, default=100.0, help="Mbit/s of every link")
    parser.add_argument("--delay", type=float, default=0.025, help="seconds one way")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a round may take")
    parser.add_argument("--keep", type=Path, help="keep every run's logs and state here")
    parser.add_argument("--target", type=float, default=1.5, help="ratio to the floor aimed at")
    arguments = common.parse_quick(
        parser,
        argv,
        "resnet20 only, 2 SuperNodes, 3 rounds, the fast setup",
        models=["resnet20"],
        setups=[Setup("fast")],
        rounds=3,
    )
    if arguments.rounds < 3:
        parser.error(
            "--rounds must be at least 3 (round 1 pays the start-up; rounds 2 to R-1 are counted)"
        )
    return arguments


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark."""
    arguments = parse_arguments(argv)
    if (problem := slow_links.missing()) is not None:
        print(f"links: cannot run here: {problem}")
        return
    # Ctrl-C and SIGTERM both leave through the clean-up of the hosts.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(
        f"load (uptime): {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}"
    )
    with contextlib.ExitStack() as stack:
        if arguments.keep:
            arguments.keep.mkdir(parents=True, exist_ok=True)
        home = arguments.keep or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="fedx-links-")
        )
        wan = stack.enter_context(
            slow_links.Wan(arguments.supernodes, arguments.rate, arguments.delay)
        )
        print_link_check(wan, arguments)
        for model in arguments.models:
            floor = Floor(model_bytes(model), arguments.supernodes, arguments.rate, arguments.delay)
            outcomes = []
            for setup in arguments.setups:
                try:
                    outcomes.append(run_setup(wan, model, setup, arguments, Path(home)))
                except Exception as err:  # pylint: disable=broad-exception-caught
                    outcomes.append(Outcome(setup, error=f"{type(err).__name__}: {err}"))
            print_model(model, floor, outcomes, arguments)
    print(
        f"load (uptime): {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}"
    )
