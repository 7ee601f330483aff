"""Measure the bytes every strategy puts on the wire per round, against FedAvg's.

Each strategy (Flower's FedAvg and FedProx, fedx's FedMR, FedIndep, FedMut,
FedCross, FedMe, and FedMR with secure recombination) runs a few rounds
against an in-process grid of K numpy clients. Nothing is assumed about what
a strategy sends: every message is measured as Flower's own protobuf
serialization of the whole Message (``flwr.common.serde.message_to_proto``,
``ByteSize()``), metadata and config included, and goes through that
serialization both ways, so the clients read what a SuperNode would and the
strategy reads what the SuperLink would hand it.

* downlink: the messages ``configure_train`` returns (for secure FedMR also
  the relay's exchanges, which are part of its training round);
* uplink: the clients' replies, shaped as fedx's ClientApp shapes them: an
  ``"arrays"`` ArrayRecord and a ``"metrics"`` MetricRecord with
  ``num-examples`` and ``train-loss``; FedMe's ``personalized`` and
  ``exchanged`` ArrayRecords and its seven metrics; secure FedMR's public key
  first and the recombined model at the end. A client's "training" adds a
  client-specific constant to every float, which changes no size;
* "per client" is the downlink (uplink) over K, in model sizes;
* "ServerApp push": what Flower 1.41's ServerApp pushes to the SuperLink for
  the round's downlink. The Grid sends messages as content-addressed objects
  and pushes identical objects once per batch, so FedAvg's K copies of one
  model cost one model there (FedMut's K mutations share two arrays per
  layer, FedMe's clients that adopted the same model share it); SuperNodes
  still pull a full message each.

FedMe's server first asks every node which client it is (a ``query``
exchange), once per client (fedx's ServerApp does the same once at the start
of every run); those bytes are printed on their own and left out of the
per-round figures. Evaluation messages are not counted. Figures
are means over rounds 2 to R: in round 1 every slot starts from the same
initial model, which only the ServerApp push notices. Later rounds differ
only for secure FedMR, whose clients swap a random number of layers.

Models: fedx's ``cnn`` (the FedAvg CNN, 2.16M parameters) and ``vgg16``
(15.2M), both on 3x32x32 CIFAR input with 10 classes. Memory: a strategy
holds its pool, the messages, the replies and their copies through the
serializer at once: measured, about 5 K model sizes on top of 0.8 GB (9 K
for FedMe, whose messages carry two models; 7 K for secure FedMR), so
3.7 GB for FedMR and about 6.3 GB for FedMe with K = 10 VGG-16 models. A
strategy whose estimate exceeds the available memory (``MemAvailable``, or
``--max-memory-gib``) is skipped with a message.

Usage::

    python benchmarks/round_bytes.py                    # cnn and vgg16, K=10, all strategies
    python benchmarks/round_bytes.py --model cnn --clients 20 --rounds 3
    python benchmarks/round_bytes.py --strategies fedavg fedmr fedme
    python benchmarks/round_bytes.py --quick            # cnn, K=3, 2 rounds

This script reports; it is not a test, and it always exits with status 0.
"""

import argparse
import logging
import random
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import (
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp.strategy import FedAvg, FedProx, Strategy
from flwr.supercore.inflatable.inflatable_object import (
    get_all_nested_objects,
    no_object_id_recompute,
)
from flwr.supercore.task_identity import TaskIdentity

from fedx.config import RunConfig
from fedx.models import build_model
from fedx.ops import Model
from fedx.protocol.common import TrainingSettings
from fedx.secure.client import is_secure_round, make_handlers, secure_train_reply
from fedx.strategies import FedCross, FedIndep, FedMe, FedMR, FedMut, to_arrayrecord, to_model

from fedx_bench import common

CIFAR_INPUT = (3, 32, 32)
NUM_CLASSES = 10
MB = 1e6
# The hyperparameters fedx's ServerApp sends with every training message, at their defaults.
TRAIN_CONFIG = dict(TrainingSettings.from_run_config(RunConfig()).to_record())


# ----------------------------------------------------------------------
# Clients: replies shaped as fedx's ClientApp shapes them
# ----------------------------------------------------------------------


def trained(model: Model, step: float) -> Model:
    """The model after "training": floats moved by ``step``, integers unchanged."""
    return {
        name: array + array.dtype.type(step) if array.dtype.kind == "f" else array
        for name, array in model.items()
    }


def identify_reply(message: Message, client_id: int) -> Message:
    """fedx's answer to a ``query``: the node's partition id as ``client-id``."""
    content = RecordDict({"metrics": MetricRecord({"client-id": client_id})})
    return Message(content=content, reply_to=message)


def fedme_reply(message: Message, client_id: int) -> Message:
    """FedMe's training reply: both trained models, the losses and the choice."""
    records = message.content.array_records
    step = 0.001 * (client_id + 1)
    metrics = MetricRecord(
        {
            "num-examples": 100 + client_id,
            "train-loss-personalized": 1.0,
            "train-loss-exchanged": 1.1,
            "val-loss-personalized": 0.9,
            "val-loss-exchanged": 0.8,
            "chose-exchanged": client_id % 2,
        }
    )
    content = RecordDict(
        {
            "personalized": to_arrayrecord(trained(to_model(records["personalized"]), step)),
            "exchanged": to_arrayrecord(trained(to_model(records["exchanged"]), step)),
            "metrics": metrics,
        }
    )
    return Message(content=content, reply_to=message)


def train_reply(message: Message, context: Context, client_id: int) -> Message:
    """fedx's ClientApp ``train`` reply, for every strategy's training message."""
    if "personalized" in message.content.array_records:
        return fedme_reply(message, client_id)
    model = trained(to_model(message.content.array_records["arrays"]), 0.001 * (client_id + 1))
    arrays = to_arrayrecord(model)
    metrics = MetricRecord({"num-examples": 100 + client_id, "train-loss": 1.0})
    if is_secure_round(message):
        return secure_train_reply(message, context, arrays, metrics)
    return Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=message)


