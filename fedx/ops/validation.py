"""Checks on models that come back from clients."""

import numpy as np

from fedx.ops.typing import Model


def find_problem(expected: Model, received: Model) -> str | None:
    """Say why ``received`` cannot stand in for ``expected``, or return None.

    A reply is usable when it has exactly the names of the model that was
    sent, each with the same shape and dtype, and no NaN or infinity.

    Returns
    -------
    str or None
        A one-line reason naming the first offending tensor, or ``None``.
    """
    missing = [name for name in expected if name not in received]
    extra = [name for name in received if name not in expected]
    if missing or extra:
        return f"names differ (missing {missing[:3]}, unexpected {extra[:3]})"
    for name, reference in expected.items():
        array = received[name]
        if array.shape != reference.shape:
            return f"{name}: shape {array.shape}, expected {reference.shape}"
        if array.dtype != reference.dtype:
            return f"{name}: dtype {array.dtype}, expected {reference.dtype}"
        if np.issubdtype(array.dtype, np.inexact) and not np.isfinite(array).all():
            return f"{name}: contains NaN or Inf"
    return None
