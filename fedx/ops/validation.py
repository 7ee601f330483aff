"""Checks on models that come back from clients."""

import numpy as np

from fedx.ops.model import Model, layout_problem


def find_problem(expected: Model, received: Model) -> str | None:
    """Say why ``received`` cannot stand in for ``expected``, or return None.

    A reply is usable when it has exactly the names of the model that was
    sent, each with the same shape and dtype, and no NaN or infinity.

    Returns
    -------
    str or None
        A one-line reason naming the first offending tensor, or ``None``.
    """
    problem = layout_problem(expected, received)
    if problem is not None:
        return problem
    for name, reference in expected.items():
        array = received[name]
        if array.dtype != reference.dtype:
            return f"{name}: dtype {array.dtype}, expected {reference.dtype}"
        if np.issubdtype(array.dtype, np.inexact) and not np.isfinite(array).all():
            return f"{name}: contains NaN or Inf"
    return None
