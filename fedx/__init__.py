"""fedx: multi-model federated learning strategies for Flower.

``fedx.ops`` and ``fedx.strategies`` need only numpy and Flower; the task layer
(``fedx.models``, ``fedx.data``, ``fedx.training``) and the apps need torch.
"""

__version__ = "0.1.0"
