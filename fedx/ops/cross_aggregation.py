"""FedCross's multi-model cross aggregation (Hu et al., Sec. 3.2).

Every trained middleware model ``v_i`` picks a collaborator ``v_co`` among the
others (CoModelSel) and becomes ``alpha * v_i + (1 - alpha) * v_co``
(CrossAggr, eq. 6). Collaborators are chosen in order (eq. 2) or by the
highest or lowest cosine similarity (eqs. 3, 4). Propeller models replace the
single collaborator by two in-order ones to speed up early training.
"""

from collections.abc import Sequence
from typing import Literal

import numpy as np

from fedx.ops.typing import Model

Selection = Literal["in_order", "highest_similarity", "lowest_similarity"]
SELECTIONS: tuple[str, ...] = ("in_order", "highest_similarity", "lowest_similarity")

# Elements per block when mixing tensors: the scaled collaborator block stays
# in cache, and the Python loop overhead stays negligible.
_MIX_BLOCK = 1 << 16
# Bytes of the float64 staging buffer for the Gram matrix (K rows): small
# enough to stay in the per-core L2 cache while BLAS multiplies it.
_GRAM_BUFFER_BYTES = 1 << 20


def cosine_similarity_matrix(models: Sequence[Model]) -> np.ndarray:
    """Cosine similarity between every pair of models.

    Each model is taken as one vector of all its floating-point tensors
    (integer tensors are ignored). The Gram matrix of these vectors is
    accumulated block by block in float64, so no K x P copy of the models is
    ever made and the cost is one read of every float tensor.

    Parameters
    ----------
    models : Sequence[Model]
        K models with the same names and shapes. Not modified.

    Returns
    -------
    np.ndarray
        K x K float64 matrix, symmetric, ones on the diagonal, values in
        [-1, 1].

    Raises
    ------
    ValueError
        If there are no models, their layouts differ, a model has zero norm
        (for example no floating-point tensors at all), or the result is not
        finite (NaN or Inf in the weights).
    """
    if not models:
        raise ValueError("cosine_similarity_matrix() needs at least one model")
    _check_same_layout(models)
    gram = _gram_matrix(models)
    if not np.isfinite(gram).all():
        raise ValueError("models contain NaN or Inf: cosine similarity is undefined")
    squared_norms = np.diag(gram).copy()
    zero_norm = np.flatnonzero(squared_norms <= 0.0)
    if zero_norm.size:
        raise ValueError(
            f"models {zero_norm.tolist()} have zero norm: cosine similarity is undefined"
        )
    norms = np.sqrt(squared_norms)
    similarity = gram / np.outer(norms, norms)
    np.clip(similarity, -1.0, 1.0, out=similarity)
    np.fill_diagonal(similarity, 1.0)
    return similarity


