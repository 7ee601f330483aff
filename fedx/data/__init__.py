"""Datasets for fedx experiments and their partitioning among clients.

``digits`` (scikit-learn's bundled 8x8 handwritten digits) works offline and
is the default; ``cifar10`` and ``cifar100`` are read from torchvision's
on-disk format under the ``data-root`` folder, ``femnist`` and
``shakespeare`` from LEAF's JSON files there (:mod:`fedx.data.leaf`), where
``partitioning="natural"`` makes every LEAF user one client. A data set of
another package is a :class:`DatasetSpec` that the ``dataset`` key names
(``package.module:NAME``, or an entry point of the group ``fedx.datasets``:
:func:`find_dataset`). Personalized methods (evaluated per client) use
:func:`load_local_splits` and :func:`load_unlabeled`.
"""

from fedx.data.datasets import (
    DATASET_NAMES,
    SPLITS,
    DatasetInfo,
    DatasetSpec,
    SplitSettings,
    SplitSource,
    dataset_has_users,
    dataset_info,
    dataset_names,
    find_dataset,
    load_split,
)
from fedx.data.device import DeviceBatches, DeviceImages, ImageTransform, device_batches
from fedx.data.digits import DigitsDataset
from fedx.data.leaf import LEAF_DATASETS, LeafDataset, decode_text, encode_text
from fedx.data.loaders import batch_gatherer, batch_loader
from fedx.data.partitioning import (
    PARTITIONINGS,
    Partition,
    dataset_groups,
    dataset_labels,
    dirichlet_sizes,
    load_partition,
    load_test_share,
    partition_indices,
)
from fedx.data.personalized import (
    LocalSplits,
    load_local_splits,
    load_unlabeled,
    split_local,
    unlabeled_size,
)

__all__ = [
    "DATASET_NAMES",
    "LEAF_DATASETS",
    "PARTITIONINGS",
    "SPLITS",
    "DatasetInfo",
    "DatasetSpec",
    "DeviceBatches",
    "DeviceImages",
    "DigitsDataset",
    "LeafDataset",
    "ImageTransform",
    "LocalSplits",
    "Partition",
    "SplitSettings",
    "SplitSource",
    "batch_gatherer",
    "batch_loader",
    "dataset_groups",
    "dataset_has_users",
    "dataset_info",
    "dataset_labels",
    "dataset_names",
    "decode_text",
    "device_batches",
    "dirichlet_sizes",
    "encode_text",
    "find_dataset",
    "load_local_splits",
    "load_partition",
    "load_split",
    "load_test_share",
    "load_unlabeled",
    "partition_indices",
    "split_local",
    "unlabeled_size",
]
