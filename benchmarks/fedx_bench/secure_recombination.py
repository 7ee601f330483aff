"""Measure what FedMR's secure recombination adds to a round: bytes and time.

K numpy clients (the training step only adds noise, so the round time is the
protocol's own) run FedMR rounds behind an in-process grid whose messages go
through Flower's serialization, once without and once with secure
recombination, with real X25519/AES-GCM encryption. Reported per round:

* the encrypted layer traffic between clients (what the relay delivered),
  per repetition, against the paper's estimate (appendix B.2.2, eq. 27):
  (n_u + n_l) K / len(w) model sizes per repetition;
* the extra serialized bytes the server sends and receives, measured as the
  difference between the two runs (each relayed layer crosses the server
  twice, and public keys and routing fields come on top);
* the extra time in process, and the extra message exchanges (on a real
  SuperLink each one also waits for Flower's reply polling);
* how many of its own trained layers a client's upload still holds, and how
  many clients refused to upload because the exchange left their trained
  model unchanged.

Usage::

    python benchmarks/secure_recombination.py [--model cnn] [--dataset cifar10]
        [--clients 10] [--repeats 3] [--min-layers 2] [--max-layers 4] [--rounds 5]

This script reports; it is not a test, and it always exits with status 0.
"""

import argparse
import time

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedx.data import dataset_info
from fedx.models import build_model
from fedx.ops import Model, layer_groups
from fedx.secure.client import is_secure_round, secure_train_reply
from fedx.secure.loopback import LoopbackGrid
from fedx.strategies import FedMR, to_arrayrecord, to_model

from fedx_bench import common


class NoiseClients:
    """Clients whose "training" adds a little noise, so that every model differs."""

    def __init__(self) -> None:
        self.trained: dict[int, Model] = {}
        self.rng = np.random.default_rng(0)

    def train(self, msg: Message, context: Context) -> Message:
        model = to_model(msg.content["arrays"])
        trained = {
            name: (a + self.rng.standard_normal(a.shape, dtype=np.float32).astype(a.dtype) * 0.01)
            if a.dtype.kind == "f"
            else a
            for name, a in model.items()
        }
        self.trained[msg.metadata.dst_node_id] = trained
        metrics = MetricRecord({"num-examples": 50})
        if is_secure_round(msg):
            return secure_train_reply(msg, context, to_arrayrecord(trained), metrics)
        return Message(
            RecordDict({"arrays": to_arrayrecord(trained), "metrics": metrics}), reply_to=msg
        )


def run(args: argparse.Namespace, initial: Model, secure: bool) -> dict:
    """Run ``args.rounds`` rounds; return per-round seconds, bytes and the last round's details."""
    clients = NoiseClients()
    node_ids = [10_000 + i for i in range(args.clients)]
    grid = LoopbackGrid(node_ids, clients.train)
    strategy = FedMR(
        seed=0,
        min_available_nodes=1,
        grouping=args.grouping,
        secure_recombination=secure,
        secure_repeats=args.repeats,
        secure_min_layers=args.min_layers,
        secure_max_layers=args.max_layers,
    )
    arrays = to_arrayrecord(initial)
    seconds, wire, layer_bytes, own_fractions, refused = [], [], [], [], 0
    for server_round in range(1, args.rounds + 1):
        exchanges_before = len(grid.wire_bytes)
        start = time.perf_counter()
        messages = strategy.configure_train(server_round, arrays, ConfigRecord(), grid)
        arrays, _ = strategy.aggregate_train(server_round, grid.send_and_receive(messages))
        seconds.append(time.perf_counter() - start)
        round_wire = grid.wire_bytes[exchanges_before:]
        wire.append(sum(sent + received for _, sent, received in round_wire))
        if secure:
            layer_bytes.append(strategy.relay_stats.layer_bytes)
            own_fractions.append(own_layer_fraction(grid, clients.trained, args.grouping))
            refused += sum(reply.has_error() for reply in grid.replies[-1])
    return {
        "seconds": float(np.mean(seconds)),
        "wire": float(np.mean(wire)),
        "exchanges": len(round_wire),
        "layer_bytes": float(np.mean(layer_bytes)) if layer_bytes else 0.0,
        "own": float(np.mean(own_fractions)) if own_fractions else 1.0,
        "refused": refused,
        "relay_seconds": strategy.relay_stats.seconds if secure else 0.0,
    }


