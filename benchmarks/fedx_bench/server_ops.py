"""Time fedx's server operations against a memory-bound floor, for CNN and VGG-16 pools.

The floor is the cheapest thing any K-model server operation has to do: one
in-place pass that adds the K models tensor by tensor. For every case (a pool
size K and a model) the floor is measured first, and each operation is then
reported as a multiple of that same-run floor, next to its target:

* ``average`` and ``average (weighted)``: FedAvg's aggregation and the global
  model of every multi-model strategy;
* ``recombine``: FedMR's layer shuffle (it moves references, no weights);
* ``mutate``: FedMut's K mutations of the global model;
* ``cross_aggregate``: FedCross with the paper's default collaborator rule
  (lowest cosine similarity), so the K x K similarity matrix is included;
  the matrix alone is timed too, as a share of it, for the paper's measure
  and for the authors' code's layer-pair sum, and so are the K blends alone
  (in-order collaborators need no matrix) (targets from issue 18: 4x at
  K <= 10, 6x above);
* ``fedme_aggregate``: FedMe's eq. 8, every personalized model averaged with
  the trained copies of it that were exchanged out (one cluster, every
  client holding one copy).

The models are random float32 tensors with the state-dict shapes of fedx's
``cnn`` (the FedAvg CNN, 2.16M parameters on 3x32x32 CIFAR input with 10
classes) and ``vgg16`` (the CIFAR VGG-16, 15.2M parameters), computed here
so that the timed code is numpy alone. Every case prints its peak resident
memory; the pool is freed before the next case starts.

Memory: a case holds its K-model pool and, at worst, K new models that
``cross_aggregate`` and ``fedme_aggregate`` write (``mutate`` writes two,
``recombine`` none), about (2K + 2) model sizes: 12.2 GB for K = 100 VGG-16
models (6.1 GB pool). A case whose estimate exceeds the available memory
(``MemAvailable``, or ``--max-memory-gib``) is refused with a message and the
others still run. To keep FedMe's case at that size its exchanged copies are
the pool's own arrays (client j's copy is model j's memory): a copy's values
do not change the work, which reads every model twice either way.

The similarity matrix costs K(K+1)/2 P multiply-adds (P parameters per
model), so unlike the rest its ratio to the floor grows with K: with F
multiply-adds per second per thread and a floor that streams B bytes per
second, the matrix alone is at least (K + 1) B / (8 F) times the floor.
fedx.ops spreads it (and FedCross's K blends) over as many threads as BLAS
would use, each calling single-threaded BLAS (``fedx.ops.parallel``); the
floor is one thread. Compare ``OPENBLAS_NUM_THREADS=1`` (one thread for
everything) and ``--busy N`` (N processes spinning on the cores meanwhile,
as Ray's training workers would). The header prints both settings and the
BLAS kernels in use.

Usage::

    python benchmarks/server_ops.py                      # K in {10, 100} x {cnn, vgg16}
    python benchmarks/server_ops.py --models 10 --arch vgg16 --repeats 3
    python benchmarks/server_ops.py --arch cnn --params-millions 5
    python benchmarks/server_ops.py --quick              # K=10 CNN, 1 repeat, seconds
    python benchmarks/server_ops.py --busy 1             # one core kept busy meanwhile
    python benchmarks/server_ops.py --clock cpu          # CPU seconds, on a shared machine
    OPENBLAS_NUM_THREADS=1 python benchmarks/server_ops.py

This script reports; it is not a test, and it always exits with status 0.
"""

import argparse
import contextlib
import ctypes
import ctypes.util
import functools
import gc
import math
import multiprocessing
import os
import resource
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedx.ops import (
    Model,
    assign_exchanges,
    average,
    cosine_similarity_matrix,
    cross_aggregate,
    fedme_aggregate,
    mutate,
    recombine,
)
from fedx.ops.parallel import thread_count

from fedx_bench import common

Shapes = dict[str, tuple[int, ...]]

