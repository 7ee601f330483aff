"""Cosine similarity between models, for FedCross's collaborator selection.

Two measures (Hu et al., FedCross, Sec. 3.2.1, and the authors' lab code):

``"model"``
    The paper's: every model is one vector of all its floating-point tensors
    (integer buffers such as BatchNorm's ``num_batches_tracked`` are left
    out), and the similarity of two models is the cosine of their vectors.
    (The paper prints the sum of the norms in the denominator; the cosine
    has their product.)
``"layer-pairs"``
    What the FedCross code of the authors' lab computes (``sim`` in their
    ``Training_FedCross.py``): walk the state dict in order and cut it into
    consecutive pairs of entries (0+1, 2+3, ...; usually a layer's weight
    and bias, but a BatchNorm's five entries shift the pairing), *all*
    entries, integer buffers included, taken as float. The similarity is the
    sum of the cosines of the concatenated pairs, with the last pair counted
    twice; with an odd number of entries the trailing single entry is a term
    of its own, counted once. Values lie in ``[-T, T]`` for ``T`` terms.

Degenerate inputs have defined values: the cosine of a zero vector with
anything (itself included) is 0, as in PyTorch's ``cosine_similarity``, so a
model of zero norm (a zero-initialised slot that no client trained) is
"orthogonal" to every model; the diagonal holds each model's similarity to
itself under the same rule (1 per term of non-zero norm), which collaborator
selection ignores.

The K x K Gram matrices behind the cosines are the only costly part (K^2 P
multiply-adds for P parameters). They are computed from K-row blocks of the
models copied into a cache-sized float32 buffer and multiplied there by
BLAS, each block's product added to a float64 accumulator; a block whose
float32 product overflows, or underflows for a model that is not zero
there, is multiplied again in float64. Models with float64 tensors are
multiplied in float64, each model's part of each term scaled by a power of
two that brings its largest magnitude below one (a cosine does not change
when a vector is scaled), so their squares cannot overflow either. Blocks are spread over as many
threads as BLAS would use, each running single-threaded BLAS, so the copies
are parallel too (see :mod:`fedx.ops.parallel`).
"""

import threading
from collections.abc import Sequence
from typing import Literal, cast

import numpy as np

from fedx.ops.model import Model, check_same_layout
from fedx.ops.parallel import run_tasks

SimilarityMeasure = Literal["model", "layer-pairs"]
SIMILARITY_MEASURES: tuple[str, ...] = ("model", "layer-pairs")

# Elements of one tensor per thread-pool task. Fixed, so that the sums
# (and so the results) do not depend on the number of threads.
_CHUNK = 1 << 20
# Bytes of a thread's K-row staging buffer: BLAS packs its own panels, so
# the buffer only needs to stay in the last-level cache, and large blocks
# keep the per-block Python overhead (one copy call per model) small
# (8 MiB rather than 4 is faster for 10 CNN-sized models on one thread, and
# as fast at 100; ``benchmarks/server_ops.py`` times the similarity matrix).
_STAGING_BYTES = 8 << 20
# Below this many models, a block's Gram matrix is faster as matrix-vector
# products than as BLAS's symmetric rank-k update (the fewer the models the
# larger the gain; from about 20 models on the update is faster).
_FEW_ROWS = 16
# Below this many multiply-adds a thread pool costs more than it saves.
_PARALLEL_WORK = 1 << 26
# A float32 block product is recomputed in float64 when a model's squared
# norm over the block is below this (2**-96) but the block is not all zero:
# its float32 products may have underflowed.
_TINY_SQUARED_NORM = 2.0**-96


