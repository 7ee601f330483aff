"""Splitting a training set among clients with flwr-datasets' partitioners.

Partitions are cached on disk (:mod:`fedx.data.cache`): flwr-datasets and the
Hugging Face ``datasets`` stack it builds on are imported only by the process
that computes a partitioning first.
"""

import functools
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Unpack

import numpy as np
from torch.utils.data import Dataset, Subset

from fedx.data.cache import array_digest, cached_indices, code_identity
from fedx.data.datasets import SplitSettings, SplitSource, _check_choice
from fedx.data.leaf import LEAF_DATASETS

if TYPE_CHECKING:
    from flwr_datasets.partitioner import Partitioner

PARTITIONINGS: tuple[str, ...] = ("iid", "dirichlet", "dirichlet-size-label", "natural")


class Partition(Subset):
    """One client's share of a dataset: a ``Subset`` that keeps the labels.

    Attributes
    ----------
    dataset : torch.utils.data.Dataset
        The whole split.
    indices : np.ndarray
        Positions of this partition's samples in ``dataset``.
    targets : np.ndarray
        The labels of this partition's samples, in order (int64).
    """

    def __init__(self, dataset: Dataset, indices: np.ndarray) -> None:
        super().__init__(dataset, indices)
        self.targets = dataset_labels(dataset)[indices]


def dataset_labels(dataset: Dataset) -> np.ndarray:
    """Return the labels of a dataset that has a ``targets`` attribute, as int64."""
    targets = getattr(dataset, "targets", None)
    if targets is None:
        raise TypeError(f"{type(dataset).__name__} has no 'targets' attribute with its labels")
    return np.asarray(targets, dtype=np.int64)


def dataset_groups(dataset: Dataset) -> np.ndarray | None:
    """Return each sample's user (``user_index``) of a LEAF dataset, ``None`` for others."""
    groups = getattr(dataset, "user_index", None)
    return None if groups is None else np.asarray(groups, dtype=np.int64)