# ----------------------------------------------------------------------
# The grid: delivers through Flower's serialization and counts the bytes
# ----------------------------------------------------------------------


@dataclass
class Exchange:
    """One ``send_and_receive``: its message type and serialized sizes."""

    message_type: str
    requests: int  # messages sent
    sent: int  # bytes of all requests
    received: int  # bytes of all replies
    pushed: int  # bytes of the distinct objects the ServerApp pushes (Flower 1.41)


def serialized(message: Message) -> tuple[Message, int]:
    """``message`` as the other side reads it after Flower's serialization, and its size."""
    proto = message_to_proto(message)
    return message_from_proto(proto), proto.ByteSize()


def pushed_object_bytes(messages: Sequence[Message]) -> int:
    """Bytes of the distinct objects of a batch, as Flower 1.41's Grid pushes them."""
    objects = {}
    for message in messages:
        objects.update(get_all_nested_objects(message))
    return sum(len(obj.deflate()) for obj in objects.values())


class MeasuringGrid:
    """Just enough of Flower's Grid: numpy clients behind Flower's serialization.

    Node i is client i (its ``partition-id``); every client keeps a Context
    across messages, as a SuperNode does, for secure recombination.
    """

    def __init__(self, num_nodes: int) -> None:
        # Node ids are unsigned 64-bit: use large ones, as Flower does.
        self.node_ids = [2**63 + 1_000 + index for index in range(num_nodes)]
        self.client_of = {node: index for index, node in enumerate(self.node_ids)}
        self.contexts = {
            node: Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})
            for node in self.node_ids
        }
        rng = random.Random(0)
        self.secure_handlers = {
            f"{MessageType.TRAIN}.{action}": handler
            for action, handler in make_handlers(lambda: rng).items()
        }
        self.exchanges: list[Exchange] = []

    def get_node_ids(self) -> list[int]:
        """The connected nodes."""
        return list(self.node_ids)

    def _answer(self, message: Message) -> Message:
        node = message.metadata.dst_node_id
        kind = message.metadata.message_type
        if kind == MessageType.QUERY:
            return identify_reply(message, self.client_of[node])
        if kind == MessageType.TRAIN:
            return train_reply(message, self.contexts[node], self.client_of[node])
        return self.secure_handlers[kind](message, self.contexts[node])

    def send_and_receive(
        self, messages: Sequence[Message], *, timeout: float | None = None
    ) -> list[Message]:
        """Deliver every message through the serializer and return the replies."""
        del timeout  # every client answers at once
        messages = list(messages)
        # As Flower's Grid pushes them: every object id computed once.
        with no_object_id_recompute():
            for message in messages:
                message.metadata.__dict__["_message_id"] = message.object_id
            pushed = pushed_object_bytes(messages)
        sent = received = 0
        replies = []
        for message in messages:
            delivered, size = serialized(message)
            sent += size
            reply, size = serialized(self._answer(delivered))
            received += size
            replies.append(reply)
        kind = messages[0].metadata.message_type if messages else ""
        self.exchanges.append(Exchange(kind, len(messages), sent, received, pushed))
        return replies


# ----------------------------------------------------------------------
# Strategies
# ----------------------------------------------------------------------


