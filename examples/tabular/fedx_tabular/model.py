"""A model of one's own for the fedx app: a small multi-layer perceptron."""

import math

from torch import nn


def build_mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """fedx's model builder: one hidden layer of 32 units for inputs of ``input_shape``.

    fedx calls it with the data set's input shape and number of classes, after
    seeding torch, so every process builds the same initial model.
    """
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), 32),
        nn.ReLU(),
        nn.Linear(32, num_classes),
    )
