"""Where one message's seconds go on real processes: a timeline from the ServerApp's push to its pull.

The job of ``benchmarks/deployment.py`` (FedMR on digits, the app's ``cnn``,
IID, one training exchange per round) runs on a SuperLink and
``--clients`` SuperNodes on 127.0.0.1 set up as ``--setup`` (default
``warm:0.1``: fedx's warm executor and 0.1-s polls), with
``benchmarks/fedx_bench/trace`` on every process's ``PYTHONPATH``: its
``sitecustomize`` writes a line per call of the functions on the way (the
ServerApp's push and pulls, the SuperLink's stores, the SuperNode's loop and
its Runtime API, the SuperExec's launch, and in the forked ClientApp
process each step of Flower's ``run_clientapp`` and fedx's handler), with
``time.monotonic`` start and duration, the machine's clock in every
process.

For each training exchange from round 2 on and each node it takes the
milestones below, and prints one exchange's timeline (``--show-round``, the
node that replied last) and, for every step, the median and the max over
all exchanges and nodes of the seconds it took. The steps, in order:

==================  =====================================================
push                ServerApp: ``send_and_collect`` starts → its push returns
node pulls          → the SuperNode's pull that brought the message returns
task seen           → the SuperExec's ``launch`` starts (it polled the task)
fork                → the forked process runs its first line
connect             → Flower's ``run_clientapp`` has its client and heartbeat
task input          → it has pulled the message, context, run and FAB
FAB install         → ``install_from_fab`` returned
app load            → the ClientApp is loaded (the app's modules imported)
handler             → ``ClientApp.__call__`` returned (of which: data,
                      model, training, and on a GPU node CUDA's start in
                      the task's process: ``torch.cuda._lazy_init``)
reply push          → the reply is on the SuperNode (``push_message``)
node sends          → the SuperNode's push of it to the SuperLink returns
ServerApp has it    → ``send_and_collect`` returns (slowest node only)
==================  =====================================================

and, after the reply: the child's exit (``flwr_exit`` to the end of the
process). Usage::

    python benchmarks/message_timeline.py                   # warm:0.1, 3 clients, 4 rounds
    python benchmarks/message_timeline.py --setup warm:0.1:memory --keep-trace /tmp/trace.txt
    python benchmarks/message_timeline.py --secure --rounds 2 --setup warm:0.1:memory
    python benchmarks/message_timeline.py --analyse /tmp/trace.txt   # a kept trace again

It reports; it is not a test, and it always exits with status 0.
"""

import argparse
import os
import shutil
import statistics
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from fedx_bench import common, deployment

TRACER = Path(__file__).resolve().with_name("trace")


@dataclass(frozen=True)
class Call:
    """One traced call."""

    start: float
    seconds: float
    pid: int
    ppid: int
    program: str
    name: str
    summary: str

    @property
    def end(self) -> float:
        return self.start + self.seconds


def read_trace(path: Path) -> list[Call]:
    """The calls in the trace file, by start time."""
    calls = []
    for line in path.read_text().splitlines():
        parts = line.split(" ", 6)
        if len(parts) == 7:
            start, seconds, pid, ppid, program, name, summary = parts
            calls.append(
                Call(float(start), float(seconds), int(pid), int(ppid), program, name, summary)
            )
    return sorted(calls, key=lambda c: c.start)


@dataclass
class Node:
    """The pids of one SuperNode and its executor."""

    supernode: int
    superexec: int | None
    warm: int | None


def _first(calls, name, after, pids=None, ppid=None):
    for call in calls:
        if call.name != name or call.start < after:
            continue
        if pids is not None and call.pid not in pids:
            continue
        if ppid is not None and call.ppid != ppid:
            continue
        return call
    return None


HANDLER_PARTS = ("ClientTask.__init__", "ClientTask.training_data", "ClientTask.model", "train")
#: The handler's first CUDA work starts CUDA in the task's process (a GPU node: every
#: forked task, as a new process); the step shows what that costs a message.
CUDA_START = "_lazy_init"


