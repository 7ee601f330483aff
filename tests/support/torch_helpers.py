"""What the test modules that run torch share.

Kept apart from tests/support/helpers.py, which conftest.py imports in every run:
importing torch there would load it for the tests that need none.
"""

import torch

#: Where the tests train and evaluate: CI has no GPU, and a GPU would change the figures.
CPU = torch.device("cpu")
