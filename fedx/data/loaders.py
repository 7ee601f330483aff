"""DataLoaders that take each batch of an in-memory dataset in one indexing.

A ``DataLoader`` reads a map-style dataset one sample at a time and stacks
the samples (``default_collate``): a Python call per sample. The digits and
LEAF datasets hold all their inputs in one tensor, so a batch can be one
indexing of that tensor instead (:meth:`DigitsDataset.gather`,
:meth:`fedx.data.LeafDataset.gather`), also through the ``Subset`` s that
partitions and local splits are. :func:`batch_loader` gives such a dataset a
``DataLoader`` with the same sampler, so the same random numbers are drawn
and the same samples come in the same order, as the same tensors, bit for
bit; only the Python calls per sample are gone. Other datasets (CIFAR, whose
training images are augmented one at a time) get a plain ``DataLoader``.

Nothing is copied ahead of time: a partition stays a list of positions into
the split (which each process loads once), and a batch is gathered when the
loader yields it.
"""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

#: ``gather(positions) -> (inputs, labels)``: a batch of a dataset, collated.
Gather = Callable[[np.ndarray], tuple[torch.Tensor, torch.Tensor]]


def batch_gatherer(dataset: Dataset) -> Gather | None:
    """How to take a batch of ``dataset`` in one indexing; ``None`` when it cannot.

    A dataset can when it has a ``gather(positions)`` method (the digits and
    LEAF datasets), or is a ``Subset`` (a partition) of one that can.
    """
    if isinstance(dataset, Subset):
        parent = batch_gatherer(dataset.dataset)
        if parent is None:
            return None
        positions = np.asarray(dataset.indices, dtype=np.int64)
        return lambda batch: parent(positions[batch])
    gather = getattr(dataset, "gather", None)
    return gather if callable(gather) else None


class _GatheredBatches(Dataset):
    """``dataset`` as the loader's fetcher sees it: a list of positions gives the whole batch.

    The fetcher calls ``__getitems__`` with the positions the sampler chose
    and hands its list to the collate function, :func:`_collated`.
    """

    def __init__(self, gather: Gather, length: int) -> None:
        self._gather = gather
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, labels = self._gather(np.array([index], dtype=np.int64))
        return inputs[0], labels[0]

    def __getitems__(self, positions: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [self._gather(np.asarray(positions, dtype=np.int64))]


def _collated(batches: list[Any]) -> Any:
    (batch,) = batches
    return batch


def batch_loader(dataset: Dataset, batch_size: int, *, shuffle: bool = False) -> DataLoader:
    """``DataLoader(dataset, batch_size, shuffle=shuffle)``, gathering batches where it can.

    The batches are those of the plain ``DataLoader`` with the same
    arguments, bit for bit, and the loader draws the same numbers from
    torch's global generator: a run seeded as before gives the same result.
    """
    gather = batch_gatherer(dataset)
    if gather is None:
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)
    return DataLoader(
        _GatheredBatches(gather, len(dataset)),  # type: ignore[arg-type]
        batch_size=batch_size,
        shuffle=shuffle,
        collate_fn=_collated,
    )