# Output channels of VGG-16's 13 conv layers ("M" max-pools carry no weights)
# and the widths of the CIFAR classifier head 512 -> 512 -> 512 -> 10.
VGG16_CONV_CHANNELS = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                       512, 512, 512, "M"]  # fmt: skip
CLASSIFIER_WIDTHS = [512, 512, 512]
NUM_CLASSES = 10
# The FedAvg CNN (fedx.models.CNN): two 5x5 conv blocks that each halve the
# 32x32 input, then a 512-unit hidden layer.
CNN_CONV_CHANNELS = (32, 64)
CNN_HIDDEN_UNITS = 512
CIFAR_INPUT = (3, 32, 32)
BYTES_PER_PARAMETER = 4  # float32
GIB = 2**30
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _scaled(channels: int, width: float) -> int:
    return max(1, round(channels * width))


def vgg16_cifar_shapes(width: float = 1.0) -> Shapes:
    """State-dict names and shapes of fedx's VGG-16 for CIFAR (torchvision's conv stack).

    ``width`` multiplies every channel count (at least one channel), which
    scales the parameter count by about ``width ** 2``.
    """
    shapes: Shapes = {}
    in_channels, index = CIFAR_INPUT[0], 0
    for entry in VGG16_CONV_CHANNELS:
        if entry == "M":
            index += 1  # the MaxPool2d module
            continue
        out_channels = _scaled(entry, width)
        shapes[f"features.{index}.weight"] = (out_channels, in_channels, 3, 3)
        shapes[f"features.{index}.bias"] = (out_channels,)
        in_channels = out_channels
        index += 2  # Conv2d, ReLU
    # Classifier: Linear, ReLU, Dropout repeated; the last Linear has no ReLU.
    widths = [in_channels] + [_scaled(w, width) for w in CLASSIFIER_WIDTHS[1:]] + [NUM_CLASSES]
    for layer, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        shapes[f"classifier.{3 * layer}.weight"] = (fan_out, fan_in)
        shapes[f"classifier.{3 * layer}.bias"] = (fan_out,)
    return shapes


def cnn_cifar_shapes(width: float = 1.0) -> Shapes:
    """State-dict names and shapes of fedx's ``cnn`` on 3x32x32 input with 10 classes.

    Each conv block is Conv2d (5x5, padding 2), ReLU, MaxPool2d(2), so the
    module indices step by three and the side halves per block. ``width``
    scales the conv channels and the hidden units.
    """
    shapes: Shapes = {}
    in_channels, side = CIFAR_INPUT[0], CIFAR_INPUT[1]
    for block, channels in enumerate(CNN_CONV_CHANNELS):
        out_channels = _scaled(channels, width)
        shapes[f"features.{3 * block}.weight"] = (out_channels, in_channels, 5, 5)
        shapes[f"features.{3 * block}.bias"] = (out_channels,)
        in_channels, side = out_channels, side // 2
    hidden = _scaled(CNN_HIDDEN_UNITS, width)
    shapes["classifier.0.weight"] = (hidden, in_channels * side * side)
    shapes["classifier.0.bias"] = (hidden,)
    shapes["classifier.2.weight"] = (NUM_CLASSES, hidden)
    shapes["classifier.2.bias"] = (NUM_CLASSES,)
    return shapes


ARCHITECTURES: dict[str, Callable[[float], Shapes]] = {
    "cnn": cnn_cifar_shapes,
    "vgg16": vgg16_cifar_shapes,
}


def parameter_count(shapes: Shapes) -> int:
    """Number of parameters of a model with these shapes."""
    return sum(math.prod(shape) for shape in shapes.values())


def shapes_for(architecture: str, params_millions: float | None = None) -> Shapes:
    """An architecture's shapes, with channels scaled to reach ``params_millions`` if given."""
    build = ARCHITECTURES[architecture]
    shapes = build(1.0)
    if params_millions is None:
        return shapes
    return build(math.sqrt(params_millions * 1e6 / parameter_count(shapes)))


def random_models(shapes: Shapes, count: int, seed: int) -> list[Model]:
    """``count`` models of random float32 values."""
    rng = np.random.default_rng(seed)
    return [
        {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes.items()}
        for _ in range(count)
    ]


