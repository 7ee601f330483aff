"""Weighted averaging of models, and the one blocked weighted sum behind every fusion."""

from collections.abc import Sequence
from typing import cast

import numpy as np

from fedx.ops.model import Model
from fedx.ops.parallel import run_tasks

# Elements per block of the weighted sums: large enough that the Python
# overhead per block (a few ufunc calls per output) stays small next to the
# work, small enough that the blocks an output reads and writes stay in the
# core's cache for the next output.
_BLOCK = 1 << 17
# Elements of every output per thread-pool task: a few blocks, so that the
# threads share the work of one large tensor evenly.
_SPAN = 1 << 18
# Below this many elements read, threads cost more than they save (handing
# tasks to the threads has a cost of its own per task, far higher on busy cores;
# FedMe's two-model means of a CNN layer, 4M elements, got slower with them).
_PARALLEL_WORK = 1 << 24


def average(models: Sequence[Model], weights: Sequence[float] | None = None) -> Model:
    """Average models element-wise, optionally weighted.

    Parameters
    ----------
    models : Sequence[Model]
        Models with the same names, shapes and dtypes. Not modified.
    weights : Sequence[float], optional
        One non-negative weight per model (for example its number of training
        examples); they are normalised to sum to one. ``None`` means equal
        weights, the plain mean.

    Returns
    -------
    Model
        New arrays with the dtypes of the inputs; finite inputs give a finite
        mean (see :func:`weighted_sums`). Integer tensors (such as
        BatchNorm's ``num_batches_tracked``) are averaged in float64 and
        rounded back to their integer dtype. The mean of one model is a copy
        of it.
    """
    if not models:
        raise ValueError("average() needs at least one model")
    factors = normalised_weights(len(models), weights)
    return {
        name: weighted_sums([[model[name] for model in models]], [factors])[0] for name in models[0]
    }


def normalised_weights(count: int, weights: Sequence[float] | None) -> np.ndarray:
    """``count`` float64 factors that sum to one: equal ones, or ``weights`` normalised.

    The weights are divided by the largest one before they are summed, so
    finite weights never give an infinite total.
    """
    if weights is None:
        return np.full(count, 1.0 / count)
    factors = np.asarray(weights, dtype=np.float64)
    if factors.shape != (count,):
        raise ValueError(f"expected {count} weights, got {factors.size}")
    if not np.isfinite(factors).all() or np.any(factors < 0) or not np.any(factors > 0):
        raise ValueError(f"weights must be finite, non-negative, not all zero: {list(weights)}")
    factors = factors / factors.max()
    return factors / factors.sum()


def weighted_sums(
    arrays: Sequence[Sequence[np.ndarray]], factors: Sequence[Sequence[float] | np.ndarray]
) -> list[np.ndarray]:
    """``sum_i factors[k][i] * arrays[k][i]`` for every output ``k``, as new arrays.

    This is the one fusion every operation uses: means, FedCross's blends,
    FedMe's eq. 8. Each output's factors are meant to be a convex combination
    (non-negative, summing to one), so its exact value lies between its
    inputs' extremes. The outputs are computed together in cache-sized blocks
    of elements, spans of blocks spread over threads (see
    :mod:`fedx.ops.parallel`): within a block, outputs that read the same
    input follow one another, so an input that several outputs share
    (FedCross's collaborators) is read from memory once.

    Floating-point outputs are summed in their own dtype (all terms of the
    first input's dtype). A block in which an operation overflows (or gives
    NaN from Inf - Inf) is computed again in float64 (or wider), every term
    scaled by its factor before it is added, and values that round beyond
    the dtype's range saturate at its largest finite value: finite inputs always give a finite result with
    the precision of the dtype, and inputs that hold NaN or Inf give NaN or
    Inf. Integer outputs are summed in float64 and rounded to the nearest
    integer of their dtype, within its range.

    Parameters
    ----------
    arrays : Sequence[Sequence[np.ndarray]]
        For every output, its terms: at least one array, all of one shape.
        Not modified.
    factors : Sequence[Sequence[float]]
        For every output, one factor per term.

    Returns
    -------
    list[np.ndarray]
        One new array per output, with its first term's dtype and shape.
    """
    if len(arrays) != len(factors):
        raise ValueError(f"{len(arrays)} outputs but {len(factors)} lists of factors")
    outputs: list[np.ndarray | None] = [None] * len(arrays)
    sums: list[_BlockedSum] = []
    for index, (terms, weights) in enumerate(zip(arrays, factors, strict=True)):
        weights = np.asarray(weights, dtype=np.float64)
        if not terms or len(terms) != weights.size:
            raise ValueError(
                f"output {index}: need one factor per term, got {len(terms)} terms "
                f"and {weights.size} factors"
            )
        if terms[0].dtype.kind == "f":
            blocked = _BlockedSum(terms, weights)
            sums.append(blocked)
            outputs[index] = blocked.total
        else:
            outputs[index] = _integer_weighted_sum(terms, weights)
    _fill(sums)
    return cast(list[np.ndarray], outputs)  # every index was set above