def node_spans(
    calls: list[Call], exchange: Call, node: Node
) -> dict[str, tuple[float, float]] | None:
    """What one node did for its message in ``exchange``: ``{step: (start, end)}``, in seconds
    after the exchange started, in the order of :data:`STEPS`."""
    t0 = exchange.start
    pulled = _first(calls, "_pull_and_store_message", t0, {node.supernode})
    if pulled is None or pulled.end > exchange.end:
        return None
    launch = _first(calls, "WarmExecutor.launch", t0, {node.superexec})
    if launch is None:
        return None
    child_first = _first(calls, "BaseProcess._bootstrap", launch.start, ppid=node.warm)
    if child_first is None:
        return None
    child = {child_first.pid}
    found = {
        name: _first(calls, name, child_first.start, child)
        for name in (
            "run_clientapp",
            "pull_task_input",
            "install_from_fab",
            "get_load_client_app_fn()",
            "ClientApp.__call__",
            "push_message",
            "flwr_exit",
        )
    }
    if found["install_from_fab"] is None:  # the warm executor's shortcut
        found["install_from_fab"] = _first(calls, "install_fab_once", child_first.start, child)
    sent = _first(calls, "_push_messages", pulled.end, {node.supernode})
    if None in found.values() or sent is None or sent.end > exchange.end:
        return None  # not this exchange's message
    process_end = max(c.end for c in calls if c.pid in child)
    spans = {
        "SuperNode pulls the message and its objects": (pulled.start, pulled.end),
        "SuperExec launches the task": (launch.start, launch.end),
        "fork: launch to the child's first line": (launch.end, child_first.start),
        "child: to Flower's run_clientapp (reseed, threads)": (
            child_first.start,
            found["run_clientapp"].start,
        ),
        "child: to its first request (HTTP client, heartbeat)": (
            found["run_clientapp"].start,
            found["pull_task_input"].start,
        ),
        "child: pull task input (waits for the objects)": _span(found["pull_task_input"]),
        "child: install FAB": _span(found["install_from_fab"]),
        "child: load the ClientApp (import from FAB)": _span(found["get_load_client_app_fn()"]),
        "child: ClientApp handler": _span(found["ClientApp.__call__"]),
    }
    for part in HANDLER_PARTS:
        inner = _first(calls, part, child_first.start, child)
        if inner is not None:
            spans[f"  {part}"] = _span(inner)
    cuda = _first(calls, CUDA_START, child_first.start, child)
    if cuda is not None:
        spans["  CUDA starts (torch.cuda._lazy_init)"] = _span(cuda)
    spans["child: push the reply to the SuperNode"] = _span(found["push_message"])
    spans["child: exit (after the reply)"] = (found["flwr_exit"].start, process_end)
    spans["SuperNode sends the reply to the SuperLink"] = (found["push_message"].end, sent.end)
    return {step: (begin - t0, end - t0) for step, (begin, end) in spans.items()}


def _span(call: Call) -> tuple[float, float]:
    return call.start, call.end


def analyse(calls: list[Call], nodes: list[Node], first: int, show: int) -> dict[str, list[float]]:
    """Print exchange ``show``'s timeline and, from exchange ``first`` on, each step's seconds.

    Return those seconds: ``{step: [seconds, one per exchange and node]}``.
    """
    exchanges = [c for c in calls if c.name == "send_and_collect" and c.seconds > 0.01]
    took = defaultdict(list)
    for number, exchange in enumerate(exchanges, start=1):
        if number < first:
            continue
        push = _first(calls, "HttpGrid.push_messages", exchange.start)
        per_node = [node_spans(calls, exchange, node) for node in nodes]
        per_node = [spans for spans in per_node if spans is not None]
        last_sent = max(
            (spans["SuperNode sends the reply to the SuperLink"][1] for spans in per_node),
            default=0.0,
        )
        common_spans = {
            "ServerApp pushes the messages": (0.0, push.end - exchange.start if push else 0.0),
            "ServerApp has every reply (after the last send)": (last_sent, exchange.seconds),
        }
        for spans in per_node:
            for step, (begin, end) in spans.items():
                took[step].append(end - begin)
        for step, (begin, end) in common_spans.items():
            took[step].append(end - begin)
        took["the exchange"].append(exchange.seconds)
        if number == show and per_node:
            slowest = max(
                per_node, key=lambda spans: spans["SuperNode sends the reply to the SuperLink"][1]
            )
            print(f"exchange {number}: {exchange.seconds:.2f} s; the node that replied last:")
            print(f"{'step':<52}{'from s':>8}{'to s':>8}{'took s':>8}")
            rows = {
                **{"ServerApp pushes the messages": common_spans["ServerApp pushes the messages"]},
                **slowest,
                "ServerApp has every reply (after the last send)": common_spans[
                    "ServerApp has every reply (after the last send)"
                ],
            }
            for step, (begin, end) in rows.items():
                print(f"{step:<52}{begin:>8.3f}{end:>8.3f}{end - begin:>8.3f}")
    if gaps := idle_gaps(calls, nodes):
        # What fedx-supernode's --idle-after must cover for the run to keep its short polls.
        took[IDLE_GAP] = gaps
    print(f"\nexchanges {first}-{len(exchanges)}, every node: seconds per step")
    print(f"{'step':<52}{'median':>8}{'max':>8}{'n':>5}")
    for step, values in took.items():
        print(f"{step:<52}{statistics.median(values):>8.3f}{max(values):>8.3f}{len(values):>5}")
    return dict(took)


#: A SuperNode's idle time within a run: from its reply sent to its next message pulled.
IDLE_GAP = "SuperNode idle: its reply sent to its next message"


