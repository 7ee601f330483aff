"""One round of ten CIFAR-10 clients training ResNet-20 on a GPU: fedx's simulation against plain loops.

The round of issue 25: 100 clients holding IID shares of a CIFAR-10-shaped
training set (500 images each), 10 of them a round, each training ResNet-20
for 5 local epochs at batch 50 (SGD, lr 0.01, momentum 0.9): 500 SGD steps,
about 3 TFLOP. The target is at most 0.6 s a round on one H100 (2.0 s at
fedx 8df8eeb); every row shows its seconds against it.

Variants (``--variants``):

* ``sim``: fedx's simulation, ``fedx-compare configs/cifar10-resnet20-iid.toml``
  (``--strategies``, default FedAvg and FedMR) with ``--partitions``
  SuperNodes of ``--client-cpus`` CPUs and ``--client-gpus`` of the GPU each
  (0.1: ten actors share the card); seconds per round from ``metrics.json``
  (``round-seconds``, rounds 2 to R).
* ``sim-groups``: the same simulation with client groups: ``client-group-size``
  = ``--group-size`` (default: the clients of a round) and actors of
  ``--group-cpus`` CPUs and ``--group-gpus`` of the GPU (default 1: one actor
  trains the whole round as one batched step).
* ``loader``: one process trains the round's clients one after another with
  ``fedx.training.train`` on batches from torchvision's per-image transforms
  in a ``DataLoader`` (``fedx.data.batch_loader``): fedx's data path before
  the device path.
* ``device``: the same with fedx's device data path (``fedx.data.device_batches``:
  the images on the device, crops and flips drawn there).
* ``device-det``: ``device`` with deterministic kernels
  (``fedx.training.deterministic_kernels``, the run config's
  ``deterministic = true``): what reproducibility costs.
* ``group``: the round's clients as one client group, as a simulation actor
  trains them with ``client-group-size`` (``fedx.group_training.train_group``):
  their parameters, BatchNorm statistics and momentum stacked, each client's
  own batches (device path) and generator states, the gradient of every
  client at once with ``torch.func.vmap``, SGD on the stacked tensors. Each
  client's weights are what ``train()`` gives it alone (``tests/unit/test_group_training.py``).
* ``loader-data``, ``device-data``: the two data paths alone, every batch
  of the round made and moved to the device, no training.

A variant named twice runs twice, in the order given: ``--variants loader
device loader device`` pairs the two data paths in one process.

Each client of a plain loop starts from the round's global model, is seeded
as the ClientApp seeds it, trains, and is copied to the host as its reply
would be; the round ends with FedAvg's average (``fedx.ops.average``). Per
round: the mean of rounds 2 to R (round 1 loads data, starts CUDA and picks
kernels). "busy" is NVML's utilisation over the timed rounds (the share of
time some kernel ran; see ``gpu.py``), "peak" the card's memory at its
highest. The data is written fresh (``fake_cifar.py``) unless
``--data-root`` names a folder with CIFAR-10 files.

Usage::

    python benchmarks/gpu_round.py                 # everything, on the GPU torch sees
    python benchmarks/gpu_round.py --variants loader device
    python benchmarks/gpu_round.py --quick         # a CPU's few seconds: tiny data, 2 clients

This script reports; it is not a test, and it always exits with status 0.
"""

import argparse
import statistics
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fedx.data import batch_loader, dataset_info, device_batches, load_partition
from fedx.group_training import ClientRandom, GroupMember, train_group
from fedx.models import build_model
from fedx.ops import Model, average
from fedx.training import deterministic_kernels, get_device, train

from fedx_bench import common, gpu

SETTING = common.REPO / "configs" / "cifar10-resnet20-iid.toml"
PLAIN_VARIANTS = ("loader", "device", "device-det", "group")
#: The data paths alone: every batch of the round made (and on the device), no training.
DATA_VARIANTS = ("loader-data", "device-data")
SIM_VARIANTS = ("sim", "sim-groups")
VARIANTS = (*SIM_VARIANTS, *PLAIN_VARIANTS, *DATA_VARIANTS)
#: The issue's target on one H100, seconds per round.
TARGET_SECONDS = 0.6


@dataclass
class Row:
    """One variant's figures."""

    variant: str
    round_seconds: list[float] = field(default_factory=list)
    #: This process's CPU seconds per round (plain loops only): on a shared CPU, steadier than wall time.
    cpu_seconds: list[float] = field(default_factory=list)
    reading: gpu.Reading = field(default_factory=gpu.Reading)
    error: str | None = None

    @property
    def per_round(self) -> float | None:
        """Mean seconds of rounds 2 to R."""
        later = self.round_seconds[1:]
        return statistics.mean(later) if later else None


# ----------------------------------------------------------------------
# The plain loops
# ----------------------------------------------------------------------


