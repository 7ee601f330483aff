"""Two rounds of every CIFAR paper setting, every method of each, on one GPU: do they run, what do they hold.

For each file of ``configs/cifar10-*.toml`` and ``configs/cifar100-*.toml``
(``--files``), one ``fedx-compare`` call runs every method of the file
(fedx-compare's default methods: FedAvg, FedProx, FedMR, FedMR two-stage,
FedIndep, FedMut, FedCross; ``--methods``) for ``--rounds`` rounds with the
file's own settings: 100 SuperNodes, 10 a round, 5 epochs at batch 50, with
``--client-cpus`` CPUs and ``--client-gpus`` of the GPU each (0.1: ten actors
share the card), on CIFAR-10- and CIFAR-100-shaped data written in
torchvision's files (``fake_cifar.py``) unless ``--data-root`` has real
ones. A row per file: how many runs completed their rounds, seconds per run,
seconds per round after the first, and the card's peak memory (NVML's
``memory.used``, all processes: the actors' CUDA contexts, the server's)
while the file's runs ran.

The whole matrix is 24 files x 7 methods = 168 runs, each paying a
simulation's start (Ray, ten actors, CUDA, data) before its first round:
more than one sitting of a shared GPU. ``--shard K/N`` runs every N-th file
from the K-th (1-based), ``--budget`` stops starting files after that many
seconds, and ``--local-epochs`` shortens the rounds (the memory a round
needs does not depend on it); the table says what was skipped.

Usage::

    python benchmarks/gpu_configs.py                                  # everything
    python benchmarks/gpu_configs.py --shard 1/4 --budget 480         # a quarter, 8 minutes
    python benchmarks/gpu_configs.py --files configs/cifar10-vgg16-iid.toml --methods fedavg
    python benchmarks/gpu_configs.py --quick                          # a CPU: one small case

This script reports; it is not a test, and it always exits with status 0.
"""

import argparse
import glob
import statistics
import tempfile
import time
import tomllib
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedx.compare.plan import default_methods
from fedx.registry import comma_list

from fedx_bench import common, gpu

DEFAULT_FILES = ("configs/cifar10-*.toml", "configs/cifar100-*.toml")


@dataclass
class FileResult:
    """One settings file's runs."""

    path: Path
    dataset: str
    methods: list[str]
    comparison: gpu.Comparison | None = None
    reading: gpu.Reading = field(default_factory=gpu.Reading)
    skipped: str | None = None
    error: str | None = None

    @property
    def completed(self) -> list[str]:
        """The methods whose runs did all their rounds."""
        if self.comparison is None:
            return []
        return [m for m, run in self.comparison.runs.items() if run.finished]

    @property
    def later_round_seconds(self) -> float | None:
        """Mean seconds of the rounds after the first, over the file's runs."""
        if self.comparison is None:
            return None
        later = [s for run in self.comparison.runs.values() for s in run.round_seconds[1:]]
        return statistics.mean(later) if later else None


def setting_files(patterns: Sequence[str], shard: tuple[int, int]) -> list[Path]:
    """The files the patterns match (relative to the checkout), sorted; this shard's only."""
    found = sorted(
        {Path(p) for pattern in patterns for p in glob.glob(str(common.REPO / pattern))}
        | {Path(p).resolve() for p in patterns if Path(p).is_file()}
    )
    index, count = shard
    return found[index - 1 :: count]


def overrides_for(arguments: argparse.Namespace, root: Path, setting: dict) -> dict[str, object]:
    """The run-config keys this script sets on top of the file's."""
    keys: dict[str, object] = {
        "num-server-rounds": arguments.rounds,
        "eval-every": arguments.rounds,
        "data-root": str(root),
        "round-timeout": arguments.timeout,
    }
    if arguments.local_epochs is not None:
        keys["local-epochs"] = arguments.local_epochs
    nodes = arguments.num_supernodes or int(setting["min-available-nodes"])
    keys["min-available-nodes"] = nodes
    if arguments.clients is not None:
        keys["min-train-nodes"] = arguments.clients
        keys["fraction-train"] = arguments.clients / nodes
    return keys