def partition_indices(
    labels: np.ndarray | Sequence[int],
    num_partitions: int,
    *,
    partitioning: str = "iid",
    alpha: float = 1.0,
    min_partition_size: int = 0,
    seed: int = 0,
    size_alpha: float = 10.0,
    groups: np.ndarray | Sequence[int] | None = None,
) -> list[np.ndarray]:
    """Split sample positions into disjoint partitions that together cover all samples.

    Parameters
    ----------
    labels : array-like
        One label per sample, 1-D.
    num_partitions : int
        Number of partitions (clients), between 1 and the number of samples.
    partitioning : {"iid", "dirichlet", "dirichlet-size-label", "natural"}
        ``"iid"``: a seeded shuffle cut into equal shares (sizes differ by at
        most one) with ``IidPartitioner``. ``"dirichlet"``: label skew with
        ``DirichletPartitioner``: for every class, proportions drawn from
        ``Dir(alpha)`` decide how its samples spread over the partitions
        (no self-balancing), so partition sizes vary too.
        ``"dirichlet-size-label"``: Matsuda et al.'s CIFAR-10 scheme (after FedMA,
        Wang et al., ICLR 2020): partition sizes from ``Dir(size_alpha)``
        (:func:`dirichlet_sizes`), then every partition's label mix from
        ``Dir(alpha)`` with ``InnerDirichletPartitioner``. ``"natural"``: the
        samples of group ``g`` (a LEAF user) form partition ``g``; needs
        ``groups``, and exactly ``num_partitions`` groups.
    alpha : float
        Label Dirichlet concentration, > 0; smaller is more skewed. Unused
        for iid.
    min_partition_size : int
        Smallest acceptable partition. ``"dirichlet"`` redraws until every
        partition has at least this many samples (10 retries at most);
        ``"dirichlet-size-label"`` gives every partition this many samples
        before sharing out the rest by the size proportions.
    seed : int
        Seed of the shuffle or of the Dirichlet draws; the same arguments give
        the same partitions in every process.
    size_alpha : float
        Size Dirichlet concentration of ``"dirichlet-size-label"``, > 0;
        smaller gives more unequal sizes (Matsuda et al.: 10).
    groups : array-like, optional
        ``"natural"`` only: one group per sample, the integers
        ``0 .. num_partitions - 1`` (``user_index`` of a LEAF dataset).
        ``min_partition_size`` does not apply: the groups decide the sizes.

    Returns
    -------
    list[np.ndarray]
        ``num_partitions`` read-only int64 arrays of positions into ``labels``.
        They are computed once per set of arguments and then read from the
        disk cache (:mod:`fedx.data.cache`), keyed by the arguments, a digest
        of ``labels`` and ``groups`` and the versions of the code.

    Raises
    ------
    ValueError
        On an invalid argument, or when ``min_partition_size`` cannot be met.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    _check_partition_args(len(labels), num_partitions, partitioning, alpha, min_partition_size)
    group_array = None if groups is None else np.asarray(groups)
    settings = {
        "num_partitions": int(num_partitions),
        "partitioning": partitioning,
        "alpha": float(alpha),
        "min_partition_size": int(min_partition_size),
        "seed": int(seed),
        "size_alpha": float(size_alpha),
    }
    key = {
        **settings,
        "labels": array_digest(labels),
        "groups": array_digest(group_array),
        "code": code_identity(__file__, "flwr-datasets", "datasets"),
    }
    return list(
        cached_indices(
            "partitions", key, lambda: _compute_partitions(labels, group_array, **settings)
        )
    )


def _compute_partitions(
    labels: np.ndarray,
    groups: np.ndarray | None,
    *,
    num_partitions: int,
    partitioning: str,
    alpha: float,
    min_partition_size: int,
    seed: int,
    size_alpha: float,
) -> list[np.ndarray]:
    """What :func:`partition_indices` returns, computed (its arguments are checked)."""
    num_samples = len(labels)
    if partitioning == "natural":
        return _natural_partitions(groups, num_samples, num_partitions)
    if partitioning == "dirichlet-size-label":
        return _size_label_dirichlet(
            labels, num_partitions, alpha, size_alpha, min_partition_size, seed
        )
    # pylint: disable=import-outside-toplevel  (imported only where a split is computed)
    import datasets as hf_datasets
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner

    if partitioning == "iid":
        # IidPartitioner cuts contiguous shards, which would keep any order of
        # the samples (such as sorted by label): shuffle first.
        order = np.random.default_rng(seed).permutation(num_samples)
        table = hf_datasets.Dataset.from_dict({"label": labels[order], "index": order})
        partitioner: Partitioner = IidPartitioner(num_partitions)
    else:
        table = hf_datasets.Dataset.from_dict({"label": labels, "index": np.arange(num_samples)})
        partitioner = DirichletPartitioner(
            num_partitions,
            partition_by="label",
            alpha=float(alpha),
            min_partition_size=min_partition_size,
            self_balancing=False,
            seed=seed,
        )
    partitioner.dataset = table
    try:
        with warnings.catch_warnings():
            # DirichletPartitioner warns on every redraw; failure is reported below.
            warnings.filterwarnings("ignore", message="The specified min_partition_size")
            return [
                np.asarray(partitioner.load_partition(i)["index"], dtype=np.int64)
                for i in range(num_partitions)
            ]
    except ValueError as err:
        # The arguments were checked above, so this is the partitioner giving
        # up on min_partition_size after its retries.
        raise ValueError(
            f"dirichlet partitioning of {num_samples} samples into {num_partitions} "
            f"partitions with dirichlet-alpha={alpha} could not give every partition "
            f"min-partition-size={min_partition_size} samples; lower min-partition-size, "
            f"raise dirichlet-alpha or use fewer partitions"
        ) from err


def _natural_partitions(
    groups: np.ndarray | Sequence[int] | None, num_samples: int, num_partitions: int
) -> list[np.ndarray]:
    """One partition per group: the positions of group ``g``'s samples, in order."""
    if groups is None:
        raise ValueError(
            "partitioning='natural' needs data whose samples belong to users: "
            f"one of the LEAF datasets {', '.join(LEAF_DATASETS)}"
        )
    groups = np.asarray(groups, dtype=np.int64)
    if groups.shape != (num_samples,):
        raise ValueError(
            f"groups must hold one group per sample ({num_samples}), got shape {groups.shape}"
        )
    num_groups = len(np.unique(groups))
    if num_groups != num_partitions or groups.min() < 0 or groups.max() >= num_partitions:
        raise ValueError(
            f"partitioning='natural' makes every user one partition: the data has "
            f"{num_groups} users but num-partitions={num_partitions}"
        )
    order = np.argsort(groups, kind="stable")
    bounds = np.cumsum(np.bincount(groups, minlength=num_partitions))[:-1]
    return [part.astype(np.int64) for part in np.split(order, bounds)]