def client_seed(server_round: int, client: int) -> int:
    """As ``fedx.client.task.ClientTask.torch_seed`` with seed 0."""
    return server_round * 1009 + client


def plain_round(
    variant: str,
    model: torch.nn.Module,
    weights: Model,
    parts: list,
    arguments: argparse.Namespace,
    device: torch.device,
    server_round: int,
) -> Model:
    """One round of the plain loop: every client trains from ``weights``; FedAvg's average."""
    replies, sizes = [], []
    for client, part in enumerate(parts):
        torch.manual_seed(client_seed(server_round, client))
        model.load_state_dict({name: torch.from_numpy(array) for name, array in weights.items()})
        if variant.startswith("loader"):
            batches = batch_loader(part, arguments.batch, shuffle=True)
        else:
            batches = device_batches(part, arguments.batch, device, shuffle=True)
            assert batches is not None, "CIFAR partitions take the device path"
        if variant in DATA_VARIANTS:
            for _ in range(arguments.epochs):
                for inputs, labels in batches:
                    inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            continue
        with deterministic_kernels(variant == "device-det"):
            train(
                model,
                batches,
                epochs=arguments.epochs,
                learning_rate=0.01,
                momentum=0.9,
                device=device,
            )
        # The reply's copy to the host (ArrayRecord), which waits for the device.
        replies.append({k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})
        sizes.append(len(part))
    return average(replies, weights=sizes) if replies else weights


def group_round(model, weights, parts, arguments, device, server_round) -> Model:
    """The round's clients as one client group (``fedx.group_training``); FedAvg's average.

    Each client is seeded as the ClientApp seeds it, and draws its shuffling,
    crops and flips from its own generator states, as a simulation actor's
    group does (``fedx.client.groups``).
    """
    members = []
    for client, part in enumerate(parts):
        torch.manual_seed(client_seed(server_round, client))
        batches = device_batches(part, arguments.batch, device, shuffle=True)
        assert batches is not None, "CIFAR partitions take the device path"
        members.append(GroupMember(weights, batches, ClientRandom.capture(device)))
    results = train_group(
        model, members, epochs=arguments.epochs, learning_rate=0.01, momentum=0.9, device=device
    )
    # The replies' copies to the host, as a ClientApp's ArrayRecords make them.
    replies = [{k: v.cpu().numpy() for k, v in result.state.items()} for result in results]
    return average(replies, weights=[len(part) for part in parts])


def time_plain(variant: str, arguments: argparse.Namespace, root: Path, monitor) -> Row:
    """The plain loop's rounds of one variant."""
    row = Row(variant)
    device = get_device(arguments.device)
    parts = [
        load_partition("cifar10", client, arguments.partitions, partitioning="iid", root=str(root))
        for client in range(arguments.clients)
    ]
    info = dataset_info("cifar10")
    torch.manual_seed(0)
    model = build_model(arguments.model, info.input_shape, info.num_classes).to(device)
    weights = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    stamps = []
    for server_round in range(1, arguments.rounds + 1):
        _synchronize(device)
        start, cpu_start = time.monotonic(), time.process_time()
        if variant == "group":
            weights = group_round(model, weights, parts, arguments, device, server_round)
        else:
            weights = plain_round(variant, model, weights, parts, arguments, device, server_round)
        _synchronize(device)
        stamps.append(start)
        row.round_seconds.append(time.monotonic() - start)
        row.cpu_seconds.append(time.process_time() - cpu_start)
    if len(stamps) > 1:
        row.reading = monitor.reading(stamps[1], time.monotonic())
    return row


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------
# The simulation
# ----------------------------------------------------------------------


def time_simulation(
    arguments: argparse.Namespace, root: Path, work: Path, monitor, groups: bool = False
) -> list[Row]:
    """fedx-compare's runs of the round, one row per strategy (``groups``: with client groups)."""
    fraction = arguments.clients / arguments.partitions
    overrides = {
        "num-server-rounds": arguments.sim_rounds,
        "eval-every": arguments.sim_rounds,
        "data-root": str(root),
        "model": arguments.model,
        "local-epochs": arguments.epochs,
        "batch-size": arguments.batch,
        "fraction-train": fraction,
        "min-train-nodes": arguments.clients,
        "min-available-nodes": arguments.partitions,
        "device": arguments.device,
        "round-timeout": arguments.timeout,
    }
    resources = arguments
    if groups:
        overrides["client-group-size"] = arguments.group_size or arguments.clients
        resources = argparse.Namespace(
            **{
                **vars(arguments),
                "client_cpus": arguments.group_cpus or arguments.client_cpus,
                "client_gpus": arguments.group_gpus,
            }
        )
    comparison = gpu.run_compare(
        SETTING,
        arguments.strategies,
        work / ("sim-groups" if groups else "sim"),
        resources,
        root=root,
        num_supernodes=arguments.partitions,
        overrides=overrides,
    )
    rows = []
    for method, run in comparison.runs.items():
        row = Row(f"{'sim-groups' if groups else 'sim'} {method}", list(run.round_seconds))
        if len(run.rounds_at) > 1:
            row.reading = monitor.reading(run.rounds_at[0], run.rounds_at[-1])
        if not run.finished:
            row.error = (
                f"fedx-compare exited {comparison.returncode}, {len(run.round_seconds)} of "
                f"{arguments.sim_rounds} rounds recorded:\n{comparison.output_tail}"
            )
        rows.append(row)
    return rows