def run_file(
    path: Path, arguments: argparse.Namespace, root: Path, work: Path, monitor
) -> FileResult:
    setting = tomllib.loads(path.read_text())
    result = FileResult(path, str(setting["dataset"]), list(arguments.methods))
    start = time.monotonic()
    result.comparison = gpu.run_compare(
        path,
        result.methods,
        work / path.stem,
        arguments,
        root=root,
        num_supernodes=arguments.num_supernodes or int(setting["min-available-nodes"]),
        overrides=overrides_for(arguments, root, setting),
    )
    result.reading = monitor.reading(start, time.monotonic())
    missing = [m for m in result.methods if m not in result.completed]
    if missing:
        result.error = (
            f"not all rounds done by {', '.join(missing)} (fedx-compare exited "
            f"{result.comparison.returncode}):\n{result.comparison.output_tail}"
        )
    return result


def print_header(arguments: argparse.Namespace, files: list[Path]) -> None:
    print(gpu.device_line())
    epochs = "the file's" if arguments.local_epochs is None else str(arguments.local_epochs)
    print(
        f"{len(files)} file(s) x {len(arguments.methods)} method(s), {arguments.rounds} rounds, "
        f"local epochs {epochs}, {arguments.client_cpus:g} CPU + {arguments.client_gpus:g} GPU "
        "a client; s/round = rounds after the first; peak = the card's memory while the "
        "file's runs ran"
    )
    print(f"{'file':<30}{'done':>8}{'s/run':>8}{'s/round':>9}  card")


def print_result(result: FileResult) -> None:
    if result.skipped:
        print(f"{result.path.name:<30}  skipped: {result.skipped}", flush=True)
        return
    done = f"{len(result.completed)}/{len(result.methods)}"
    per_run = ""
    if result.comparison is not None and result.methods:
        per_run = f"{result.comparison.wall_seconds / len(result.methods):.1f}"
    later = result.later_round_seconds
    rounds = "" if later is None else f"{later:.2f}"
    print(
        f"{result.path.name:<30}{done:>8}{per_run:>8}{rounds:>9}  {result.reading.text()}",
        flush=True,
    )
    common.print_error(result.error)


def _shard(text: str) -> tuple[int, int]:
    index, count = (int(part) for part in text.split("/"))
    return index, count


parse_shard = common.option_type(
    "K/N such as 1/4", _shard, valid=lambda s: 1 <= s[0] <= s[1], rule="1 <= K <= N"
)


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = common.benchmark_parser(__doc__)
    parser.add_argument("--files", nargs="+", default=list(DEFAULT_FILES), help="globs or paths")
    parser.add_argument(
        "--methods",
        type=lambda text: list(comma_list(text)),
        default=default_methods(),
        help="comma-separated (default: fedx-compare's default methods)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--local-epochs", type=int, default=None, help="default: the file's")
    parser.add_argument("--num-supernodes", type=int, default=None, help="default: the file's")
    parser.add_argument("--clients", type=int, default=None, help="a round (default: the file's)")
    parser.add_argument("--shard", type=parse_shard, default=(1, 1), help="K/N: every N-th file")
    parser.add_argument("--budget", type=float, default=None, help="seconds to start files in")
    gpu.add_simulation_options(parser, timeout=900.0)
    return gpu.parse_simulation_options(
        parser,
        argv,
        "configs/cifar10-cnn-iid.toml with FedMR only: 4 SuperNodes, 2 a round, 1 epoch",
        files=["configs/cifar10-cnn-iid.toml"],
        methods=["fedmr"],
        local_epochs=1,
        num_supernodes=4,
        clients=2,
        timeout=600.0,
    )


def main(argv: Sequence[str] | None = None) -> list[FileResult]:
    """Run every selected file's methods; print a row per file; return the results."""
    arguments = parse_arguments(argv)
    files = setting_files(arguments.files, arguments.shard)
    print_header(arguments, files)
    datasets = tuple(sorted({str(tomllib.loads(p.read_text())["dataset"]) for p in files}))
    results = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fedx-gpu-configs-") as folder:
        work = Path(folder)
        root = gpu.cifar_root(arguments, work / "data", datasets)
        with gpu.GpuMonitor() as monitor:
            for path in files:
                if arguments.budget is not None and time.monotonic() - started > arguments.budget:
                    result = FileResult(path, "", list(arguments.methods))
                    result.skipped = f"--budget {arguments.budget:g} s spent"
                else:
                    try:
                        result = run_file(path, arguments, root, work, monitor)
                    except Exception as err:  # a report, not a test: show it and go on
                        traceback.print_exc()
                        result = FileResult(path, "", list(arguments.methods), error=repr(err))
                print_result(result)
                results.append(result)
    print(
        f"{sum(len(r.completed) for r in results)} of "
        f"{sum(len(r.methods) for r in results if not r.skipped)} runs completed their rounds "
        f"in {time.monotonic() - started:.0f} s"
    )
    return results