def cosine_similarity_matrix(
    models: Sequence[Model], measure: SimilarityMeasure = "model"
) -> np.ndarray:
    """Similarity between every pair of models (see the module docstring).

    Parameters
    ----------
    models : Sequence[Model]
        K models with the same names and shapes. Not modified.
    measure : {"model", "layer-pairs"}
        ``"model"``: the cosine over all floating-point tensors, in
        ``[-1, 1]``. ``"layer-pairs"``: the authors' code's sum of cosines
        over consecutive pairs of state-dict entries.

    Returns
    -------
    np.ndarray
        K x K float64 matrix, symmetric. Where a model (or, for
        ``"layer-pairs"``, a pair of its entries) is all zero, its cosines
        are 0.

    Raises
    ------
    ValueError
        If there are no models, their layouts differ, the measure is
        unknown, or a model holds NaN or Inf.
    """
    if measure not in SIMILARITY_MEASURES:
        raise ValueError(f"measure must be one of {SIMILARITY_MEASURES}, got {measure!r}")
    if not models:
        raise ValueError("cosine_similarity_matrix() needs at least one model")
    check_same_layout(models)
    terms = similarity_terms(models[0], measure)
    names = list(dict.fromkeys(name for term, _ in terms for name in term))
    # float32 (and float16) products cannot overflow the float64 fallback;
    # float64 ones can, so such models are scaled into range first.
    wide = any(
        np.issubdtype(models[0][name].dtype, np.floating) and models[0][name].dtype.itemsize > 4
        for name in names
    )
    grams = _entry_grams(models, names, scales=_unit_scales(models, terms) if wide else None)
    if not all(np.isfinite(gram).all() for gram in grams.values()):
        raise ValueError("models contain NaN or Inf: cosine similarity is undefined")
    similarity = np.zeros((len(models), len(models)))
    for term, multiplicity in terms:
        similarity += multiplicity * _cosines(cast(np.ndarray, sum(grams[name] for name in term)))
    return similarity


def similarity_terms(model: Model, measure: SimilarityMeasure) -> list[tuple[tuple[str, ...], int]]:
    """The vectors whose cosines a measure adds up: (entry names, how often counted).

    ``"model"``: one term, every floating-point entry. ``"layer-pairs"``:
    entries 0+1, 2+3, ... of the state dict, the last pair counted twice, or
    a trailing single entry counted once.
    """
    names = list(model)
    if measure == "model":
        floats = tuple(name for name in names if np.issubdtype(model[name].dtype, np.floating))
        return [(floats, 1)]
    if measure != "layer-pairs":
        raise ValueError(f"measure must be one of {SIMILARITY_MEASURES}, got {measure!r}")
    terms = [(tuple(names[start : start + 2]), 1) for start in range(0, len(names), 2)]
    if terms and len(terms[-1][0]) == 2:
        terms[-1] = (terms[-1][0], 2)
    return terms


def _cosines(gram: np.ndarray) -> np.ndarray:
    """Cosine matrix from a Gram matrix; 0 wherever a vector is zero."""
    norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
    nonzero = norms > 0.0
    divisors = np.where(nonzero, norms, 1.0)
    # One norm at a time (their product can underflow), then the mean with
    # the transpose, which is exactly symmetric.
    scaled = gram / divisors[:, None] / divisors[None, :]
    cosines = np.where(np.outer(nonzero, nonzero), 0.5 * (scaled + scaled.T), 0.0)
    np.clip(cosines, -1.0, 1.0, out=cosines)
    np.fill_diagonal(cosines, nonzero.astype(np.float64))
    return cosines


def _unit_scales(models: Sequence[Model], terms: list[tuple[tuple[str, ...], int]]) -> dict:
    """``{name: scales}``: per model, a power of two that brings the largest
    magnitude of the entry's term into [0.5, 1) (a term's cosine does not
    change when one model's part of it is scaled)."""
    scales = {}
    for term, _ in terms:
        term_scales = np.ones(len(models))
        for index, model in enumerate(models):
            largest = max(
                (
                    float(np.max(np.abs(model[name].astype(np.float64)), initial=0.0))
                    for name in term
                ),
                default=0.0,
            )
            if largest > 0.0:
                term_scales[index] = 2.0 ** -np.frexp(largest)[1]
        scales.update(dict.fromkeys(term, term_scales))
    return scales


