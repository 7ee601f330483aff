"""Image batches drawn, augmented and normalised where the model trains: a GPU's data path.

The CPU data path of an image dataset is torchvision's: a ``DataLoader``
takes one sample at a time, and the dataset crops, flips, converts and
normalises each image with PIL (:func:`fedx.data.load_split`). On a GPU
that is what a round waits for, a few milliseconds of host work per batch
against a step of a few milliseconds on the card, and every batch crosses
to the device on its own. Here a split's images live on the device instead,
as the uint8 array they are on disk (CIFAR-10's training split: 150 MB,
240 MB zero-padded for the crop), and a batch is one indexing of it:

* **the same augmentation**: the crop offsets (0 to 2 x padding, both
  axes) and the flips (probability 1/2) are drawn on the device from
  torch's generator for it, with the distributions of torchvision's
  ``RandomCrop(size, padding)`` and ``RandomHorizontalFlip()``; the crop is
  the zero-padded image sliced, flipped when drawn, exactly as there;
* **the same normalisation**: ``(x / 255 - mean) / std`` per channel, as
  ``ToTensor()`` and ``Normalize`` compute it up to float rounding (one
  multiply-add here);
* **no waiting**: the permutation, offsets and flips of up to
  :data:`BLOCK_SAMPLES` samples are drawn at once, and nothing is read back
  to the host, so the GPU queues batch after batch.

Each call gets its own :class:`DeviceBatches` over its own partition: its
shuffling and augmentation come from the generator its task seeded, and
nothing passes from one client's batches to another's.

Which path a call takes (:func:`device_batches`): this one for a dataset of
in-memory uint8 images (it says so with an ``image_transform``, as fedx's
CIFAR splits do), on a GPU and on a CPU alike: on a CPU too it makes an
epoch's batches several times faster than torchvision's per-image
transforms (``benchmarks/gpu_round.py``, ``docs/gpu.md``); the dataset's
own path (``None`` here: a ``DataLoader``) for every other dataset. A
process keeps a split on a GPU from its second call that needs it (a Ray
actor answering message after message; a process that answers one message
copies only its partition's images), when the split takes at most
:data:`RESIDENT_FRACTION` of the GPU's free memory. On a CPU each call takes
its partition's images from the split: there is nothing to copy ahead.
"""

import math
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Subset

if TYPE_CHECKING:
    from torchvision.transforms import Compose

#: Samples whose permutation, crops and flips are drawn, and whose images are
#: gathered and normalised, at once (a whole epoch of a typical client).
BLOCK_SAMPLES = 4096
#: A split stays on a GPU when it takes at most this share of its free memory.
RESIDENT_FRACTION = 0.25
#: Splits a process keeps on its devices at most (a training and a test split).
RESIDENT_SPLITS = 2


@dataclass(frozen=True)
class ImageTransform:
    """What an image split's uint8 pixels go through before the model, as data.

    Both data paths are made from it: torchvision's transforms
    (:meth:`torchvision`) and the device's (:class:`DeviceImages`).

    Attributes
    ----------
    mean, std : tuple of float
        Per channel, of the pixels scaled to ``[0, 1]``.
    crop_padding : int
        A random crop of the image's own size from the image zero-padded by
        this many pixels on every side; 0 for none.
    flip : bool
        A random horizontal flip, with probability 1/2.
    """

    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_padding: int = 0
    flip: bool = False

    def torchvision(self, size: int) -> "Compose":
        """torchvision's transforms of PIL images of ``size x size`` pixels (the CPU path)."""
        # pylint: disable=import-outside-toplevel  (torchvision only for the data sets that need it)
        from torchvision import transforms

        steps: list[Any] = []
        if self.crop_padding:
            steps.append(transforms.RandomCrop(size, padding=self.crop_padding))
        if self.flip:
            steps.append(transforms.RandomHorizontalFlip())
        steps += [transforms.ToTensor(), transforms.Normalize(self.mean, self.std)]
        return transforms.Compose(steps)