def _gram_matrix(models: Sequence[Model]) -> np.ndarray:
    """``G[i, j] = <x_i, x_j>`` over all float tensors, accumulated in float64.

    For each tensor, a block of its elements from all K models is copied
    (and widened to float64) into one K-row staging buffer, and
    ``G += X @ X.T`` adds that block's contribution.
    """
    count = len(models)
    gram = np.zeros((count, count))
    block = max(1, _GRAM_BUFFER_BYTES // (8 * count))
    staging = np.empty((count, block))
    for name, reference in models[0].items():
        if not np.issubdtype(reference.dtype, np.floating):
            continue
        flats = [np.ravel(model[name]) for model in models]
        for start in range(0, reference.size, block):
            stop = min(start + block, reference.size)
            rows = staging[:, : stop - start]
            for row, flat in zip(rows, flats, strict=True):
                row[...] = flat[start:stop]
            gram += rows @ rows.T
    return gram


def collaborator_indices(
    num_models: int,
    *,
    selection: Selection,
    round_index: int,
    similarity: np.ndarray | None = None,
) -> list[int]:
    """Index of each model's collaborator: FedCross's CoModelSel.

    Parameters
    ----------
    num_models : int
        K, at least 2.
    selection : {"in_order", "highest_similarity", "lowest_similarity"}
        ``"in_order"``: model ``i`` collaborates with
        ``(i + (r mod (K - 1)) + 1) mod K`` (eq. 2), so over any ``K - 1``
        consecutive rounds it meets every other model exactly once.
        ``"highest_similarity"`` / ``"lowest_similarity"``: the other model
        with the largest / smallest similarity to ``i`` (eqs. 3, 4); ties go
        to the lowest index.
    round_index : int
        ``r``, the training round, non-negative. Only ``"in_order"`` uses it.
    similarity : np.ndarray, optional
        K x K similarity matrix (see :func:`cosine_similarity_matrix`);
        required by the similarity selections. Its diagonal is ignored.

    Returns
    -------
    list[int]
        ``K`` indices; entry ``i`` is never ``i``.
    """
    _check_selection(selection)
    if num_models < 2:
        raise ValueError(f"cross aggregation needs at least 2 models, got {num_models}")
    if round_index < 0:
        raise ValueError(f"round_index must be >= 0, got {round_index}")
    if selection == "in_order":
        offset = round_index % (num_models - 1) + 1
        return [(index + offset) % num_models for index in range(num_models)]
    if similarity is None:
        raise ValueError(f"selection {selection!r} needs a similarity matrix")
    scores = np.array(similarity, dtype=np.float64)  # a copy: the diagonal is overwritten
    if scores.shape != (num_models, num_models):
        raise ValueError(
            f"similarity must be {num_models} x {num_models}, got shape {scores.shape}"
        )
    if not np.isfinite(scores).all():
        raise ValueError("similarity contains NaN or Inf")
    # A model must never pick itself: push its own score out of reach.
    # argmax/argmin return the first extreme, so ties go to the lowest index.
    if selection == "highest_similarity":
        np.fill_diagonal(scores, -np.inf)
        return np.argmax(scores, axis=1).tolist()
    np.fill_diagonal(scores, np.inf)
    return np.argmin(scores, axis=1).tolist()


def cross_aggregate(
    models: Sequence[Model],
    *,
    alpha: float,
    selection: Selection,
    round_index: int,
    similarity: np.ndarray | None = None,
    propeller: bool = False,
) -> list[Model]:
    """Fuse every model with its collaborator: FedCross's CrossAggr.

    Model ``i`` becomes ``alpha * v_i + (1 - alpha) * v_co(i)`` (eq. 6) for
    floating-point tensors; integer tensors are taken from ``v_i`` unchanged.

    Parameters
    ----------
    models : Sequence[Model]
        The K uploaded models ``v_1 .. v_K``, same names and shapes, K >= 2.
        Not modified.
    alpha : float
        Weight of a model's own parameters, in [0.5, 1.0) (paper: 0.99).
    selection : {"in_order", "highest_similarity", "lowest_similarity"}
        Collaborator rule; see :func:`collaborator_indices`.
    round_index : int
        The training round ``r``, non-negative.
    similarity : np.ndarray, optional
        Precomputed K x K similarity matrix. When a similarity selection
        needs it and it is ``None``, :func:`cosine_similarity_matrix` of
        ``models`` is used.
    propeller : bool
        Use two propeller models instead of one collaborator: the in-order
        collaborators ``p1`` of round ``r`` and ``p2`` of round ``r + 1``
        (two different models when K >= 3, the only other model when K = 2),
        and model ``i`` becomes ``alpha * v_i + (1 - alpha) / 2 * (p1 + p2)``.
        ``selection`` is then not used (propellers are always in order).

    Returns
    -------
    list[Model]
        K models in input order. Float tensors are new arrays of the input
        dtype; integer tensors are the inputs' own arrays (read-only).
    """
    if not 0.5 <= alpha < 1.0:
        raise ValueError(f"alpha must be in [0.5, 1.0), got {alpha}")
    _check_selection(selection)
    count = len(models)
    if count < 2:
        raise ValueError(f"cross aggregation needs at least 2 models, got {count}")
    _check_same_layout(models)
    if propeller:
        first = collaborator_indices(count, selection="in_order", round_index=round_index)
        second = collaborator_indices(count, selection="in_order", round_index=round_index + 1)
        return [
            _blend(models[index], [models[first[index]], models[second[index]]], alpha)
            for index in range(count)
        ]
    if selection != "in_order" and similarity is None:
        similarity = cosine_similarity_matrix(models)
    partners = collaborator_indices(
        count, selection=selection, round_index=round_index, similarity=similarity
    )
    return [
        _blend(models[index], [models[partners[index]]], alpha) for index in range(count)
    ]


def _blend(own: Model, others: Sequence[Model], alpha: float) -> Model:
    """``alpha * own + (1 - alpha) * mean(others)`` per float tensor."""
    other_weight = (1.0 - alpha) / len(others)
    return {
        name: _blend_tensor(weights, [other[name] for other in others], alpha, other_weight)
        if np.issubdtype(weights.dtype, np.floating)
        else weights
        for name, weights in own.items()
    }


def _blend_tensor(
    own: np.ndarray, others: list[np.ndarray], own_weight: float, other_weight: float
) -> np.ndarray:
    """``own_weight * own + other_weight * sum(others)`` into one new array.

    Works block by block so the only temporary is one cache-sized scratch
    block, and each input is read once.
    """
    scalar = own.dtype.type
    own_factor, other_factor = scalar(own_weight), scalar(other_weight)
    blended = np.empty(own.shape, dtype=own.dtype)
    flat_blended = blended.reshape(-1)
    flat_own = np.ravel(own)
    flat_others = [np.ravel(other) for other in others]
    scratch = np.empty(min(_MIX_BLOCK, own.size), dtype=own.dtype)
    for start in range(0, own.size, _MIX_BLOCK):
        block = slice(start, start + _MIX_BLOCK)
        target = flat_blended[block]
        partial = scratch[: target.size]
        np.multiply(flat_own[block], own_factor, out=target)
        if len(flat_others) == 1:
            np.multiply(flat_others[0][block], other_factor, out=partial)
        else:
            np.add(flat_others[0][block], flat_others[1][block], out=partial)
            for flat in flat_others[2:]:
                partial += flat[block]
            partial *= other_factor
        target += partial
    return blended


def _check_selection(selection: str) -> None:
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")


def _check_same_layout(models: Sequence[Model]) -> None:
    """Raise ValueError unless all models have the names and shapes of the first."""
    reference = models[0]
    for index, model in enumerate(models[1:], start=1):
        if model.keys() != reference.keys():
            missing = [name for name in reference if name not in model]
            extra = [name for name in model if name not in reference]
            raise ValueError(
                f"model {index} has other names than model 0 "
                f"(missing {missing[:3]}, unexpected {extra[:3]})"
            )
        for name, weights in reference.items():
            if model[name].shape != weights.shape:
                raise ValueError(
                    f"model {index}: {name} has shape {model[name].shape}, "
                    f"model 0 has {weights.shape}"
                )