def add_in_place(models: list[Model]) -> Model:
    """The floor: one pass over every input, accumulating into one copy."""
    total = {}
    for name in models[0]:
        accumulator = models[0][name].copy()
        for model in models[1:]:
            accumulator += model[name]
        total[name] = accumulator
    return total


#: What a time is: wall-clock seconds, or CPU seconds of this process with
#: all its threads added up (robust to other processes sharing the cores,
#: but a threaded operation then shows its total work, not its wall time).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def best_time(
    operation: Callable[[], object], repeats: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Best time of ``repeats`` calls after one warm-up call, on ``clock``."""
    result = operation()
    del result
    best = math.inf
    for _ in range(repeats):
        gc.collect()
        start = clock()
        result = operation()
        best = min(best, clock() - start)
        del result  # free the outputs before the next call allocates again
    return best


# ----------------------------------------------------------------------
# Memory
# ----------------------------------------------------------------------


def estimated_peak_bytes(count: int, model_bytes: int) -> int:
    """What a case holds at its worst: the pool, K new models and two more."""
    return (2 * count + 2) * model_bytes


def release_memory() -> None:
    """Free unreachable objects and hand the C heap's free pages back to the OS.

    glibc raises its mmap threshold after large frees, so later model-sized
    arrays come from the heap, which keeps freed pages resident: without the
    trim, a case would start with the previous case's memory still counted.
    """
    gc.collect()
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def resident_bytes() -> int | None:
    """Current resident memory (``VmRSS``), where ``/proc`` has it."""
    return common.proc_kib_field("/proc/self/status", "VmRSS")


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux >= 4.0); whether it worked."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak resident memory since the last reset (``VmHWM``), else since the start."""
    peak = common.proc_kib_field("/proc/self/status", "VmHWM")
    if peak is not None:
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


# ----------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------


@dataclass
class OpResult:
    """One operation of one case: seconds, multiple of the floor, target."""

    label: str
    seconds: float | None
    ratio: float | None
    target: float | None

    @property
    def verdict(self) -> str:
        """PASS/MISS against the target, ERROR when it failed, empty without a target."""
        if self.ratio is None:
            return "ERROR"
        if self.target is None:
            return ""
        return "PASS" if self.ratio <= self.target else "MISS"


@dataclass
class CaseResult:
    """One (K, model) case: its floor, operations and peak memory."""

    architecture: str
    count: int
    params: int
    floor_seconds: float | None = None
    ops: list[OpResult] = field(default_factory=list)
    peak_rss: int | None = None
    refused: str | None = None


Operation = tuple[str, Callable[[], object], float | None]


def operations(models: list[Model], seed: int) -> list[Operation]:
    """(label, operation, largest acceptable ratio to the floor or None) of one pool."""
    count = len(models)
    rng = np.random.default_rng(seed + 1)
    weights = rng.uniform(1.0, 100.0, size=count).tolist()
    global_model, previous_global = models[0], models[1]
    partners = assign_exchanges(np.zeros(count, dtype=np.int64), rng)
    return [
        ("average", lambda: average(models), 1.5),
        ("average (weighted)", lambda: average(models, weights=weights), 1.5),
        ("recombine", lambda: recombine(models, rng), 0.05),
        (
            "mutate (alpha=4, beta=0.3)",
            lambda: mutate(global_model, previous_global, rng, k=count, alpha=4.0, beta=0.3),
            4.0,
        ),
        (
            "cross_aggregate (lowest_similarity)",
            lambda: cross_aggregate(
                models, alpha=0.99, selection="lowest_similarity", round_index=1
            ),
            4.0 if count <= 10 else 6.0,
        ),
        # Part of the row above: how much of it the K x K matrix takes.
        ("  of which cosine_similarity_matrix", lambda: cosine_similarity_matrix(models), None),
        # The same with the authors' code's measure (the same Gram work).
        (
            "  or with layer-pairs similarity",
            lambda: cosine_similarity_matrix(models, measure="layer-pairs"),
            None,
        ),
        # The rest: the K blends alone, with collaborators that need no matrix.
        (
            "  blends alone (in-order partners)",
            lambda: cross_aggregate(models, alpha=0.99, selection="in_order", round_index=1),
            None,
        ),
        # Our target: it reads every model twice (as itself and as a copy)
        # and writes up to K models, as much traffic as mutate's target allows.
        ("fedme_aggregate (eq. 8)", lambda: fedme_aggregate(models, models, partners), 4.0),
    ]


