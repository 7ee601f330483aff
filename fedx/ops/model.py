"""What a model is on the server, and the layout check every operation shares."""

from collections.abc import Sequence
from itertools import islice

import numpy as np

#: A model as the server sees it, state-dict names mapped to arrays in the
#: order of the model's state dict. Operations never modify these arrays.
Model = dict[str, np.ndarray]


def layout_problem(reference: Model, model: Model) -> str | None:
    """Say how ``model``'s names or shapes differ from ``reference``'s, or return None.

    Names are compared as sets (their order is the reference's business);
    the first tensor with another shape is named.
    """
    if model.keys() != reference.keys():
        # At most three names of each, each cut short: a reply's names can be anything.
        missing = islice((f"{name!r:.60}" for name in reference if name not in model), 3)
        extra = islice((f"{name!r:.60}" for name in model if name not in reference), 3)
        return f"names differ (missing [{', '.join(missing)}], unexpected [{', '.join(extra)}])"
    for name, array in reference.items():
        if model[name].shape != array.shape:
            return f"{name}: shape {model[name].shape}, expected {array.shape}"
    return None


def check_same_layout(models: Sequence[Model]) -> None:
    """Raise ValueError unless every model has the names and shapes of the first."""
    for index, model in enumerate(models[1:], start=1):
        problem = layout_problem(models[0], model)
        if problem is not None:
            raise ValueError(f"model {index} does not match model 0: {problem}")