def dirichlet_sizes(
    num_samples: int,
    num_partitions: int,
    alpha: float,
    min_size: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Draw partition sizes that sum to ``num_samples`` from a Dirichlet distribution.

    flwr-datasets has no partitioner that draws sizes at random (its size
    partitioners follow fixed laws, and ``DirichletPartitioner``'s sizes only
    follow from the label draws), so the sizes of this scheme come from
    here and the labels from ``InnerDirichletPartitioner``.

    Parameters
    ----------
    num_samples : int
        Samples to share out.
    num_partitions : int
        Number of partitions, at least 1.
    alpha : float
        Concentration of the symmetric ``Dir(alpha)`` proportions, > 0.
    min_size : int
        Every partition first gets this many samples; the remaining
        ``num_samples - num_partitions * min_size`` are shared out by the
        proportions (largest remainders get the samples left by rounding).
    rng : np.random.Generator
        Source of the proportions.

    Returns
    -------
    np.ndarray
        ``num_partitions`` int64 sizes, each ``>= min_size``, summing to
        ``num_samples``.

    Raises
    ------
    ValueError
        If ``num_partitions * min_size > num_samples`` or ``alpha <= 0``.
    """
    if not alpha > 0:
        raise ValueError(f"size alpha={alpha!r} must be > 0")
    spare = num_samples - num_partitions * min_size
    if num_partitions < 1 or spare < 0:
        raise ValueError(
            f"cannot give {num_partitions} partitions at least {min_size} of "
            f"{num_samples} samples each"
        )
    shares = rng.dirichlet(np.full(num_partitions, float(alpha))) * spare
    sizes = np.floor(shares).astype(np.int64)
    leftover = spare - int(sizes.sum())
    # Rounding down leaves fewer than num_partitions samples: they go to the
    # partitions that lost the largest fractions.
    sizes[np.argsort(sizes - shares, kind="stable")[:leftover]] += 1
    return sizes + min_size


def _size_label_dirichlet(
    labels: np.ndarray,
    num_partitions: int,
    alpha: float,
    size_alpha: float,
    min_partition_size: int,
    seed: int,
) -> list[np.ndarray]:
    """Matsuda et al.'s partitioning: Dirichlet sizes, then a Dirichlet label mix per partition."""
    # pylint: disable=import-outside-toplevel  (imported only where a split is computed)
    import datasets as hf_datasets
    from flwr_datasets.partitioner import InnerDirichletPartitioner

    if not size_alpha > 0:
        raise ValueError(f"size-alpha={size_alpha!r} must be > 0")
    sizes = dirichlet_sizes(
        len(labels), num_partitions, size_alpha, min_partition_size, np.random.default_rng(seed)
    )
    # InnerDirichletPartitioner expects the classes to be 0 .. C-1.
    _, dense_labels = np.unique(labels, return_inverse=True)
    table = hf_datasets.Dataset.from_dict(
        {"label": dense_labels.astype(np.int64), "index": np.arange(len(labels))}
    )
    partitioner = InnerDirichletPartitioner(
        partition_sizes=sizes, partition_by="label", alpha=float(alpha), shuffle=True, seed=seed
    )
    partitioner.dataset = table
    return [
        np.asarray(partitioner.load_partition(i)["index"], dtype=np.int64)
        for i in range(num_partitions)
    ]


def load_partition(
    name: str,
    partition_id: int,
    num_partitions: int,
    *,
    partitioning: str = "iid",
    alpha: float = 1.0,
    min_partition_size: int = 0,
    **settings: Unpack[SplitSettings],
) -> Partition:
    """Return one client's share of a dataset's training split.

    The split is loaded with :func:`fedx.data.load_split` and partitioned
    with :func:`partition_indices`; both are cached per process, so a
    simulation worker that serves many clients loads and partitions once.

    Parameters
    ----------
    name : str
        One of :data:`fedx.data.DATASET_NAMES`.
    partition_id : int
        Which partition, ``0 <= partition_id < num_partitions`` (a Flower
        node's ``partition-id``).
    num_partitions : int
        Number of partitions (Flower's ``num-partitions``).
    partitioning, alpha, min_partition_size
        As for :func:`partition_indices`. ``"natural"`` (LEAF only) gives
        partition ``i`` the samples of the ``i``-th selected user, so
        ``num_partitions`` must be the number of selected users. The other
        partitionings pool the selected users' samples and share them out
        like any other dataset's.
    **settings
        As for :func:`fedx.data.load_split` (:class:`fedx.data.SplitSource`);
        ``seed`` also seeds the partitioning.

    Returns
    -------
    Partition
        A ``torch.utils.data.Subset`` of the training split with a
        ``targets`` attribute.

    Raises
    ------
    ValueError
        On an invalid argument; for ``"natural"`` also when the dataset has
        no users or ``num_partitions`` is not their number.
    """
    check_partition_id(partition_id, num_partitions)
    source = SplitSource(name, **settings)
    train = source.load("train")
    if partitioning == "natural":
        _check_natural(name, train, num_partitions)
    partitions = _train_partitions(
        source.canonical(),
        int(num_partitions),
        partitioning,
        float(alpha),
        int(min_partition_size),
    )
    return Partition(train, partitions[partition_id])


def load_test_share(
    name: str, partition_id: int, num_partitions: int, **settings: Unpack[SplitSettings]
) -> Partition:
    """Return one client's IID share of a dataset's test split (it has the distribution of the whole).

    Clients evaluate a global model on these shares: together they are the
    test split, each of them a seeded IID partition (:func:`partition_indices`).
    Cached per process, like :func:`load_partition`.

    Parameters
    ----------
    name, partition_id, num_partitions
        As for :func:`load_partition`.
    **settings
        As for :func:`fedx.data.load_split`; ``seed`` also seeds the shares.
    """
    check_partition_id(partition_id, num_partitions)
    source = SplitSource(name, **settings)
    test = source.load("test")
    return Partition(test, _test_shares(source.canonical(), int(num_partitions))[partition_id])


def check_partition_id(partition_id: int, num_partitions: int) -> None:
    """Raise the run-config error for a ``partition-id`` outside ``[0, num_partitions)``."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"partition-id={partition_id!r} must be in [0, {num_partitions}) "
            f"for num-partitions={num_partitions}"
        )


@functools.lru_cache(maxsize=8)
def _test_shares(source: SplitSource, num_partitions: int) -> tuple[np.ndarray, ...]:
    test = source.load("test")
    return tuple(partition_indices(dataset_labels(test), num_partitions, seed=source.seed))


def _check_natural(name: str, train: Dataset, num_partitions: int) -> None:
    """Explain in run-config terms why ``"natural"`` cannot partition ``train``."""
    users = getattr(train, "users", None)
    if users is None:
        raise ValueError(
            f"partitioning='natural' needs a LEAF dataset ({', '.join(LEAF_DATASETS)}), "
            f"whose users are the clients; dataset={name!r} has no users"
        )
    if len(users) != num_partitions:
        raise ValueError(
            f"partitioning='natural' makes every {name} user one client: {len(users)} users "
            f"are selected but num-partitions={num_partitions}; run {len(users)} SuperNodes "
            f'(--federation-config "num-supernodes={len(users)}") or set leaf-users='
            f"{num_partitions}"
        )


@functools.lru_cache(maxsize=8)
def _train_partitions(
    source: SplitSource,
    num_partitions: int,
    partitioning: str,
    alpha: float,
    min_partition_size: int,
) -> tuple[np.ndarray, ...]:
    train = source.load("train")
    # Read-only: shared by every caller through the cache.
    partitions = partition_indices(
        dataset_labels(train),
        num_partitions,
        partitioning=partitioning,
        alpha=alpha,
        min_partition_size=min_partition_size,
        seed=source.seed,
        groups=dataset_groups(train),
    )
    return tuple(partitions)


def _check_partition_args(
    num_samples: int, num_partitions: int, partitioning: str, alpha: float, min_partition_size: int
) -> None:
    _check_choice("partitioning", partitioning, PARTITIONINGS)
    if not 1 <= num_partitions <= num_samples:
        raise ValueError(
            f"num-partitions={num_partitions!r} must be between 1 and the "
            f"number of samples ({num_samples})"
        )
    if min_partition_size < 0:
        raise ValueError(f"min-partition-size={min_partition_size!r} must be >= 0")
    if partitioning not in ("iid", "natural") and not alpha > 0:
        raise ValueError(f"dirichlet-alpha={alpha!r} must be > 0")
    if partitioning == "iid" and num_samples // num_partitions < min_partition_size:
        raise ValueError(
            f"iid partitioning of {num_samples} samples into {num_partitions} partitions "
            f"gives partitions of {num_samples // num_partitions} samples, fewer than "
            f"min-partition-size={min_partition_size}"
        )
