"""Datasets for fedx experiments and their partitioning among clients.

``digits`` (scikit-learn's bundled 8x8 handwritten digits) works offline and
is the default; ``cifar10`` and ``cifar100`` are read from torchvision's
on-disk format under the ``data-root`` folder.
"""

from fedx.data.datasets import (
    DATASET_NAMES,
    SPLITS,
    DatasetInfo,
    DigitsDataset,
    dataset_info,
    load_split,
)
from fedx.data.partitioning import (
    PARTITIONINGS,
    Partition,
    dataset_labels,
    load_partition,
    partition_indices,
)

__all__ = [
    "DATASET_NAMES",
    "PARTITIONINGS",
    "SPLITS",
    "DatasetInfo",
    "DigitsDataset",
    "Partition",
    "dataset_info",
    "dataset_labels",
    "load_partition",
    "load_split",
    "partition_indices",
]
