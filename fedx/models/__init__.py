"""Torch models for fedx experiments, built by name from the run config.

No pretrained weights are ever downloaded: every model starts from the
framework's random initialisation, so call ``torch.manual_seed(seed)`` before
:func:`build_model` to get the same initial model in every process.
"""

from collections.abc import Callable

from torch import nn

from fedx.models.cnn import CNN
from fedx.models.resnet import ResNet20
from fedx.models.vgg import VGG16

MODEL_NAMES: tuple[str, ...] = ("cnn", "resnet20", "vgg16")

_BUILDERS: dict[str, Callable[[tuple[int, int, int], int], nn.Module]] = {
    "cnn": CNN,
    "resnet20": ResNet20,
    "vgg16": VGG16,
}


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Build a freshly initialised model.

    Parameters
    ----------
    name : str
        One of :data:`MODEL_NAMES` (the ``model`` run-config key).
    input_shape : tuple[int, int, int]
        ``(channels, height, width)`` of one input image, for example
        ``fedx.data.dataset_info(dataset).input_shape``.
    num_classes : int
        Number of output logits.

    Returns
    -------
    torch.nn.Module
        The model, on the CPU, in training mode.

    Raises
    ------
    ValueError
        If ``name`` is unknown, or the input is too small for the model
        (``vgg16`` needs at least 32x32).
    """
    if name not in _BUILDERS:
        raise ValueError(f"model={name!r} is not one of {MODEL_NAMES}")
    if len(input_shape) != 3 or min(input_shape) < 1:
        raise ValueError(f"input_shape must be (channels, height, width), got {input_shape}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be at least 1, got {num_classes}")
    channels, height, width = (int(side) for side in input_shape)
    return _BUILDERS[name]((channels, height, width), int(num_classes))


__all__ = ["CNN", "MODEL_NAMES", "ResNet20", "VGG16", "build_model"]
