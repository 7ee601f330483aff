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

from fedx.ops.aggregation import weighted_sums
from fedx.ops.model import Model, check_same_layout
from fedx.ops.similarity import SimilarityMeasure, cosine_similarity_matrix

Selection = Literal["in_order", "highest_similarity", "lowest_similarity"]
SELECTIONS: tuple[str, ...] = ("in_order", "highest_similarity", "lowest_similarity")


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
        K. With K = 1 the only model is its own collaborator (there is no
        other), so cross aggregation leaves it unchanged; K = 0 gives [].
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
        required by the similarity selections (K >= 2). Its diagonal is
        ignored: a model never picks itself, whatever its own score.

    Returns
    -------
    list[int]
        ``K`` indices; for K >= 2 entry ``i`` is never ``i``.
    """
    _check_selection(selection)
    if num_models < 0:
        raise ValueError(f"num_models must be >= 0, got {num_models}")
    if round_index < 0:
        raise ValueError(f"round_index must be >= 0, got {round_index}")
    if num_models < 2:
        return list(range(num_models))
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
    measure: SimilarityMeasure = "model",
    propeller: bool = False,
) -> list[Model]:
    """Fuse every model with its collaborator: FedCross's CrossAggr.

    Model ``i`` becomes ``alpha * v_i + (1 - alpha) * v_co(i)`` (eq. 6) for
    floating-point tensors; integer tensors are taken from ``v_i`` unchanged.

    Parameters
    ----------
    models : Sequence[Model]
        The K uploaded models ``v_1 .. v_K``, same names and shapes. Not
        modified. With K = 1 there is no collaborator and the model comes
        back unchanged (a copy); K = 0 gives [].
    alpha : float
        Weight of a model's own parameters, in [0.5, 1.0) (paper: 0.99).
    selection : {"in_order", "highest_similarity", "lowest_similarity"}
        Collaborator rule; see :func:`collaborator_indices`.
    round_index : int
        The training round ``r``, non-negative.
    similarity : np.ndarray, optional
        Precomputed K x K similarity matrix. When a similarity selection
        needs it and it is ``None``, it is computed from ``models`` with
        ``measure``.
    measure : {"model", "layer-pairs"}
        The similarity to compute when none is given: the paper's cosine over
        whole models (default) or the authors' code's sum over pairs of
        state-dict entries; see :func:`cosine_similarity_matrix`.
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
        dtype (finite for finite inputs); integer tensors are the inputs' own
        arrays (read-only).
    """
    if not 0.5 <= alpha < 1.0:
        raise ValueError(f"alpha must be in [0.5, 1.0), got {alpha}")
    _check_selection(selection)
    count = len(models)
    if count == 0:
        return []
    check_same_layout(models)
    if count == 1:
        partners: list[list[int]] = [[]]
    elif propeller:
        first = collaborator_indices(count, selection="in_order", round_index=round_index)
        second = collaborator_indices(count, selection="in_order", round_index=round_index + 1)
        partners = [[p1, p2] for p1, p2 in zip(first, second, strict=True)]
    else:
        if selection != "in_order" and similarity is None:
            similarity = cosine_similarity_matrix(models, measure)
        chosen = collaborator_indices(
            count, selection=selection, round_index=round_index, similarity=similarity
        )
        partners = [[partner] for partner in chosen]
    factors = [
        [alpha] + [(1.0 - alpha) / len(others)] * len(others) if others else [1.0]
        for others in partners
    ]
    blended: list[Model] = [{} for _ in range(count)]
    for name, reference in models[0].items():
        if not np.issubdtype(reference.dtype, np.floating):
            for index, model in enumerate(models):
                blended[index][name] = model[name]
            continue
        terms = [
            [models[index][name]] + [models[other][name] for other in others]
            for index, others in enumerate(partners)
        ]
        # All K outputs of a tensor together, block by block: each model's
        # block is read from memory once, then from cache as a collaborator.
        for model, array in zip(blended, weighted_sums(terms, factors), strict=True):
            model[name] = array
    return blended


def _check_selection(selection: str) -> None:
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
