"""Types shared by the server-side model operations."""

import numpy as np

#: A model as the server sees it: state-dict names mapped to arrays, in the
#: order of the model's state dict. Operations never modify these arrays.
Model = dict[str, np.ndarray]