class DeviceImages:
    """A split's uint8 images on a device, zero-padded for the crop, with their labels.

    Parameters
    ----------
    pixels : np.ndarray
        ``(N, H, W, C)`` uint8 images (torchvision's CIFAR ``data``).
    labels : array-like
        ``(N,)`` integer labels.
    transform : ImageTransform
        Their augmentation and normalisation.
    device : torch.device
        Where they are kept and batches are made.
    """

    def __init__(
        self, pixels: np.ndarray, labels: Any, transform: ImageTransform, device: torch.device
    ) -> None:
        if pixels.dtype != np.uint8 or pixels.ndim != 4:
            raise ValueError(
                f"expected (N, H, W, C) uint8 images, got {pixels.dtype} {pixels.shape}"
            )
        self.transform = transform
        self.device = device
        _, self.height, self.width, channels = pixels.shape
        pad = transform.crop_padding
        images = torch.from_numpy(np.ascontiguousarray(pixels)).to(device).permute(0, 3, 1, 2)
        self.images = F.pad(images, (pad, pad, pad, pad)).contiguous()  # zeros, as RandomCrop's
        self.labels = torch.as_tensor(np.asarray(labels, dtype=np.int64)).to(device)
        mean = torch.tensor(transform.mean, dtype=torch.float32).view(1, channels, 1, 1)
        std = torch.tensor(transform.std, dtype=torch.float32).view(1, channels, 1, 1)
        # (x / 255 - mean) / std as one multiply-add: x * scale + shift.
        self.scale = (1.0 / (255.0 * std)).to(device)
        self.shift = (-mean / std).to(device)
        self._rows = torch.arange(self.height, device=device)
        self._cols = torch.arange(self.width, device=device)
        self._channels = torch.arange(channels, device=device).view(1, channels, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def nbytes(self) -> int:
        """Device memory the images and labels take."""
        return self.images.nbytes + self.labels.nbytes

    def crops(
        self,
        positions: torch.Tensor,
        top: torch.Tensor | None = None,
        left: torch.Tensor | None = None,
        flipped: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``(n, C, H, W)`` uint8: each image's crop at (``top``, ``left``) of the padded image.

        Without offsets, the crop is the image itself (the padding's centre);
        ``flipped`` (bool per image) reverses a crop's columns.
        """
        pad = self.transform.crop_padding
        n = len(positions)
        rows = (pad if top is None else top.view(n, 1)) + self._rows
        cols = (pad if left is None else left.view(n, 1)) + self._cols
        rows, cols = rows.expand(n, self.height), cols.expand(n, self.width)
        if flipped is not None:
            cols = torch.where(flipped.view(n, 1), cols.flip(1), cols)
        return self.images[
            positions.view(n, 1, 1, 1),
            self._channels,
            rows.view(n, 1, -1, 1),
            cols.view(n, 1, 1, -1),
        ]

    def normalised(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 pixels as the model's float inputs: ``(x / 255 - mean) / std``."""
        return torch.addcmul(self.shift, pixels.float(), self.scale)

    def augmented(
        self, positions: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """The images at ``positions``, randomly cropped and flipped as the transform says, normalised.

        The offsets and flips come from ``generator`` (torch's for the device by default).
        """
        n, spec, device = len(positions), self.transform, self.device
        top = left = flipped = None
        if spec.crop_padding:
            offsets = torch.randint(
                0, 2 * spec.crop_padding + 1, (2, n), device=device, generator=generator
            )
            top, left = offsets[0], offsets[1]
        if spec.flip:
            flipped = torch.rand(n, device=device, generator=generator) < 0.5
        return self.normalised(self.crops(positions, top, left, flipped))


class DeviceBatches:
    """Batches of some of a :class:`DeviceImages`' samples, made on its device: a ``DataLoader``'s stand-in.

    Every pass (``for inputs, labels in batches``) is one epoch: the samples
    in a new random order when ``shuffle``, in their order otherwise, in
    batches of ``batch_size`` (the last one smaller), augmented when
    ``augment`` and the images' transform augments.

    Parameters
    ----------
    images : DeviceImages
        The split.
    positions : torch.Tensor
        Positions of this dataset's samples in the split, on its device.
    batch_size : int
        Samples per batch.
    shuffle, augment : bool
        As the CPU path would: shuffled training batches, augmented images.
    generator : torch.Generator, optional
        Where the order, crops and flips are drawn from (on the images'
        device); torch's default generator for it, which a task seeds, by
        default.
    """

    def __init__(
        self,
        images: DeviceImages,
        positions: torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool,
        augment: bool,
        generator: torch.Generator | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be >= 1")
        self.images = images
        self.positions = positions
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.augment = augment
        self.generator = generator
        self._block = batch_size * max(1, BLOCK_SAMPLES // batch_size)

    def __len__(self) -> int:
        return math.ceil(len(self.positions) / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self.positions
        if self.shuffle:
            order = order[torch.randperm(len(order), device=order.device, generator=self.generator)]
        for start in range(0, len(order), self._block):
            block = order[start : start + self._block]
            if self.augment:
                inputs = self.images.augmented(block, self.generator)
            else:
                inputs = self.images.normalised(self.images.crops(block))
            labels = self.images.labels[block]
            for first in range(0, len(block), self.batch_size):
                yield (
                    inputs[first : first + self.batch_size],
                    labels[first : first + self.batch_size],
                )


def device_batches(
    dataset: Dataset, batch_size: int, device: torch.device, *, shuffle: bool = False
) -> DeviceBatches | None:
    """Batches of ``dataset`` made on ``device``; ``None`` where the dataset's own path serves it.

    This path serves a dataset of in-memory uint8 images: one with ``data``
    and an :class:`ImageTransform` as ``image_transform``, or a ``Subset`` of
    one (a partition). It augments as the dataset's transform does.
    """
    found = _uint8_images(dataset)
    if found is None:
        return None
    split, positions = found
    images, on_device = _RESIDENT.images(split, positions, device)
    transform = images.transform
    augment = bool(transform.crop_padding or transform.flip)
    return DeviceBatches(images, on_device, batch_size, shuffle=shuffle, augment=augment)


def _uint8_images(dataset: Dataset) -> tuple[Dataset, np.ndarray] | None:
    """The split of in-memory uint8 images ``dataset`` is (part of), and its samples' positions there."""
    positions: np.ndarray | None = None
    while isinstance(dataset, Subset):
        indices = np.asarray(dataset.indices, dtype=np.int64)
        positions = indices if positions is None else indices[positions]
        dataset = dataset.dataset
    pixels = getattr(dataset, "data", None)
    if not isinstance(getattr(dataset, "image_transform", None), ImageTransform):
        return None
    if not isinstance(pixels, np.ndarray) or pixels.dtype != np.uint8 or pixels.ndim != 4:
        return None
    if positions is None:
        positions = np.arange(len(pixels), dtype=np.int64)
    return dataset, positions


class _ResidentSplits:
    """The splits this process keeps on its devices, and how often each was asked for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[int, str], tuple[Dataset, DeviceImages]] = OrderedDict()
        self._asked: dict[tuple[int, str], int] = {}

    def images(
        self, split: Dataset, positions: np.ndarray, device: torch.device
    ) -> tuple[DeviceImages, torch.Tensor]:
        """The images to batch from, and the positions of the samples in them."""
        # torch.tensor copies: partitions read from the cache are read-only arrays, which
        # torch.as_tensor would share and warn about.
        key = (id(split), str(device))
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and kept[0] is split:
                self._kept.move_to_end(key)
                return kept[1], torch.tensor(positions).to(device)
            asked = self._asked.get(key, 0) + 1
            self._asked[key] = asked
            pixels, labels = split.data, np.asarray(split.targets)  # type: ignore[attr-defined]
            transform = split.image_transform  # type: ignore[attr-defined]
            if asked >= 2 and _fits(pixels, transform, device):
                whole = DeviceImages(pixels, labels, transform, device)
                self._kept[key] = (split, whole)
                while len(self._kept) > RESIDENT_SPLITS:
                    self._kept.popitem(last=False)
                return whole, torch.tensor(positions).to(device)
        part = DeviceImages(pixels[positions], labels[positions], transform, device)
        return part, torch.arange(len(positions), device=device)

    def clear(self) -> None:
        """Forget every split (tests)."""
        with self._lock:
            self._kept.clear()
            self._asked.clear()


def _fits(pixels: np.ndarray, transform: ImageTransform, device: torch.device) -> bool:
    """Whether a split's padded images should stay on ``device``: a GPU with room for them."""
    n, height, width, channels = pixels.shape
    pad = transform.crop_padding
    needed = n * channels * (height + 2 * pad) * (width + 2 * pad)
    if device.type != "cuda":
        return False  # host memory: a second copy of the split would save nothing
    free, _total = torch.cuda.mem_get_info(device)
    return needed <= RESIDENT_FRACTION * free


#: The process's resident splits.
_RESIDENT = _ResidentSplits()