def time_operations(
    models: list[Model],
    floor: float,
    repeats: int,
    seed: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[OpResult]:
    """Time every operation on one pool; a failing one is reported, not raised."""
    results = []
    for label, operation, target in operations(models, seed):
        try:
            seconds = best_time(operation, repeats, clock)
        except Exception:  # a report, not a test: show the failure and go on
            traceback.print_exc()
            results.append(OpResult(label, None, None, target))
            continue
        results.append(OpResult(label, seconds, seconds / floor, target))
    return results


def run_case(  # pylint: disable=too-many-arguments
    architecture: str,
    count: int,
    shapes: Shapes,
    repeats: int,
    seed: int,
    limit: int | None,
    clock: Callable[[], float] = time.perf_counter,
) -> CaseResult:
    """Build one pool, time the floor and every operation on it, free it."""
    params = parameter_count(shapes)
    model_bytes = params * BYTES_PER_PARAMETER
    case = CaseResult(architecture, count, params)
    needed = estimated_peak_bytes(count, model_bytes)
    print(
        f"\n== K={count} {architecture}: {params / 1e6:.2f}M float32 params in {len(shapes)} "
        f"tensors, {model_bytes / 2**20:.1f} MiB each, pool {count * model_bytes / GIB:.2f} GiB; "
        f"estimated peak {needed / GIB:.2f} GiB; best of {repeats} after one warm-up"
    )
    if limit is not None and needed > limit:
        case.refused = (
            f"refused: needs about {needed / GIB:.1f} GiB, only {limit / GIB:.1f} GiB available "
            "(free memory, choose smaller --models/--arch, or raise --max-memory-gib)"
        )
        print(case.refused)
        return case
    release_memory()
    reset_peak_rss()
    models = random_models(shapes, count, seed)
    case.floor_seconds = best_time(functools.partial(add_in_place, models), repeats, clock)
    case.ops = time_operations(models, case.floor_seconds, repeats, seed, clock)
    case.peak_rss = peak_rss_bytes()
    del models
    release_memory()
    print_case(case)
    return case


def print_case(case: CaseResult) -> None:
    """The case's table: seconds, multiple of the floor, target, verdict."""
    common.print_header(f"{'op':<38}{'seconds':>10}{'x floor':>10}{'target':>10}  result")
    print(f"{'floor (in-place sum of K models)':<38}{case.floor_seconds:>10.4f}{1.0:>10.2f}")
    for op in case.ops:
        target = "" if op.target is None else f"<={op.target:g}x"
        if op.seconds is None or op.ratio is None:
            print(f"{op.label:<38}{'':>10}{'':>10}{target:>10}  ERROR")
            continue
        print(f"{op.label:<38}{op.seconds:>10.4f}{op.ratio:>10.2f}{target:>10}  {op.verdict}")
    if case.peak_rss is not None:
        print(f"peak RSS of this case: {case.peak_rss / 2**20:.0f} MiB")


def print_summary(cases: Sequence[CaseResult]) -> None:
    """One line per case: the ratios side by side."""
    done = [case for case in cases if case.refused is None]
    if len(done) < 2:
        return
    labels = [op.label.strip() for op in done[0].ops]
    print("\n== x floor, all cases")
    columns = [f"K={case.count} {case.architecture}" for case in done]
    print(f"{'op':<38}" + "".join(f"{column:>16}" for column in columns))
    for index, label in enumerate(labels):
        cells = []
        for case in done:
            ratio = case.ops[index].ratio
            cells.append(f"{'ERROR' if ratio is None else f'{ratio:.2f}':>16}")
        print(f"{label:<38}" + "".join(cells))


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options; ``--quick`` changes the defaults of the case grid and repeats."""
    parser = common.benchmark_parser(__doc__)
    parser.add_argument(
        "--models",
        type=int,
        nargs="+",
        default=[10, 100],
        help="K, models in the pool (default: 10 100)",
    )
    parser.add_argument(
        "--arch",
        nargs="+",
        choices=sorted(ARCHITECTURES),
        default=["cnn", "vgg16"],
        help="model shapes (default: cnn vgg16)",
    )
    parser.add_argument(
        "--params-millions",
        type=float,
        default=None,
        help="scale the channels to this many parameters per model, in millions",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per op")
    common.add_memory_limit(parser, "refuse cases")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall-clock seconds, or this process's CPU seconds (all threads), "
        "which other processes on the cores disturb less (default: wall)",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="keep N processes spinning on the cores while timing (default: 0)",
    )
    arguments = common.parse_quick(
        parser,
        argv,
        "K=10 CNN models, 1 repeat: a smoke run of a few seconds",
        models=[10],
        arch=["cnn"],
        repeats=1,
    )
    if min(arguments.models) < 2:
        parser.error("--models must be at least 2 (cross aggregation needs a collaborator)")
    return arguments


def _spin(stop) -> None:
    """Burn one core until told to stop (a stand-in for a training process)."""
    while not stop.is_set():
        for _ in range(100_000):
            pass


@contextlib.contextmanager
def busy_cores(count: int):
    """``count`` spinning processes for the duration of the block."""
    if count <= 0:
        yield
        return
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    spinners = [context.Process(target=_spin, args=(stop,), daemon=True) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join(timeout=5)
            if spinner.is_alive():
                spinner.kill()


def blas_description() -> str:
    """The BLAS library, its kernels and threads, as threadpoolctl sees them."""
    try:
        from threadpoolctl import threadpool_info  # pylint: disable=import-outside-toplevel
    except ImportError:
        return "unknown (threadpoolctl missing)"
    libraries = [info for info in threadpool_info() if info.get("user_api") == "blas"]
    return (
        "; ".join(
            f"{info.get('internal_api')} {info.get('version')} ({info.get('architecture')} kernels), "
            f"{info.get('num_threads')} threads"
            for info in libraries
        )
        or "none found"
    )


def main(argv: Sequence[str] | None = None) -> list[CaseResult]:
    """Run the chosen cases and print their tables; return the results."""
    arguments = parse_arguments(argv)
    repeats = max(1, arguments.repeats)
    limit = common.memory_limit(arguments)
    threads = {key: os.environ[key] for key in BLAS_THREAD_VARIABLES if key in os.environ}
    print(f"BLAS threads: {threads or f'not set (OpenBLAS uses all {os.cpu_count()} cores)'}")
    print(
        f"BLAS: {blas_description()}; fedx.ops threads: {thread_count()} "
        f"of {os.cpu_count()} cores; busy processes meanwhile: {arguments.busy}; "
        f"clock: {arguments.clock}"
    )
    if not reset_peak_rss():
        print("note: cannot reset the peak-RSS mark; per-case peaks are since the process started")
    cases = []
    with busy_cores(arguments.busy):
        for architecture in arguments.arch:
            shapes = shapes_for(architecture, arguments.params_millions)
            for count in arguments.models:
                try:
                    cases.append(
                        run_case(
                            architecture,
                            count,
                            shapes,
                            repeats,
                            arguments.seed,
                            limit,
                            CLOCKS[arguments.clock],
                        )
                    )
                except MemoryError:
                    print(f"K={count} {architecture}: out of memory; skipped")
                release_memory()
                resident = resident_bytes()
                if resident is not None and cases and cases[-1].refused is None:
                    print(f"resident after freeing the case: {resident / 2**20:.0f} MiB")
    print_summary(cases)
    peaks = [case.peak_rss for case in cases if case.peak_rss is not None]
    if peaks:
        print(f"\npeak RSS, largest case: {max(peaks) / 2**20:.0f} MiB")
    return cases
