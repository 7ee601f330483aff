"""Time fedx's server operations against a memory-bound floor.

The floor is the cheapest thing any K-model server operation has to do: one
in-place pass that adds the K models tensor by tensor. Each operation is
reported as a multiple of it, next to its target. The models are random
float32 tensors shaped like VGG-16's CIFAR variant (about 15.2M parameters).

Usage::

    python benchmarks/server_ops.py [--models K] [--params-millions P] [--repeats R]

This script reports; it is not a test, and it always exits with status 0.
"""

import argparse
import gc
import math
import resource
import time
import traceback
from collections.abc import Callable

import numpy as np

from fedx.ops import Model, average, cross_aggregate, mutate, recombine

# Output channels of VGG-16's 13 conv layers ("M" max-pools carry no weights)
# and the widths of the CIFAR classifier head 512 -> 512 -> 512 -> 10.
VGG16_CONV_CHANNELS = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                       512, 512, 512, "M"]  # fmt: skip
CLASSIFIER_WIDTHS = [512, 512, 512]
NUM_CLASSES = 10


def vgg16_cifar_shapes(width: float = 1.0) -> dict[str, tuple[int, ...]]:
    """State-dict names and shapes of torchvision-style VGG-16 for CIFAR.

    ``width`` multiplies every channel count (at least one channel), which
    scales the parameter count by about ``width ** 2``.
    """
    def scaled(channels: int) -> int:
        return max(1, round(channels * width))

    shapes: dict[str, tuple[int, ...]] = {}
    in_channels, index = 3, 0
    for entry in VGG16_CONV_CHANNELS:
        if entry == "M":
            index += 1  # the MaxPool2d module
            continue
        out_channels = scaled(entry)
        shapes[f"features.{index}.weight"] = (out_channels, in_channels, 3, 3)
        shapes[f"features.{index}.bias"] = (out_channels,)
        in_channels = out_channels
        index += 2  # Conv2d, ReLU
    # Classifier: Linear, ReLU, Dropout repeated; the last Linear has no ReLU.
    widths = [in_channels] + [scaled(w) for w in CLASSIFIER_WIDTHS[1:]] + [NUM_CLASSES]
    for layer, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        shapes[f"classifier.{3 * layer}.weight"] = (fan_out, fan_in)
        shapes[f"classifier.{3 * layer}.bias"] = (fan_out,)
    return shapes


def parameter_count(shapes: dict[str, tuple[int, ...]]) -> int:
    return sum(math.prod(shape) for shape in shapes.values())


def shapes_for(params_millions: float | None) -> dict[str, tuple[int, ...]]:
    """VGG-16 shapes, with channels scaled to reach ``params_millions`` if given."""
    shapes = vgg16_cifar_shapes()
    if params_millions is None:
        return shapes
    width = math.sqrt(params_millions * 1e6 / parameter_count(shapes))
    return vgg16_cifar_shapes(width)


def random_models(shapes: dict[str, tuple[int, ...]], count: int, seed: int) -> list[Model]:
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


def best_time(operation: Callable[[], object], repeats: int) -> float:
    """Best wall-clock time of ``repeats`` calls after one warm-up call."""
    result = operation()
    del result
    best = math.inf
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        result = operation()
        best = min(best, time.perf_counter() - start)
        del result  # free the outputs before the next call allocates again
    return best


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=10, help="K, models in the pool")
    parser.add_argument(
        "--params-millions",
        type=float,
        default=None,
        help="parameters per model in millions (default: exact VGG-16, ~15.2M)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per op")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    arguments = parse_arguments()
    count, repeats = arguments.models, max(1, arguments.repeats)
    shapes = shapes_for(arguments.params_millions)
    params = parameter_count(shapes)
    print(
        f"K={count} models x {params / 1e6:.2f}M float32 params in {len(shapes)} tensors "
        f"({params * 4 / 2**20:.0f} MiB each, {count * params * 4 / 2**20:.0f} MiB in all); "
        f"best of {repeats} after one warm-up"
    )
    models = random_models(shapes, count, arguments.seed)
    rng = np.random.default_rng(arguments.seed + 1)
    weights = rng.uniform(1.0, 100.0, size=count).tolist()
    global_model, previous_global = models[0], models[1]

    floor = best_time(lambda: add_in_place(models), repeats)
    # (label, operation, largest acceptable ratio to the floor).
    operations: list[tuple[str, Callable[[], object], float]] = [
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
            8.0,
        ),
    ]

    header = f"{'op':<38}{'seconds':>10}{'x floor':>10}{'target':>10}  result"
    print(header)
    print("-" * len(header))
    print(f"{'floor (in-place sum of K models)':<38}{floor:>10.4f}{1.0:>10.2f}{'':>10}")
    for label, operation, target in operations:
        try:
            seconds = best_time(operation, repeats)
        except Exception:  # a report, not a test: show the failure and go on
            traceback.print_exc()
            print(f"{label:<38}{'':>10}{'':>10}{f'<={target:g}x':>10}  ERROR")
            continue
        ratio = seconds / floor
        verdict = "PASS" if ratio <= target else "MISS"
        print(f"{label:<38}{seconds:>10.4f}{ratio:>10.2f}{f'<={target:g}x':>10}  {verdict}")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"peak RSS: {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