def idle_gaps(calls: list[Call], nodes: list[Node]) -> list[float]:
    """Every node's seconds from a reply sent (``_push_messages`` returned) to its next message."""
    gaps = []
    for node in nodes:
        sent = [c.end for c in calls if c.pid == node.supernode and c.name == "_push_messages"]
        pulled = [
            c.end for c in calls if c.pid == node.supernode and c.name == "_pull_and_store_message"
        ]
        for end in sent:
            after = [t for t in pulled if t > end]
            if after:
                gaps.append(min(after) - end)
    return gaps


def _distance(launches: list[Call], handed_out: list[float]) -> float:
    """How far, in the median, each launch is from the closest moment a task was handed out."""
    return statistics.median(
        min(abs(launch.start - end) for end in handed_out) for launch in launches
    )


def nodes_in(calls: list[Call]) -> list[Node]:
    """The SuperNodes of a trace, each with its SuperExec and warm interpreter.

    A SuperExec launches a task right after its SuperNode handed it out
    (``acquire_task``); the task's process is a child of the warm interpreter.
    """
    acquired = defaultdict(list)
    for call in calls:
        if call.name == "acquire_task":
            acquired[call.pid].append(call.end)
    nodes = []
    for superexec in sorted({c.pid for c in calls if c.name == "WarmExecutor.launch"}):
        launches = [c for c in calls if c.name == "WarmExecutor.launch" and c.pid == superexec]

        supernode = min(
            acquired, key=lambda node, launches=launches: _distance(launches, acquired[node])
        )
        parents = [
            child.ppid
            for launch in launches
            if (child := _first(calls, "BaseProcess._bootstrap", launch.end)) is not None
        ]
        nodes.append(Node(supernode, superexec, statistics.mode(parents) if parents else None))
    return nodes


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = common.benchmark_parser(__doc__)
    parser.add_argument(
        "--setup", type=deployment.parse_setup, default=deployment.parse_setup("warm:0.1")
    )
    parser.add_argument(
        "--first-exchange",
        type=int,
        default=3,
        help="the first exchange in the statistics (default 3: after the query and round 1)",
    )
    parser.add_argument("--show-exchange", type=int, default=4, help="the exchange shown in full")
    parser.add_argument(
        "--secure",
        action="store_true",
        help="run FedMR with secure recombination on 4 SuperNodes instead (its 7 exchanges "
        "a round are in the statistics too)",
    )
    parser.add_argument("--keep-trace", type=Path, help="copy the trace file here")
    parser.add_argument(
        "--analyse", type=Path, metavar="TRACE", help="only read a trace kept earlier"
    )
    deployment.add_job_options(parser, rounds=4)
    arguments = parser.parse_args(argv)
    common.check_job_options(parser, arguments, deployment.APP)
    arguments.idle_seconds = 0
    if arguments.secure:
        arguments.clients, arguments.secure_rounds = 4, arguments.rounds
    return arguments


def main(argv=None) -> None:
    arguments = parse_arguments(argv)
    if arguments.analyse:
        calls = read_trace(arguments.analyse)
        analyse(calls, nodes_in(calls), arguments.first_exchange, arguments.show_exchange)
        return
    print(
        f"{arguments.setup.description}, {arguments.clients} clients, {arguments.rounds} rounds "
        f"of {arguments.local_epochs} local epoch(s); {common.load_text()} at start",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="fedx-timeline-") as directory:
        home = Path(directory)
        trace = home / "trace.txt"
        path = os.pathsep.join(p for p in (str(TRACER), os.environ.get("PYTHONPATH", "")) if p)
        environment = {"PYTHONPATH": path, "FEDX_TRACE_FILE": str(trace)}
        with deployment.federation_of(
            home / "federation",
            arguments.clients,
            arguments.setup,
            arguments.client_threads,
            environment=environment,
        ) as federation:
            nodes = []
            for index in range(arguments.clients):
                superexec = federation.superexecs.get(index)
                warm = federation.wait_for_warm_executor(index) if superexec else None
                nodes.append(
                    Node(federation.supernodes[index].pid, superexec and superexec.pid, warm)
                )
            if arguments.secure:
                secure = deployment.secure_round(arguments, home, federation, arguments.setup)
                print(
                    f"secure stage {secure.per_round or float('nan'):.2f} s per round "
                    f"{secure.seconds}; {common.load_text()}"
                )
                common.print_error(secure.error)
            else:
                real = deployment.time_real(arguments, home, federation, arguments.setup)
                print(
                    f"per round {real.timing.per_round or float('nan'):.2f} s "
                    f"(rounds 2-{arguments.rounds}); {common.load_text()}"
                )
                common.print_error(real.timing.error)
        if arguments.keep_trace:
            shutil.copyfile(trace, arguments.keep_trace)
        analyse(read_trace(trace), nodes, arguments.first_exchange, arguments.show_exchange)