def strategy_builders(initial: Model, architecture: str) -> dict[str, Callable[[int], Strategy]]:
    """Each strategy for K clients, all of them trained every round."""

    def sampling(k: int) -> dict:
        return {"fraction_train": 1.0, "min_train_nodes": k, "min_available_nodes": k}

    def multi(k: int) -> dict:
        return {**sampling(k), "seed": 0, "node_wait_timeout": 0.0}

    def no_predictions(arch: str, model: Model) -> np.ndarray:
        raise RuntimeError("one cluster: FedMe needs no predictions")

    return {
        "fedavg": lambda k: FedAvg(**sampling(k)),
        "fedprox": lambda k: FedProx(**sampling(k), proximal_mu=0.01),
        "fedmr": lambda k: FedMR(**multi(k)),
        "fedindep": lambda k: FedIndep(**multi(k)),
        "fedmut": lambda k: FedMut(**multi(k)),
        "fedcross": lambda k: FedCross(**multi(k)),
        "fedme": lambda k: FedMe(
            architectures=[architecture],
            initial_model_fn=lambda arch, client_id: initial,
            predict_fn=no_predictions,
            # One architecture: nothing to choose (its stand-in clients do not answer the choice).
            initial_architecture="round-robin",
            seed=0,
            fraction_train=1.0,
            min_train_nodes=k,
            min_available_nodes=k,
            node_wait_timeout=0.0,
        ),
        "fedmr-secure": lambda k: FedMR(**multi(k), secure_recombination=True),
    }


STRATEGIES = tuple(strategy_builders({}, "cnn"))
# Peak memory of one strategy's run, measured with this script: a base (the
# interpreter, torch, Flower) plus this many copies of the K models.
BASE_BYTES = 0.8e9
MODEL_COPIES = {"fedme": 9, "fedmr-secure": 7}
DEFAULT_MODEL_COPIES = 5


def estimated_peak_bytes(name: str, k: int, model_bytes: int) -> float:
    """What a strategy's run is expected to hold at its peak."""
    return BASE_BYTES + MODEL_COPIES.get(name, DEFAULT_MODEL_COPIES) * k * model_bytes


@dataclass
class Traffic:
    """A strategy's measured bytes: per-round means and one-off queries."""

    strategy: str
    rounds: int = 0
    down: float = 0.0
    up: float = 0.0
    pushed: float = 0.0
    messages: float = 0.0
    query: int = 0
    error: str | None = None


def measure(
    name: str, build: Callable[[int], Strategy], initial: Model, k: int, rounds: int
) -> Traffic:
    """Run ``rounds`` training rounds of one strategy; sum each round's exchanges."""
    grid = MeasuringGrid(k)
    strategy = build(k)
    begin_run = getattr(strategy, "begin_run", None)
    if callable(begin_run):  # as fedx's round loop does (FedMe, secure FedMR)
        begin_run(num_rounds=rounds, timeout=60.0)
    arrays = to_arrayrecord(initial)
    traffic = Traffic(name)
    down, up, pushed, messages = [], [], [], []
    for server_round in range(1, rounds + 1):
        first = len(grid.exchanges)
        sent = strategy.configure_train(server_round, arrays, ConfigRecord(TRAIN_CONFIG), grid)
        replies = grid.send_and_receive(list(sent))
        new_arrays, _ = strategy.aggregate_train(server_round, replies)
        arrays = new_arrays if new_arrays is not None else arrays
        this_round = grid.exchanges[first:]
        training = [e for e in this_round if e.message_type.startswith(MessageType.TRAIN)]
        queries = [e for e in this_round if e.message_type == MessageType.QUERY]
        traffic.query += sum(e.sent + e.received for e in queries)
        down.append(sum(e.sent for e in training))
        up.append(sum(e.received for e in training))
        pushed.append(sum(e.pushed for e in training))
        messages.append(sum(e.requests for e in training))
    # Round 1 starts every slot from the same model; later rounds show the steady state.
    steady = slice(1, None) if rounds > 1 else slice(None)
    traffic.rounds = len(down[steady])
    traffic.down, traffic.up = float(np.mean(down[steady])), float(np.mean(up[steady]))
    traffic.pushed = float(np.mean(pushed[steady]))
    traffic.messages = float(np.mean(messages[steady]))
    return traffic


def initial_model(architecture: str, seed: int) -> Model:
    """fedx's model of that name on CIFAR input, as numpy arrays."""
    import torch  # pylint: disable=import-outside-toplevel

    torch.manual_seed(seed)
    module = build_model(architecture, CIFAR_INPUT, NUM_CLASSES)
    return {name: tensor.numpy() for name, tensor in module.state_dict().items()}


