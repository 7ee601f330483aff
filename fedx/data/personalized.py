"""The data layout of personalized federated learning (methods evaluated per client).

Matsuda et al. (SDM 2022, Sec. 5.1.2) take a small unlabeled set out of the
training data for the server, share the rest among the clients, and split every
client's share into its own train, validation and test data. Quality is then
measured per client, on its own test split. Everything here is a seeded
function of the arguments, so the server and every client compute the same
layout independently.
"""

import functools
from dataclasses import dataclass
from typing import Unpack

import numpy as np

from fedx.data.datasets import SplitSettings, SplitSource
from fedx.data.partitioning import (
    Partition,
    check_partition_id,
    dataset_groups,
    dataset_labels,
    partition_indices,
)

#: Unlabeled samples the server holds when ``unlabeled-size`` is 0: the
#: paper's 1000, fewer for the 1797 digits.
DEFAULT_UNLABELED_SIZE = 1000
_DATASET_UNLABELED_SIZE: dict[str, int] = {"digits": 200}
#: A client needs one sample in each of its train, validation and test splits.
MIN_LOCAL_SAMPLES = 3


@dataclass(frozen=True)
class LocalSplits:
    """One client's data: train, validation and test splits of its share.

    ``train`` draws from the training images with augmentation (CIFAR);
    ``validation`` and ``test`` see the same images without it.
    """

    train: Partition
    validation: Partition
    test: Partition


def unlabeled_size(name: str, size: int) -> int:
    """The size of the server's unlabeled set: ``size``, or the dataset's default when 0."""
    if size < 0:
        raise ValueError(f"unlabeled-size={size!r} must be >= 0")
    return size or _DATASET_UNLABELED_SIZE.get(name, DEFAULT_UNLABELED_SIZE)


