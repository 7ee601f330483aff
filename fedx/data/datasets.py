"""Dataset loaders: scikit-learn's bundled digits (offline), CIFAR-10/100 and LEAF from disk, and data sets of other packages.

Each of fedx's own has a module: :mod:`fedx.data.digits`,
:mod:`fedx.data.cifar`, :mod:`fedx.data.leaf`. A loader imports its library
when it is first used: a digits run never imports torchvision, and reads the
digits without importing scikit-learn once its train/test split is in the
disk cache (:mod:`fedx.data.cache`).

A data set of one's own is a :class:`DatasetSpec` (its input shape, its
number of classes, and a function that loads a split) in a package of its
own, named by the ``dataset`` key: ``package.module:NAME``, or the name of
an entry point in the group ``fedx.datasets`` (:func:`find_dataset`). fedx
partitions it, caches it and feeds it to the models like its own.
"""

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict, Unpack

import numpy as np
from torch.utils.data import Dataset

from fedx.data.cifar import load_cifar
from fedx.data.digits import digits_splits
from fedx.data.leaf import (
    FEMNIST_CLASSES,
    FEMNIST_SIDE,
    LEAF_DATASETS,
    SHAKESPEARE_LETTERS,
    SHAKESPEARE_SEQUENCE_LENGTH,
    load_leaf,
)
from fedx.registry import DATASET_GROUP, component_names, find_plugin

#: fedx's own data sets (others come from packages of their own: :func:`dataset_names`).
DATASET_NAMES: tuple[str, ...] = ("digits", "cifar10", "cifar100", *LEAF_DATASETS)
SPLITS: tuple[str, ...] = ("train", "test")


@dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a dataset, available without loading it.

    Attributes
    ----------
    input_shape : tuple[int, ...]
        Shape of one input: ``(channels, height, width)`` of an image, or
        ``(length,)`` of a token sequence (Shakespeare).
    num_classes : int
        Number of labels; labels are the integers ``0 .. num_classes - 1``.
        For Shakespeare this is also the vocabulary of the input tokens.
    """

    input_shape: tuple[int, ...]
    num_classes: int


_INFO: dict[str, DatasetInfo] = {
    "digits": DatasetInfo(input_shape=(1, 8, 8), num_classes=10),
    "cifar10": DatasetInfo(input_shape=(3, 32, 32), num_classes=10),
    "cifar100": DatasetInfo(input_shape=(3, 32, 32), num_classes=100),
    "femnist": DatasetInfo(
        input_shape=(1, FEMNIST_SIDE, FEMNIST_SIDE), num_classes=FEMNIST_CLASSES
    ),
    "shakespeare": DatasetInfo(
        input_shape=(SHAKESPEARE_SEQUENCE_LENGTH,), num_classes=len(SHAKESPEARE_LETTERS)
    ),
}


@dataclass(frozen=True)
class DatasetSpec:
    """A data set of one's own, for the fedx app: what it holds and how to load it.

    Name it with the ``dataset`` run-config key, as ``package.module:NAME``
    or as an entry point of the group ``fedx.datasets`` of an installed
    package (``[project.entry-points."fedx.datasets"] name =
    "package.module:NAME"``). fedx partitions its training split among the
    clients with the ``partitioning`` key, holds it out for evaluation, and
    caches what it loads per process.

    Attributes
    ----------
    input_shape : tuple[int, ...]
        Shape of one input as the model reads it: ``(channels, height,
        width)`` of an image, ``(features,)`` of a row of a table, ...
    num_classes : int
        Number of labels; labels are the integers ``0 .. num_classes - 1``.
    load : callable
        ``load(split, source) -> torch.utils.data.Dataset`` with ``split``
        ``"train"`` or ``"test"`` and ``source`` the run's
        :class:`SplitSource` (``source.root``: the ``data-root`` folder, an
        absolute path; ``source.seed``, ``source.test_fraction``). Its items
        are ``(input, label)`` with ``input`` a float tensor of
        ``input_shape``, and its ``targets`` attribute holds every label in
        order. A dataset with a ``gather(positions) -> (inputs, labels)``
        method gives fedx each batch in one call (:mod:`fedx.data.loaders`).
        Every process calls it once per split and run config.
    users : bool
        Whether both splits also have ``users`` (one id per user) and
        ``user_index`` (each sample's user, ``0 .. len(users) - 1``), like
        LEAF's: ``partitioning = "natural"`` then makes every user a client.
    """

    input_shape: tuple[int, ...]
    num_classes: int
    load: Callable[[str, "SplitSource"], Dataset]
    users: bool = False

    @property
    def info(self) -> DatasetInfo:
        """The input shape and class count."""
        return DatasetInfo(tuple(int(side) for side in self.input_shape), int(self.num_classes))


def dataset_names() -> tuple[str, ...]:
    """fedx's data sets, then those installed packages declare (entry points of ``fedx.datasets``)."""
    return DATASET_NAMES + tuple(
        n for n in component_names(DATASET_GROUP) if n not in DATASET_NAMES
    )


def find_dataset(name: str) -> DatasetSpec:
    """The :class:`DatasetSpec` of a data set that is not fedx's own.

    Parameters
    ----------
    name : str
        ``package.module:NAME`` (the module is imported now), or the name of
        an installed entry point of the group ``fedx.datasets``.

    Raises
    ------
    ValueError
        When ``name`` is one of fedx's own, names nothing, cannot be loaded,
        or is not a :class:`DatasetSpec`; the message says which.
    """
    spec: DatasetSpec = find_plugin(
        "dataset",
        DATASET_GROUP,
        name,
        own=DATASET_NAMES,
        fits=lambda found: isinstance(found, DatasetSpec),
        expected="a fedx.data.DatasetSpec",
    )
    return spec


def dataset_info(name: str) -> DatasetInfo:
    """Return the input shape and class count of a dataset without loading it.

    Raises
    ------
    ValueError
        If ``name`` is neither one of :data:`DATASET_NAMES` nor a data set
        of another package (:func:`find_dataset`).
    """
    if name in _INFO:
        return _INFO[name]
    return _own_spec(name).info


def _own_spec(name: str) -> DatasetSpec:
    """:func:`find_dataset`, saying first what the name is not (a plain name may be a typo)."""
    try:
        return find_dataset(name)
    except ValueError as err:
        if ":" in name:
            raise
        raise ValueError(
            f"dataset {name!r} is not one of {', '.join(DATASET_NAMES)}, nor a data set of "
            f"another package ({err})"
        ) from None


def dataset_has_users(name: str) -> bool:
    """Whether the data set's samples belong to users (LEAF's, or a :class:`DatasetSpec` that says so)."""
    return name in LEAF_DATASETS or (name not in DATASET_NAMES and _own_spec(name).users)


class SplitSettings(TypedDict, total=False):
    """The keyword arguments of :class:`SplitSource` after ``name``, for the loaders' ``**settings``."""

    root: str
    download: bool
    seed: int
    test_fraction: float
    leaf_users: int
    leaf_min_samples: int


@dataclass(frozen=True)
class SplitSource:
    """Where a dataset's splits come from, and what decides which samples each holds.

    Every loader (:func:`load_split`, :func:`fedx.data.load_partition`,
    :func:`fedx.data.load_local_splits` ...) takes these settings as keyword
    arguments after the dataset's name; its per-process caches key on
    :meth:`canonical`.

    Attributes
    ----------
    name : str
        One of :data:`DATASET_NAMES`, or a data set of another package
        (:func:`find_dataset`).
    root : str
        Folder holding the CIFAR files (``cifar-10-batches-py/`` or
        ``cifar-100-python/``), LEAF's (``femnist/data/train/`` ...) or those
        of a data set of one's own. A relative path is resolved against the
        current working directory. Unused for ``digits``.
    download : bool
        Let torchvision download missing CIFAR files into ``root``. LEAF data
        is never downloaded.
    seed : int
        Seed of the digits train/test split and of the choice of LEAF users.
        CIFAR has a fixed test set.
    test_fraction : float
        Fraction of the digits held out as the test split, stratified by
        label, in ``(0, 1)``. Unused for CIFAR.
    leaf_users, leaf_min_samples : int
        LEAF only: how many users (writers, roles) to take, 0 for all, and
        the samples a user needs more than; see
        :func:`fedx.data.leaf.select_users`. Both splits hold the same users'
        samples: the test split is the union of their test samples.
    """

    name: str
    root: str = "data"
    download: bool = False
    seed: int = 0
    test_fraction: float = 0.2
    leaf_users: int = 0
    leaf_min_samples: int = 0

    def canonical(self) -> "SplitSource":
        """The same source with the folder resolved and every value of its type: one cache key per source."""
        return SplitSource(
            self.name,
            root=_resolve_root(self.root),
            download=bool(self.download),
            seed=int(self.seed),
            test_fraction=float(self.test_fraction),
            leaf_users=int(self.leaf_users),
            leaf_min_samples=int(self.leaf_min_samples),
        )

    def load(self, split: str, *, augment: bool = True) -> Dataset:
        """The training or the test split: :func:`load_split` with these settings."""
        _check_choice("split", split, SPLITS)
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test-fraction={self.test_fraction!r} must be in (0, 1)")
        if self.name not in DATASET_NAMES:
            return _load_own(self.canonical(), split)
        if self.name == "digits":
            train, test = digits_splits(int(self.seed), float(self.test_fraction))
            return train if split == "train" else test
        if self.name in LEAF_DATASETS:
            return load_leaf(
                self.name,
                split,
                root=self.root,
                num_users=self.leaf_users,
                min_samples=self.leaf_min_samples,
                seed=self.seed,
            )
        training = split == "train"
        return load_cifar(
            self.name, training, _resolve_root(self.root), bool(self.download), training and augment
        )


def load_split(
    name: str, split: str, *, augment: bool = True, **settings: Unpack[SplitSettings]
) -> Dataset:
    """Load the training or the test split of a dataset.

    Loaded datasets are cached per process, so the many ClientApp calls that
    one simulation worker serves read the files once.

    Parameters
    ----------
    name : str
        One of :data:`DATASET_NAMES`, or a data set of another package
        (:func:`find_dataset`).
    split : str
        ``"train"`` or ``"test"``.
    augment : bool, optional
        Randomly crop and flip CIFAR training images (the default). False
        gives the training images as the test split sees its images, for
        evaluating or predicting on training samples. Unused for digits and
        LEAF.
    **settings
        ``root``, ``download``, ``seed``, ``test_fraction``, ``leaf_users``
        and ``leaf_min_samples``, as :class:`SplitSource` describes them.

    Returns
    -------
    torch.utils.data.Dataset
        Items are ``(image, label)`` with ``image`` a float tensor of shape
        ``dataset_info(name).input_shape``; the dataset's ``targets``
        attribute holds all labels. CIFAR training images are randomly
        cropped (padding 4) and flipped unless ``augment`` is false; all CIFAR
        images are normalised per channel. Digits are scaled to ``[0, 1]``,
        FEMNIST pixels are as LEAF stores them (``[0, 1]``), Shakespeare
        inputs are int64 token sequences. LEAF datasets also have ``users``
        and ``user_index`` (:class:`fedx.data.leaf.LeafDataset`).

    Raises
    ------
    ValueError
        If ``name``, ``split`` or ``test_fraction`` is invalid, or the
        loader of a data set of another package fails or gives a dataset
        that does not fit its :class:`DatasetSpec`.
    FileNotFoundError
        If CIFAR files are missing from ``root`` and ``download`` is false, or
        LEAF files are missing (the message gives LEAF's command).
    """
    return SplitSource(name, **settings).load(split, augment=augment)


@functools.lru_cache(maxsize=8)
def _load_own(source: SplitSource, split: str) -> Dataset:
    """A split of a data set of another package (:class:`DatasetSpec`), checked against its spec.

    Raises
    ------
    ValueError
        When the loader fails (other than with a missing file) or gives a
        dataset that does not fit its spec.
    """
    spec = _own_spec(source.name)
    try:
        dataset = spec.load(split, source)
    except FileNotFoundError:
        raise
    except Exception as err:
        raise ValueError(
            f"dataset {source.name!r}: loading its {split} split failed: {type(err).__name__}: {err}"
        ) from err
    _check_own(source.name, spec, split, dataset)
    return dataset


def _check_own(name: str, spec: DatasetSpec, split: str, dataset: Dataset) -> None:
    """Raise ValueError when a split does not fit what its spec declares."""
    where = f"dataset {name!r}, {split} split"
    targets = getattr(dataset, "targets", None)
    if targets is None:
        raise ValueError(f"{where}: it has no 'targets' attribute with its labels")
    labels = np.asarray(targets)
    size = len(dataset)  # type: ignore[arg-type]
    if labels.shape != (size,) or size == 0:
        raise ValueError(f"{where}: {size} samples but targets of shape {labels.shape}")
    if (
        not np.issubdtype(labels.dtype, np.integer)
        or labels.min() < 0
        or labels.max() >= spec.num_classes
    ):
        raise ValueError(
            f"{where}: labels must be integers in [0, {spec.num_classes}), got {labels.dtype} from {labels.min()} to {labels.max()}"
        )
    first, _ = dataset[0]
    if tuple(first.shape) != spec.info.input_shape:
        raise ValueError(
            f"{where}: an input has shape {tuple(first.shape)}, its spec says {spec.info.input_shape}"
        )
    if spec.users and (
        getattr(dataset, "users", None) is None or getattr(dataset, "user_index", None) is None
    ):
        raise ValueError(
            f"{where}: its spec says users=True but it has no 'users' and 'user_index'"
        )


def _resolve_root(root: str) -> str:
    # One cache entry per folder, however the path was spelled.
    return os.path.abspath(os.path.expanduser(root))


def _check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not one of {allowed}")