def own_layer_fraction(grid: LoopbackGrid, trained: dict[int, Model], grouping: str) -> float:
    """Mean share of an upload's layers that are its uploader's own trained layers."""
    shares = []
    for reply in grid.replies[-1]:
        if reply.has_error():  # a client that would have uploaded its own model
            continue
        node = reply.metadata.src_node_id
        upload = to_model(reply.content["arrays"])
        groups = layer_groups(list(upload), grouping)  # type: ignore[arg-type]
        own = sum(
            all(np.array_equal(upload[n], trained[node][n]) for n in names) for names in groups
        )
        shares.append(own / len(groups))
    return float(np.mean(shares))


def main() -> None:
    parser = common.benchmark_parser(__doc__)
    parser.add_argument("--dataset", default="cifar10", choices=["digits", "cifar10", "cifar100"])
    parser.add_argument("--model", default="cnn", choices=["cnn", "resnet20", "vgg16"])
    parser.add_argument("--clients", type=int, default=10, help="K")
    parser.add_argument("--repeats", type=int, default=3, help="r_s")
    parser.add_argument("--min-layers", type=int, default=2, help="n_l")
    parser.add_argument("--max-layers", type=int, default=4, help="n_u")
    parser.add_argument("--grouping", default="tensor", choices=["tensor", "module"])
    parser.add_argument("--rounds", type=int, default=5, help="rounds to average over")
    args = parser.parse_args()
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1

    info = dataset_info(args.dataset)
    initial = {
        n: t.numpy()
        for n, t in build_model(args.model, info.input_shape, info.num_classes).state_dict().items()
    }
    model_bytes = sum(a.nbytes for a in initial.values())
    num_layers = len(layer_groups(list(initial), args.grouping))  # type: ignore[arg-type]
    k, r_s, n_l, n_u = args.clients, args.repeats, args.min_layers, args.max_layers

    plain = run(args, initial, secure=False)
    secure = run(args, initial, secure=True)

    estimate = (n_u + n_l) * k / num_layers * model_bytes  # per repetition, eq. (27)
    measured = secure["layer_bytes"] / r_s
    extra_wire = secure["wire"] - plain["wire"]
    mb = 1e6
    print(
        f"{args.model} on {args.dataset}: size(w) = {model_bytes / mb:.3f} MB, len(w) = {num_layers} "
        f"({args.grouping} grouping); K = {k}, r_s = {r_s}, n in [{n_l}, {n_u}]; "
        f"mean of {args.rounds} rounds"
    )
    print(f"{'':44s}{'MB':>10s}{'model sizes':>13s}")

    def row(label: str, value: float) -> None:
        print(f"{label:44s}{value / mb:10.3f}{value / model_bytes:13.3f}")

    row("paper's estimate per repetition", estimate)
    row("layer ciphertext per repetition (measured)", measured)
    row("plain FedMR round on the wire", plain["wire"])
    row("secure FedMR round on the wire", secure["wire"])
    row("extra bytes per round through the server", extra_wire)
    print(f"measured / estimate, layer traffic:            {measured / estimate:.3f}")
    print(
        f"extra bytes through the server / (r_s x estimate): {extra_wire / (r_s * estimate):.3f}"
        "  (each layer crosses the server twice)"
    )
    print(
        f"message exchanges per round:  plain {plain['exchanges']}, secure {secure['exchanges']}"
        f"  (2 + 2 r_s = {2 + 2 * r_s})"
    )
    print(
        f"seconds per round in process: plain {plain['seconds']:.3f}, secure {secure['seconds']:.3f}, "
        f"extra {secure['seconds'] - plain['seconds']:.3f} (relay's exchange {secure['relay_seconds']:.3f})"
    )
    print(
        f"share of an upload's layers that are its uploader's own: {secure['own']:.3f} "
        f"(plain FedMR uploads: 1.000)"
    )
    print(f"uploads refused because no layer had changed: {secure['refused']} of {k * args.rounds}")
