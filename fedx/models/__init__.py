"""Torch models for fedx experiments, built by name from the run config.

No pretrained weights are ever downloaded: every model starts from the
framework's random initialisation, so call ``torch.manual_seed(seed)`` before
:func:`build_model` to get the same initial model in every process.

Besides the single-architecture models (``cnn``, ``resnet20``, ``vgg16`` for
images, ``lstm`` for LEAF's Shakespeare token sequences) the registry names two families of variable depth for heterogeneous-architecture
methods (model exchange): ``cnn-1`` ... ``cnn-4`` (the CNN with 1-4 conv
blocks; ``cnn-2`` has the structure of ``cnn``) and ``vgg11``, ``vgg13``,
``vgg16``, ``vgg19``. ResNet-20 and the VGGs are built from torchvision's
blocks: their modules, and torchvision, are imported when one is first built.

A model of one's own is a function ``(input_shape, num_classes) ->
torch.nn.Module`` in a package of its own, named by the ``model`` key (or in
a method's list of architectures) as ``package.module:function``, or as an
entry point of the group ``fedx.models`` (:func:`find_model`).
"""

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fedx.models.cnn import CNN
from fedx.models.lstm import CharLSTM
from fedx.registry import MODEL_GROUP, component_names, find_plugin

# Output channels of the conv blocks of cnn-<d>: the first d of these. The
# first two are the FedAvg CNN's; deeper blocks double the width.
CNN_FAMILY_CHANNELS: tuple[int, ...] = (32, 64, 128, 256)

_Builder = Callable[[tuple[int, ...], int], nn.Module]

# The models built on torchvision's blocks, by the module that defines them:
# it is imported (and torchvision with it) when one of them is first built.
_LAZY: dict[str, str] = {"ResNet20": "resnet", "VGG": "vgg", "VGG16": "vgg"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"fedx.models.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _lazy(class_name: str, **arguments: Any) -> _Builder:
    """A builder that imports the model's module when it is called."""

    def build(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        return __getattr__(class_name)(input_shape, num_classes, **arguments)

    return build


_BUILDERS: dict[str, _Builder] = {
    "cnn": CNN,
    "resnet20": _lazy("ResNet20"),
    "vgg16": _lazy("VGG16"),
    "lstm": CharLSTM,
}
for _depth in range(1, len(CNN_FAMILY_CHANNELS) + 1):
    # Deep variants stop pooling at 1x1, so all four run on 8x8 digits.
    _BUILDERS[f"cnn-{_depth}"] = functools.partial(
        CNN, conv_channels=CNN_FAMILY_CHANNELS[:_depth], pool_to_fit=True
    )
for _depth in (11, 13, 19):
    _BUILDERS[f"vgg{_depth}"] = _lazy("VGG", depth=_depth)

#: fedx's own models (others come from packages of their own: :func:`model_names`).
MODEL_NAMES: tuple[str, ...] = tuple(_BUILDERS)
#: Models that read token sequences, input shape ``(length,)``; all others
#: read images, ``(channels, height, width)``.
SEQUENCE_MODELS: tuple[str, ...] = ("lstm",)


def model_names() -> tuple[str, ...]:
    """fedx's models, then those installed packages declare (entry points of ``fedx.models``)."""
    return MODEL_NAMES + tuple(n for n in component_names(MODEL_GROUP) if n not in MODEL_NAMES)


def find_model(name: str) -> Callable[[tuple[int, ...], int], nn.Module]:
    """The builder of a model that is not fedx's own: ``builder(input_shape, num_classes)``.

    Parameters
    ----------
    name : str
        ``package.module:function`` (the module is imported now), or the
        name of an installed entry point of the group ``fedx.models``.

    Raises
    ------
    ValueError
        When ``name`` is one of fedx's own, names nothing, cannot be loaded
        or is not callable; the message says which.
    """
    builder: Callable[[tuple[int, ...], int], nn.Module] = find_plugin(
        "model", MODEL_GROUP, name, own=_BUILDERS, fits=callable, expected="a function"
    )
    return builder


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Build a freshly initialised model.

    Parameters
    ----------
    name : str
        One of :data:`MODEL_NAMES` (the ``model`` run-config key, or an entry
        of a method's list of architectures), or a model of another package
        (:func:`find_model`), which is called with the two other arguments.
    input_shape : tuple[int, ...]
        ``(channels, height, width)`` of one input image, or ``(length,)`` of
        one token sequence for :data:`SEQUENCE_MODELS`; for example
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
        If ``name`` is unknown, the input is of the other kind (an image for
        ``lstm``, a sequence for an image model), or too small for the model
        (the VGGs need at least 32x32); if the builder of a model of another
        package fails or returns something else than a ``torch.nn.Module``.
    """
    shape = tuple(int(side) for side in input_shape)
    if name not in _BUILDERS:
        return _build_own(name, shape, int(num_classes))
    if name in SEQUENCE_MODELS and (len(shape) != 1 or shape[0] < 1):
        raise ValueError(
            f"model {name} reads token sequences (such as shakespeare's): input_shape must be "
            f"(length,), got {tuple(input_shape)}"
        )
    if name not in SEQUENCE_MODELS and (len(shape) != 3 or min(shape) < 1):
        raise ValueError(
            f"model {name} reads images: input_shape must be (channels, height, width), "
            f"got {tuple(input_shape)}"
        )
    if num_classes < 1:
        raise ValueError(f"num_classes must be at least 1, got {num_classes}")
    return _BUILDERS[name](shape, int(num_classes))


def _build_own(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    try:
        builder = find_model(name)
    except ValueError as err:
        if ":" in name:
            raise
        raise ValueError(
            f"model {name!r} is not one of {', '.join(MODEL_NAMES)}, nor a model of another "
            f"package ({err})"
        ) from None
    try:
        model = builder(input_shape, num_classes)
    except Exception as err:
        raise ValueError(
            f"model {name!r} for inputs {input_shape} and {num_classes} classes: "
            f"{type(err).__name__}: {err}"
        ) from err
    if not isinstance(model, nn.Module):
        raise ValueError(f"model {name!r} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def client_model_seed(seed: int, client_id: int) -> int:
    """The torch seed of client ``client_id``'s first model in a run seeded ``seed``.

    One formula for every process that builds it: the server (a client's
    first personalized model) and the client (the same model, trained while
    it chooses its architecture).
    """
    return seed * 1_000_003 + client_id


def build_seeded_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, seed: int
) -> nn.Module:
    """:func:`build_model` initialised from ``torch.manual_seed(seed)``.

    The process's global torch RNG is left as it was, so the model depends
    on ``seed`` alone.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model(name, input_shape, num_classes)


__all__ = [
    "CNN",
    "CNN_FAMILY_CHANNELS",
    "MODEL_NAMES",
    "SEQUENCE_MODELS",
    "VGG",
    "VGG16",
    "CharLSTM",
    "ResNet20",
    "build_model",
    "build_seeded_model",
    "client_model_seed",
    "find_model",
    "model_names",
]
