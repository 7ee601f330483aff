"""FedMR's layer-wise model recombination (Hu et al., KDD'24, Sec. 4.2)."""

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from fedx.ops.model import Model

Grouping = Literal["tensor", "module"]
GROUPINGS: tuple[str, ...] = ("tensor", "module")


def layer_groups(names: Sequence[str], grouping: Grouping = "tensor") -> list[list[str]]:
    """Split state-dict names into the layers that recombination moves as units.

    Parameters
    ----------
    names : Sequence[str]
        State-dict names in model order.
    grouping : {"tensor", "module"}
        ``"tensor"``: every tensor is its own layer (the authors' code).
        ``"module"``: all tensors of one module (``conv1.weight``,
        ``conv1.bias``; a BatchNorm's weight, bias and running statistics)
        form one layer. The module is the name without its last component.

    Returns
    -------
    list[list[str]]
        Layers in order of first appearance, each a list of names.
    """
    if grouping == "tensor":
        return [[name] for name in names]
    if grouping == "module":
        groups: dict[str, list[str]] = {}
        for name in names:
            groups.setdefault(name.rpartition(".")[0] or name, []).append(name)
        return list(groups.values())
    raise ValueError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")


def segment_ids(num_layers: int, segment_fraction: float | None) -> list[int]:
    """Segment of each layer for the FedMR-px ablation.

    Layer ``j`` (1-based) of ``N`` belongs to segment ``ceil(j / (x * N))``,
    so there are ``ceil(1 / x)`` segments and layers of one segment share a
    permutation. ``None`` gives every layer its own segment (plain FedMR).

    Returns
    -------
    list[int]
        The 1-based segment of each layer, non-decreasing.
    """
    if segment_fraction is None:
        return list(range(1, num_layers + 1))
    if not 0.0 < segment_fraction <= 1.0:
        raise ValueError(f"segment_fraction must be in (0, 1], got {segment_fraction}")
    width = segment_fraction * num_layers
    # Rounding before ceil keeps exact ratios exact: 29 / (0.29 * 100) is
    # 1.0000000000000002 in floating point and would otherwise start a segment.
    return [math.ceil(round(j / width, 9)) for j in range(1, num_layers + 1)]


def recombine(
    models: Sequence[Model],
    rng: np.random.Generator,
    *,
    grouping: Grouping = "tensor",
    segment_fraction: float | None = None,
) -> list[Model]:
    """Shuffle layers among models: FedMR's ModelRecombine.

    For every segment a permutation ``pi`` of the K models is drawn; new model
    ``i`` takes the segment's layers from model ``pi(i)``. Every input layer
    lands in exactly one output model, so per layer the sum over models and
    the sum of squared distances to any point are unchanged (Lemma 4.4).

    Parameters
    ----------
    models : Sequence[Model]
        The K trained models, same names in the same order. Not modified.
    rng : np.random.Generator
        Source of the permutations.
    grouping : {"tensor", "module"}
        What a layer is; see :func:`layer_groups`.
    segment_fraction : float, optional
        FedMR-px: ``x`` in (0, 1]; see :func:`segment_ids`. ``1.0`` moves
        whole models (FedIndep).

    Returns
    -------
    list[Model]
        K new dicts whose values are the input arrays themselves (no weights
        are copied).
    """
    if not models:
        return []
    groups = layer_groups(list(models[0]), grouping)
    segments = segment_ids(len(groups), segment_fraction)
    recombined: list[Model] = [{} for _ in models]
    permutation = np.arange(len(models))
    for index, group in enumerate(groups):
        if index == 0 or segments[index] != segments[index - 1]:
            permutation = rng.permutation(len(models))
        for target, source in enumerate(permutation):
            for name in group:
                recombined[target][name] = models[int(source)][name]
    # Keep the state-dict order even when grouping="module" gathers names
    # that are not adjacent.
    order = list(models[0])
    return [{name: model[name] for name in order} for model in recombined]