# ----------------------------------------------------------------------
# Gram matrices
# ----------------------------------------------------------------------


def _entry_grams(
    models: Sequence[Model], names: list[str], scales: dict[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """``{name: G}`` with ``G[i, j] = <models[i][name], models[j][name]>`` in float64.

    With ``scales``, every block is multiplied in float64, model ``i``'s rows
    of entry ``name`` scaled by ``scales[name][i]`` first (``G`` is then that
    of the scaled models).
    """
    count = len(models)
    tasks: list[tuple[str, list[np.ndarray], int, int]] = []
    for name in names:
        size = models[0][name].size
        flats = [np.ravel(model[name]) for model in models]
        tasks.extend(
            (name, flats, start, min(start + _CHUNK, size)) for start in range(0, size, _CHUNK)
        )

    def run(task: tuple) -> np.ndarray:
        name, flats, start, stop = task
        # float32 overflow and underflow are caught per block and redone in
        # float64 (errstate is per thread: set it in the worker).
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            return _chunk_gram(flats, start, stop, None if scales is None else scales[name])

    work = count * count * sum(models[0][name].size for name in names)
    results = run_tasks(run, tasks, threads=None if work >= _PARALLEL_WORK else 1)
    grams = {name: np.zeros((count, count)) for name in names}
    for (name, *_), gram in zip(tasks, results, strict=True):
        grams[name] += gram  # in task order: the same sums for any number of threads
    return grams


def _chunk_gram(
    flats: list[np.ndarray], start: int, stop: int, scales: np.ndarray | None
) -> np.ndarray:
    """The float64 Gram matrix of ``flat[start:stop]`` over the K flat arrays."""
    count = len(flats)
    dtype = flats[0].dtype
    fast = scales is None and dtype in (np.float32, np.float16)
    staging_dtype = np.dtype(np.float32 if fast else np.float64)
    width = max(1, _STAGING_BYTES // (staging_dtype.itemsize * count))
    staging = _staging(count, min(width, stop - start), staging_dtype)
    gram = np.zeros((count, count))
    for begin in range(start, stop, staging.shape[1]):
        end = min(begin + staging.shape[1], stop)
        rows = staging[:, : end - begin]
        for row, flat in zip(rows, flats, strict=True):
            row[...] = flat[begin:end]
        if scales is not None:
            rows *= scales[:, None]
        product = _block_gram(rows)
        if fast and not _float32_product_is_exact_enough(product, rows):
            product = _block_gram(rows.astype(np.float64))
        gram += product
    return gram


def _block_gram(rows: np.ndarray) -> np.ndarray:
    """``rows @ rows.T``, symmetric, in the dtype of ``rows``.

    BLAS's symmetric product (numpy uses syrk for ``a @ a.T``) spends most
    of its time packing when there are few rows; for them, one
    matrix-vector product per row over the rows below it is faster.
    """
    count = len(rows)
    if count >= _FEW_ROWS:
        return rows @ rows.T
    product = np.empty((count, count), dtype=rows.dtype)
    for index in range(count):
        product[index, index:] = rows[index:] @ rows[index]
        product[index:, index] = product[index, index:]
    return product


def _float32_product_is_exact_enough(product: np.ndarray, rows: np.ndarray) -> bool:
    """False if a float32 block product overflowed, or underflowed for a non-zero row."""
    if not np.isfinite(product).all():
        return False
    tiny = np.diag(product) < _TINY_SQUARED_NORM
    return not (tiny.any() and rows[tiny].any())


_local = threading.local()


def _staging(count: int, width: int, dtype: np.dtype) -> np.ndarray:
    """This thread's K x width staging buffer, reused across blocks and calls."""
    buffers = _local.__dict__.setdefault("buffers", {})
    key = (count, dtype.str)
    buffer = buffers.get(key)
    if buffer is None or buffer.shape[1] < width:
        buffer = buffers[key] = np.empty((count, width), dtype=dtype)
    return buffer[:, :width]
