"""Dataset loaders: scikit-learn's bundled digits (offline), CIFAR-10/100 and LEAF from disk."""

import functools
import os
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset
from torchvision import datasets as tv_datasets
from torchvision import transforms

from fedx.data.leaf import (
    FEMNIST_CLASSES,
    FEMNIST_SIDE,
    LEAF_DATASETS,
    SHAKESPEARE_LETTERS,
    SHAKESPEARE_SEQUENCE_LENGTH,
    load_leaf,
)

DATASET_NAMES: tuple[str, ...] = ("digits", "cifar10", "cifar100", *LEAF_DATASETS)
SPLITS: tuple[str, ...] = ("train", "test")

# load_digits() stores pixel intensities as integers 0..16.
_DIGITS_MAX_INTENSITY = 16.0


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
class _CifarSpec:
    """How to load one CIFAR variant with torchvision."""

    title: str
    dataset_class: type[tv_datasets.CIFAR10]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


# Per-channel mean and standard deviation of the training images.
_CIFAR: dict[str, _CifarSpec] = {
    "cifar10": _CifarSpec(
        "CIFAR-10", tv_datasets.CIFAR10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    ),
    "cifar100": _CifarSpec(
        "CIFAR-100", tv_datasets.CIFAR100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
    ),
}


class DigitsDataset(Dataset):
    """In-memory images with integer labels, the shape of a torchvision dataset.

    Parameters
    ----------
    images : np.ndarray
        Float images of shape ``(N, C, H, W)``.
    targets : np.ndarray
        Integer labels of shape ``(N,)``.

    Attributes
    ----------
    data : torch.Tensor
        The images as a float32 tensor.
    targets : np.ndarray
        The labels as an int64 array (read by partitioning, like the
        ``targets`` of torchvision datasets).
    """

    def __init__(self, images: np.ndarray, targets: np.ndarray) -> None:
        if len(images) != len(targets):
            raise ValueError(f"{len(images)} images but {len(targets)} labels")
        self.data = torch.as_tensor(images, dtype=torch.float32)
        self.targets = np.asarray(targets, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.data[index], int(self.targets[index])


def dataset_info(name: str) -> DatasetInfo:
    """Return the input shape and class count of a dataset without loading it.

    Raises
    ------
    ValueError
        If ``name`` is not one of :data:`DATASET_NAMES`.
    """
    _check_choice("dataset", name, DATASET_NAMES)
    return _INFO[name]


def load_split(
    name: str,
    split: str,
    *,
    root: str = "data",
    download: bool = False,
    seed: int = 0,
    test_fraction: float = 0.2,
    augment: bool = True,
    leaf_users: int = 0,
    leaf_min_samples: int = 0,
) -> Dataset:
    """Load the training or the test split of a dataset.

    Loaded datasets are cached per process, so the many ClientApp calls that
    one simulation worker serves read the files once.

    Parameters
    ----------
    name : str
        One of :data:`DATASET_NAMES`.
    split : str
        ``"train"`` or ``"test"``.
    root : str, optional
        Folder holding the CIFAR files (``cifar-10-batches-py/`` or
        ``cifar-100-python/``) or LEAF's (``femnist/data/train/`` ...). A
        relative path is resolved against the current working directory.
        Unused for ``digits``.
    download : bool, optional
        Let torchvision download missing CIFAR files into ``root``. LEAF data
        is never downloaded.
    seed : int, optional
        Seed of the digits train/test split and of the choice of LEAF users.
        CIFAR has a fixed test set.
    test_fraction : float, optional
        Fraction of the digits held out as the test split, stratified by
        label, in ``(0, 1)``. Unused for CIFAR.
    augment : bool, optional
        Randomly crop and flip CIFAR training images (the default). False
        gives the training images as the test split sees its images, for
        evaluating or predicting on training samples. Unused for digits and
        LEAF.
    leaf_users, leaf_min_samples : int, optional
        LEAF only: how many users (writers, roles) to take, 0 for all, and
        the samples a user needs more than; see
        :func:`fedx.data.leaf.select_users`. Both splits hold the same users'
        samples: the test split is the union of their test samples.

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
        If ``name``, ``split`` or ``test_fraction`` is invalid.
    FileNotFoundError
        If CIFAR files are missing from ``root`` and ``download`` is false, or
        LEAF files are missing (the message gives LEAF's command).
    """
    _check_choice("dataset", name, DATASET_NAMES)
    _check_choice("split", split, SPLITS)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test-fraction={test_fraction!r} must be in (0, 1)")
    if name == "digits":
        train, test = _digits_splits(int(seed), float(test_fraction))
        return train if split == "train" else test
    if name in LEAF_DATASETS:
        return load_leaf(
            name, split, root=root, num_users=leaf_users, min_samples=leaf_min_samples, seed=seed
        )
    train = split == "train"
    return _load_cifar(name, train, _resolve_root(root), bool(download), train and augment)


@functools.lru_cache(maxsize=8)
def _digits_splits(seed: int, test_fraction: float) -> tuple[DigitsDataset, DigitsDataset]:
    bunch = load_digits()
    images = (bunch.images / _DIGITS_MAX_INTENSITY).astype(np.float32)[:, np.newaxis]
    train_images, test_images, train_labels, test_labels = train_test_split(
        images,
        bunch.target,
        test_size=test_fraction,
        random_state=seed,
        # Every class in both splits, in its overall proportion.
        stratify=bunch.target,
    )
    return DigitsDataset(train_images, train_labels), DigitsDataset(test_images, test_labels)


@functools.lru_cache(maxsize=4)
def _load_cifar(
    name: str, train: bool, root: str, download: bool, augment: bool
) -> tv_datasets.CIFAR10:
    spec = _CIFAR[name]
    folder = os.path.join(root, spec.dataset_class.base_folder)
    if not download:
        missing = _missing_cifar_files(spec.dataset_class, folder)
        if missing:
            raise FileNotFoundError(
                f"{spec.title} not found: {folder} lacks {', '.join(missing)}; "
                f"set download=true (run-config key) to fetch it into {root}"
            )
    normalize = transforms.Normalize(spec.mean, spec.std)
    if augment:
        transform = transforms.Compose(
            [
                transforms.RandomCrop(32, padding=4),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                normalize,
            ]
        )
    else:
        transform = transforms.Compose([transforms.ToTensor(), normalize])
    try:
        return spec.dataset_class(root, train=train, transform=transform, download=download)
    except RuntimeError as err:
        # torchvision reports missing and corrupted files alike; by now the
        # files exist, so their md5 sums did not match.
        raise RuntimeError(
            f"{spec.title} files in {folder} failed torchvision's md5 check; "
            f"delete the folder and set download=true to fetch them again"
        ) from err


def _missing_cifar_files(dataset_class: type[tv_datasets.CIFAR10], folder: str) -> list[str]:
    """Names of the files torchvision will read that are not in ``folder``."""
    names = [name for name, _md5 in dataset_class.train_list + dataset_class.test_list]
    names.append(dataset_class.meta["filename"])
    return [name for name in names if not os.path.isfile(os.path.join(folder, name))]


def _resolve_root(root: str) -> str:
    # One cache entry per folder, however the path was spelled.
    return os.path.abspath(os.path.expanduser(root))


def _check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not one of {allowed}")