def _fill(sums: list["_BlockedSum"]) -> None:
    """Compute the floating-point outputs: element blocks outer, outputs inner.

    Spans of blocks go to threads. Each thread takes one block of elements
    of every output in turn, in an order where an output reads an input
    that the one before it read (:func:`_sharing_order`), so the shared
    input is still in cache. Blocks start at multiples of ``_BLOCK`` whatever
    the number of threads: a block that overflows is redone as a whole, so
    the blocks decide the results.
    """
    if not sums:
        return
    ordered = [sums[index] for index in _sharing_order([s.terms for s in sums])]
    size = max(blocked.size for blocked in sums)
    spans = [(start, min(start + _SPAN, size)) for start in range(0, size, _SPAN)]

    def run(span: tuple[int, int]) -> None:
        start, stop = span
        scratch: dict[np.dtype, np.ndarray] = {}  # one block of terms, per dtype
        # numpy checks the FPU's overflow flag after every ufunc call anyway:
        # raising on it costs nothing until a block overflows. (errstate is
        # per thread: set here, in the thread that does the work.)
        with np.errstate(over="raise", invalid="raise"):
            for begin in range(start, stop, _BLOCK):
                for blocked in ordered:
                    if begin < blocked.size:
                        blocked.add_block(slice(begin, min(begin + _BLOCK, stop)), scratch)

    work = sum(blocked.size * len(blocked.flats) for blocked in sums)
    run_tasks(run, spans, threads=None if work >= _PARALLEL_WORK else 1)


def _sharing_order(inputs: list[Sequence[np.ndarray]]) -> list[int]:
    """The outputs, each (where it can) right after one that reads one of its inputs.

    A depth-first walk over the outputs, linked by the input arrays they
    share (the same array objects): FedCross's in-order collaborators become
    one chain, each output reading as its own model the block that the
    output before it read as its collaborator.
    """
    readers: dict[int, list[int]] = {}
    for index, terms in enumerate(inputs):
        for term in terms:
            readers.setdefault(id(term), []).append(index)
    order: list[int] = []
    seen = bytearray(len(inputs))
    for root in range(len(inputs)):
        stack = [root]
        while stack:
            index = stack.pop()
            if not seen[index]:
                seen[index] = 1
                order.append(index)
                for term in inputs[index]:
                    stack.extend(readers[id(term)])
    return order


class _BlockedSum:
    """One floating-point output of :func:`weighted_sums`, filled block by block."""

    def __init__(self, terms: Sequence[np.ndarray], factors: np.ndarray) -> None:
        dtype = terms[0].dtype
        self.total = np.empty(terms[0].shape, dtype=dtype)
        self.size = self.total.size
        self._flat_total = self.total.reshape(-1)
        self.terms = terms
        self.flats = [term.reshape(-1) for term in terms]
        self._factors = factors
        values = factors.tolist()
        self._scalars = [dtype.type(factor) for factor in values]
        # Equal factors (a plain mean): add, then scale once, one multiply
        # per element instead of one per term.
        self._equal = values.count(values[0]) == len(values)

    def add_block(self, block: slice, scratch: dict[np.dtype, np.ndarray]) -> None:
        """Compute ``block`` of the output; ``scratch`` holds a block of terms per dtype."""
        out = self._flat_total[block]
        try:
            self._add_block_fast(block, out, scratch)
        except FloatingPointError:
            with np.errstate(over="ignore", invalid="ignore"):
                _wide_weighted_sum([flat[block] for flat in self.flats], self._factors, out)

    def _add_block_fast(
        self, block: slice, out: np.ndarray, scratch: dict[np.dtype, np.ndarray]
    ) -> None:
        flats, scalars = self.flats, self._scalars
        if self._equal:
            if len(flats) == 1:
                np.multiply(flats[0][block], scalars[0], out=out)
            else:
                np.add(flats[0][block], flats[1][block], out=out)
                for flat in flats[2:]:
                    out += flat[block]
                out *= scalars[0]
        else:
            np.multiply(flats[0][block], scalars[0], out=out)
            partial = scratch.get(out.dtype)
            if partial is None:
                partial = scratch[out.dtype] = np.empty(_BLOCK, out.dtype)
            partial = partial[: out.size]
            for scalar, flat in zip(scalars[1:], flats[1:], strict=True):
                np.multiply(flat[block], scalar, out=partial)
                out += partial


def _wide_weighted_sum(blocks: list[np.ndarray], factors: np.ndarray, out: np.ndarray) -> None:
    """The range-safe path of :func:`weighted_sums` for one block, into ``out``.

    Each term is widened, scaled by its factor, then added, so no partial sum
    exceeds the largest input by more than rounding; the result is clipped
    to ``out``'s finite range when the inputs are finite.
    """
    wide = np.promote_types(out.dtype, np.float64)
    total = np.zeros(out.size, dtype=wide)
    for block, factor in zip(blocks, factors, strict=True):
        total += block.astype(wide) * factor
    if all(np.isfinite(block).all() for block in blocks):
        largest = np.finfo(out.dtype).max
        np.clip(total, -largest, largest, out=total)
    out[...] = total


def _integer_weighted_sum(arrays: Sequence[np.ndarray], factors: np.ndarray) -> np.ndarray:
    dtype = arrays[0].dtype
    total = np.zeros(arrays[0].shape, dtype=np.float64)
    for factor, array in zip(factors, arrays, strict=True):
        total += factor * array.astype(np.float64)
    np.rint(total, out=total)
    if np.issubdtype(dtype, np.integer):
        # The float64 nearest to a large integer bound can lie beyond it
        # (2**63 for int64): step inside before casting.
        info = np.iinfo(dtype)
        low, high = float(info.min), float(info.max)
        if int(high) > info.max:
            high = float(np.nextafter(high, 0.0))
        np.clip(total, low, high, out=total)
    # 0-d arithmetic yields numpy scalars; the result must stay an array.
    return np.asarray(total).astype(dtype)