def split_local(
    num_samples: int,
    test_fraction: float,
    validation_fraction: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split positions ``0 .. num_samples-1`` into train, validation and test.

    The test split takes ``test_fraction`` of the samples, the validation
    split ``validation_fraction`` of the rest (the paper's 8:2 then 8:2 for
    CIFAR-10), each rounded and at least one sample.

    Returns
    -------
    tuple[np.ndarray, np.ndarray, np.ndarray]
        Disjoint int64 position arrays (train, validation, test) covering all
        samples, each non-empty.

    Raises
    ------
    ValueError
        If ``num_samples < 3`` or a fraction is outside ``(0, 1)``.
    """
    if num_samples < MIN_LOCAL_SAMPLES:
        raise ValueError(
            f"a client needs at least {MIN_LOCAL_SAMPLES} samples for train, validation "
            f"and test splits, got {num_samples}"
        )
    for key, fraction in (
        ("local-test-fraction", test_fraction),
        ("local-validation-fraction", validation_fraction),
    ):
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"{key}={fraction!r} must be in (0, 1)")
    num_test = min(max(round(num_samples * test_fraction), 1), num_samples - 2)
    num_validation = min(
        max(round((num_samples - num_test) * validation_fraction), 1), num_samples - num_test - 1
    )
    order = rng.permutation(num_samples).astype(np.int64)
    test = order[:num_test]
    validation = order[num_test : num_test + num_validation]
    return order[num_test + num_validation :], validation, test


def load_unlabeled(name: str, *, size: int = 0, **settings: Unpack[SplitSettings]) -> Partition:
    """Return the server's unlabeled set: training samples no client ever gets.

    Parameters
    ----------
    name : str
        One of :data:`fedx.data.DATASET_NAMES`.
    size : int, optional
        Number of samples; 0 takes the dataset's default (1000, digits 200).
    **settings
        As for :func:`fedx.data.load_split`. The set depends on these and
        ``size`` only, not on the number of clients, so the server can load it
        without knowing how many clients there are.

    Returns
    -------
    Partition
        Training images without augmentation. The labels are there (the
        ``targets`` attribute) but no method reads them.
    """
    source = SplitSource(name, **settings)
    unlabeled, _ = _unlabeled_and_pool(source.canonical(), unlabeled_size(name, size))
    return Partition(source.load("train", augment=False), unlabeled)


# pylint: disable=too-many-arguments
def load_local_splits(
    name: str,
    partition_id: int,
    num_partitions: int,
    *,
    partitioning: str = "dirichlet-size-label",
    alpha: float = 0.5,
    size_alpha: float = 10.0,
    min_partition_size: int = 10,
    unlabeled: int = 0,
    local_test_fraction: float = 0.2,
    local_validation_fraction: float = 0.2,
    **settings: Unpack[SplitSettings],
) -> LocalSplits:
    """Return one client's train, validation and test splits.

    The training split of the dataset minus the server's unlabeled set
    (:func:`load_unlabeled`) is partitioned with
    :func:`fedx.data.partition_indices`, and partition ``partition_id`` is
    split with :func:`split_local`. Cached per process.

    Parameters
    ----------
    name : str
        One of :data:`fedx.data.DATASET_NAMES`.
    partition_id, num_partitions : int
        The client's ``partition-id`` and ``num-partitions``.
    partitioning, alpha, size_alpha, min_partition_size
        As for :func:`fedx.data.partition_indices`. ``"natural"`` (LEAF)
        gives client ``i`` the ``i``-th selected user's training samples that
        are not in the server's unlabeled set.
    unlabeled : int
        Size of the server's unlabeled set, 0 for the dataset's default.
    local_test_fraction, local_validation_fraction : float
        As for :func:`split_local`.
    **settings
        As for :func:`fedx.data.load_split` (``test_fraction`` is the digits'
        global test split, which personalized evaluation does not use).

    Returns
    -------
    LocalSplits
        Three ``Partition`` s of the training split.
    """
    check_partition_id(partition_id, num_partitions)
    source = SplitSource(name, **settings)
    splits = _local_split_indices(
        source.canonical(),
        unlabeled_size(name, unlabeled),
        _LocalLayout(
            int(num_partitions),
            partitioning,
            float(alpha),
            float(size_alpha),
            int(min_partition_size),
            float(local_test_fraction),
            float(local_validation_fraction),
        ),
    )[partition_id]
    augmented = source.load("train")
    plain = source.load("train", augment=False)
    return LocalSplits(
        train=Partition(augmented, splits[0]),
        validation=Partition(plain, splits[1]),
        test=Partition(plain, splits[2]),
    )


@dataclass(frozen=True)
class _LocalLayout:
    """How the clients' pool is shared out and split (a cache key of :func:`_local_split_indices`)."""

    num_partitions: int
    partitioning: str
    alpha: float
    size_alpha: float
    min_partition_size: int
    local_test_fraction: float
    local_validation_fraction: float


@functools.lru_cache(maxsize=8)
def _unlabeled_and_pool(source: SplitSource, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions in the training split of the unlabeled set and of the clients' pool."""
    num_samples = len(dataset_labels(source.load("train")))
    if not 0 < size < num_samples:
        raise ValueError(
            f"unlabeled-size={size} must be below the {num_samples} training samples of "
            f"{source.name}"
        )
    # Its own stream: the partitioning draws from `seed` as well.
    order = np.random.default_rng([source.seed, 0x5E7]).permutation(num_samples)
    unlabeled, pool = np.sort(order[:size]), np.sort(order[size:])
    for positions in (unlabeled, pool):
        positions.setflags(write=False)
    return unlabeled, pool


@functools.lru_cache(maxsize=8)
def _local_split_indices(
    source: SplitSource, size: int, layout: _LocalLayout
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """Every client's (train, validation, test) positions in the training split."""
    _, pool = _unlabeled_and_pool(source, size)
    train = source.load("train")
    groups = dataset_groups(train)
    shares = partition_indices(
        dataset_labels(train)[pool],
        layout.num_partitions,
        partitioning=layout.partitioning,
        alpha=layout.alpha,
        size_alpha=layout.size_alpha,
        min_partition_size=layout.min_partition_size,
        seed=source.seed,
        groups=None if groups is None else groups[pool],
    )
    rng = np.random.default_rng([source.seed, 0x10CA1])
    splits = []
    for share in shares:
        positions = pool[share]
        parts = split_local(
            len(positions), layout.local_test_fraction, layout.local_validation_fraction, rng
        )
        split = tuple(positions[part] for part in parts)
        for indices in split:
            indices.setflags(write=False)
        splits.append(split)
    return tuple(splits)


__all__ = [
    "DEFAULT_UNLABELED_SIZE",
    "LocalSplits",
    "load_local_splits",
    "load_unlabeled",
    "split_local",
    "unlabeled_size",
]