def print_table(
    architecture: str, model_bytes: int, k: int, rounds: int, results: list[Traffic]
) -> None:
    """Bytes per round, in MB and model sizes, and the ratios to FedAvg."""
    baseline = next((t for t in results if t.strategy == "fedavg" and t.error is None), None)
    measured = "round 1" if rounds == 1 else f"mean of rounds 2-{rounds}"
    print(
        f"\n== {architecture}: {model_bytes / MB:.3f} MB of float32 arrays; K = {k} clients "
        f"per round; {measured}"
    )
    common.print_header(
        f"{'strategy':<14}{'down MB':>10}{'up MB':>10}{'down/client':>13}{'up/client':>11}"
        f"{'down/FedAvg':>13}{'up/FedAvg':>11}{'msgs':>6}{'push MB':>10}"
    )
    for t in results:
        if t.error is not None:
            print(f"{t.strategy:<14}  {t.error}")
            continue
        ratios = (
            ("", "")
            if baseline is None
            else (f"{t.down / baseline.down:.3f}", f"{t.up / baseline.up:.3f}")
        )
        print(
            f"{t.strategy:<14}{t.down / MB:>10.2f}{t.up / MB:>10.2f}"
            f"{t.down / k / model_bytes:>13.3f}{t.up / k / model_bytes:>11.3f}"
            f"{ratios[0]:>13}{ratios[1]:>11}{t.messages:>6.0f}{t.pushed / MB:>10.2f}"
        )
    for t in results:
        if t.query:
            print(
                f"{t.strategy}: one-off client identification (query and replies): "
                f"{t.query / 1e3:.1f} kB"
            )
    print(
        "down/client, up/client: bytes per client in model sizes; msgs: messages the server "
        "sends per round; push MB: what the ServerApp pushes to the SuperLink (identical "
        "objects once per batch)"
    )


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options; ``--quick`` changes the defaults of models, clients and rounds."""
    parser = common.benchmark_parser(__doc__)
    parser.add_argument("--model", nargs="+", choices=["cnn", "vgg16"], default=["cnn", "vgg16"])
    parser.add_argument("--clients", type=int, default=10, help="K, clients per round")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="training rounds to run; rounds 2.. are averaged (default: 3)",
    )
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    parser.add_argument("--seed", type=int, default=0)
    common.add_memory_limit(parser, "skip strategies")
    parser.add_argument("--verbose", action="store_true", help="show the strategies' logs")
    arguments = common.parse_quick(
        parser,
        argv,
        "cnn, K=3 clients, 2 rounds: a smoke run",
        model=["cnn"],
        clients=3,
        rounds=2,
    )
    if arguments.clients < 2:
        parser.error("--clients must be at least 2 (FedMe and FedCross need a partner)")
    if arguments.rounds < 1:
        parser.error("--rounds must be at least 1")
    if "fedavg" not in arguments.strategies:
        arguments.strategies.insert(0, "fedavg")  # the baseline of every ratio
    return arguments


def main(argv: Sequence[str] | None = None) -> dict[str, list[Traffic]]:
    """Measure every chosen strategy on every chosen model; return the figures by model."""
    arguments = parse_arguments(argv)
    flwr_logger = logging.getLogger("flwr")
    previous_level = flwr_logger.level
    if not arguments.verbose:
        flwr_logger.setLevel(logging.WARNING)  # the strategies log every round
    try:
        return _measure(arguments)
    finally:
        flwr_logger.setLevel(previous_level)  # callers in the same process keep their logging


def _measure(arguments: argparse.Namespace) -> dict[str, list[Traffic]]:
    """The figures of :func:`main`, with its parsed arguments."""
    # Messages carry the run and node of the process that creates them, as in a ServerApp.
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    results: dict[str, list[Traffic]] = {}
    limit = common.memory_limit(arguments)
    for architecture in arguments.model:
        initial = initial_model(architecture, arguments.seed)
        model_bytes = sum(array.nbytes for array in initial.values())
        builders = strategy_builders(initial, architecture)
        results[architecture] = []
        for name in arguments.strategies:
            needed = estimated_peak_bytes(name, arguments.clients, model_bytes)
            if limit is not None and needed > limit:
                reason = (
                    f"refused: needs about {needed / 2**30:.1f} GiB, only "
                    f"{limit / 2**30:.1f} GiB available (lower --clients or raise "
                    "--max-memory-gib)"
                )
                results[architecture].append(Traffic(name, error=reason))
                continue
            try:
                traffic = measure(
                    name, builders[name], initial, arguments.clients, arguments.rounds
                )
            except Exception as err:  # a report, not a test: show the failure and go on
                traceback.print_exc()
                traffic = Traffic(name, error=f"ERROR: {err!r}")
            results[architecture].append(traffic)
        print_table(
            architecture, model_bytes, arguments.clients, arguments.rounds, results[architecture]
        )
    return results
