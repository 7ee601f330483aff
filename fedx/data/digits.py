"""scikit-learn's bundled handwritten digits, read offline: the default data set.

The digits ship inside scikit-learn, so a run needs no download. They are
read without importing scikit-learn once their train/test split is in the
disk cache (:mod:`fedx.data.cache`).
"""

import functools
import gzip
import hashlib
import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from fedx.data.cache import array_digest, cached_indices, code_identity

# load_digits() stores pixel intensities as integers 0..16.
_DIGITS_MAX_INTENSITY = 16.0


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

    def gather(self, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples at ``positions`` as one batch: what ``default_collate`` makes of them."""
        return self.data[torch.from_numpy(positions)], torch.from_numpy(self.targets[positions])


@functools.lru_cache(maxsize=8)
def digits_splits(seed: int, test_fraction: float) -> tuple[DigitsDataset, DigitsDataset]:
    """The digits' train and test splits, stratified by label, scaled to [0, 1]."""
    pixels, target = read_digits()
    images = (pixels / _DIGITS_MAX_INTENSITY).astype(np.float32).reshape(-1, 1, 8, 8)
    key = {
        "seed": seed,
        "test_fraction": test_fraction,
        "labels": array_digest(target),
        "code": code_identity(__file__, "scikit-learn"),
    }
    train, test = cached_indices(
        "digits-split", key, lambda: _split_digits(target, seed, test_fraction)
    )
    return (
        DigitsDataset(images[train], target[train]),
        DigitsDataset(images[test], target[test]),
    )


def _split_digits(target: np.ndarray, seed: int, test_fraction: float) -> list[np.ndarray]:
    """Positions of the digits' train and test samples (scikit-learn's ``train_test_split``)."""
    # pylint: disable=import-outside-toplevel  (only where the split is not cached yet)
    from sklearn.model_selection import train_test_split

    train, test = train_test_split(
        np.arange(len(target)),
        test_size=test_fraction,
        random_state=seed,
        # Every class in both splits, in its overall proportion.
        stratify=target,
    )
    return [train, test]


@functools.cache
def read_digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits' pixels ``(1797, 64)`` and labels, as ``sklearn.datasets.load_digits`` gives them.

    The file ships inside scikit-learn; it is read as ``load_digits`` reads it,
    without importing scikit-learn (whose import costs seconds in every fresh
    ClientApp process). Where the file is not where it was, ``load_digits``
    itself reads it.

    Parsing its text costs time in every process that reads it: every
    message of a deployment (a warm executor forks a task for each). The
    parsed values (integers: intensities 0-16 and labels) are stored in the
    cache (:mod:`fedx.data.cache`) under a digest of the file's bytes, and
    reading them back is far cheaper than parsing the text again.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.origin is not None:
        path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            data = path.read_bytes()
            key = {"file": hashlib.sha256(data).hexdigest(), "code": code_identity(__file__)}
            pixels, labels = cached_indices("digits", key, lambda: _digits_table(data))
            return pixels.reshape(len(labels), -1).astype(np.float64), labels.copy()
    from sklearn.datasets import load_digits  # pylint: disable=import-outside-toplevel

    bunch = load_digits()
    return bunch.data, bunch.target


def _digits_table(data: bytes) -> list[np.ndarray]:
    """The pixels (flat) and labels of scikit-learn's ``digits.csv.gz``, as integers.

    Raises
    ------
    ValueError
        When the file holds anything but integers (it is not the digits).
    """
    table = np.loadtxt(gzip.decompress(data).decode("ascii").splitlines(), delimiter=",")
    values = table.astype(np.int64)
    if not np.array_equal(values, table):
        raise ValueError("scikit-learn's digits.csv.gz holds values that are not integers")
    return [values[:, :-1].reshape(-1), values[:, -1]]