# ----------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------


def print_header(arguments: argparse.Namespace) -> None:
    print(gpu.device_line())
    written = arguments.train_size // arguments.partitions
    share = f"{written}" if arguments.data_root is None else "1/partitions of the training set's"
    print(
        f"{arguments.model}, {arguments.clients} of {arguments.partitions} IID clients a round, "
        f"{arguments.epochs} epoch(s) of {share} images, "
        f"batch {arguments.batch}; plain loops on {get_device(arguments.device)}, "
        f"{arguments.rounds} rounds; simulation {arguments.sim_rounds} rounds, "
        f"{arguments.client_cpus:g} CPU + {arguments.client_gpus:g} GPU a client; per round = "
        f"mean of rounds 2..R; target {TARGET_SECONDS} s a round (one H100)"
    )
    print(f"{'variant':<16}{'s/round':>10}{'x target':>10}{'round 1 s':>11}{'CPU s':>8}  card")


def print_row(row: Row) -> None:
    per_round = row.per_round
    seconds = "" if per_round is None else f"{per_round:.3f}"
    ratio = "" if per_round is None else f"{per_round / TARGET_SECONDS:.2f}"
    first = f"{row.round_seconds[0]:.2f}" if row.round_seconds else ""
    later_cpu = row.cpu_seconds[1:]
    cpu = f"{statistics.mean(later_cpu):.2f}" if later_cpu else ""  # rounds 2..R, as s/round
    print(
        f"{row.variant:<16}{seconds:>10}{ratio:>10}{first:>11}{cpu:>8}  {row.reading.text()}",
        flush=True,
    )
    common.print_error(row.error)


# ----------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = common.benchmark_parser(__doc__)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    gpu.add_simulation_options(parser, timeout=900.0)
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--partitions", type=int, default=100, help="clients (SuperNodes)")
    parser.add_argument("--clients", type=int, default=10, help="clients a round")
    parser.add_argument("--epochs", type=int, default=5, help="local epochs")
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each plain loop")
    parser.add_argument("--sim-rounds", type=int, default=5, help="rounds of each simulation")
    parser.add_argument("--strategies", nargs="+", default=["fedavg", "fedmr"])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--group-size", type=int, default=0, help="sim-groups: client-group-size (0: --clients)"
    )
    parser.add_argument(
        "--group-cpus", type=float, default=0.0, help="sim-groups: CPUs an actor (0: --client-cpus)"
    )
    parser.add_argument(
        "--group-gpus",
        type=float,
        default=None,
        help="sim-groups: GPU share of an actor (default: 1 where torch sees a GPU, else 0)",
    )
    arguments = gpu.parse_simulation_options(
        parser,
        argv,
        "4 clients, 2 a round, 1 epoch, batch 20, the CNN, the plain loops only, 2 rounds",
        variants=list(PLAIN_VARIANTS),
        partitions=4,
        clients=2,
        epochs=1,
        batch=20,
        rounds=2,
        sim_rounds=2,
        model="cnn",
    )
    if arguments.group_gpus is None:
        arguments.group_gpus = 1.0 if arguments.client_gpus > 0 else 0.0
    if arguments.rounds < 2 or arguments.sim_rounds < 2:
        parser.error("--rounds and --sim-rounds must be at least 2 (round 1 is the start-up)")
    return arguments


def main(argv: Sequence[str] | None = None) -> list[Row]:
    """Run the variants, print the table; return the rows."""
    arguments = parse_arguments(argv)
    print_header(arguments)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedx-gpu-round-") as folder:
        work = Path(folder)
        root = gpu.cifar_root(arguments, work / "data")
        with gpu.GpuMonitor() as monitor:
            for variant in arguments.variants:
                try:
                    if variant in SIM_VARIANTS:
                        groups = variant == "sim-groups"
                        found = time_simulation(arguments, root, work, monitor, groups)
                    else:
                        found = [time_plain(variant, arguments, root, monitor)]
                except Exception as err:  # a report, not a test: show the failure and go on
                    traceback.print_exc()
                    found = [Row(variant, error=repr(err))]
                for row in found:
                    print_row(row)
                rows += found
    return rows
