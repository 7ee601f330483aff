"""Weighted averaging of models."""

from collections.abc import Sequence

import numpy as np

from fedx.ops.typing import Model

# Elements per block in the weighted sum: small enough that the scaled block
# stays in cache, large enough that the Python loop overhead is negligible.
_BLOCK = 1 << 16


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
        New arrays with the dtypes of the inputs. Integer tensors (such as
        BatchNorm's ``num_batches_tracked``) are averaged in float64 and
        rounded back to their integer dtype.
    """
    if not models:
        raise ValueError("average() needs at least one model")
    factors = _normalised_weights(len(models), weights)
    return {
        name: _weighted_sum([model[name] for model in models], factors)
        for name in models[0]
    }


def _normalised_weights(count: int, weights: Sequence[float] | None) -> np.ndarray:
    if weights is None:
        return np.full(count, 1.0 / count)
    factors = np.asarray(weights, dtype=np.float64)
    if factors.shape != (count,):
        raise ValueError(f"expected {count} weights, got {factors.shape[0]}")
    if np.any(factors < 0) or not np.isfinite(factors).all() or factors.sum() <= 0:
        raise ValueError(f"weights must be finite, non-negative, not all zero: {weights}")
    return factors / factors.sum()


def _weighted_sum(arrays: list[np.ndarray], factors: np.ndarray) -> np.ndarray:
    dtype = arrays[0].dtype
    if not np.issubdtype(dtype, np.floating):
        total = sum(f * a.astype(np.float64) for f, a in zip(factors, arrays, strict=True))
        # 0-d arithmetic yields numpy scalars; the result must stay an array.
        return np.asarray(np.rint(total)).astype(dtype)
    if np.all(factors == factors[0]):
        # Equal weights: add in place, scale once. One pass over each input.
        total = np.array(arrays[0], dtype=dtype, copy=True)
        for array in arrays[1:]:
            total += array
        total *= dtype.type(factors[0])
        return total
    total = np.empty_like(arrays[0])
    flat_total = total.reshape(-1)
    flat_arrays = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    scratch = np.empty(min(_BLOCK, flat_total.size), dtype=dtype)
    for start in range(0, flat_total.size, _BLOCK):
        block = slice(start, start + _BLOCK)
        out = flat_total[block]
        np.multiply(flat_arrays[0][block], dtype.type(factors[0]), out=out)
        for factor, flat in zip(factors[1:], flat_arrays[1:], strict=True):
            tmp = scratch[: out.size]
            np.multiply(flat[block], dtype.type(factor), out=tmp)
            out += tmp
    return total
