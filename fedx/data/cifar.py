"""CIFAR-10 and CIFAR-100 from disk with torchvision (imported when first loaded).

A missing or damaged file stops the run with an error that names it and
says how to fetch it (the ``download`` run-config key).
"""

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedx.data.device import ImageTransform

if TYPE_CHECKING:
    from torchvision.datasets import CIFAR10


@dataclass(frozen=True)
class _CifarSpec:
    """How to load one CIFAR variant with torchvision."""

    title: str
    class_name: str  # of torchvision.datasets
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @property
    def dataset_class(self) -> "type[CIFAR10]":
        from torchvision import datasets  # pylint: disable=import-outside-toplevel

        return getattr(datasets, self.class_name)


# Per-channel mean and standard deviation of the training images.
_CIFAR: dict[str, _CifarSpec] = {
    "cifar10": _CifarSpec(
        "CIFAR-10", "CIFAR10", (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    ),
    "cifar100": _CifarSpec(
        "CIFAR-100", "CIFAR100", (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
    ),
}


@functools.lru_cache(maxsize=4)
def load_cifar(name: str, train: bool, root: str, download: bool, augment: bool) -> "CIFAR10":
    """CIFAR-10 or CIFAR-100 (``name``) from ``root`` with torchvision, normalized, augmented for training."""
    spec = _CIFAR[name]
    folder = os.path.join(root, spec.dataset_class.base_folder)
    if not download:
        missing = missing_cifar_files(spec.dataset_class, folder)
        if missing:
            raise FileNotFoundError(
                f"{spec.title} not found: {folder} lacks {', '.join(missing)}; "
                f"set download=true (run-config key) to fetch it into {root}"
            )
    # Random 32x32 crops of the image padded by 4, flipped half the time (training only).
    transform = ImageTransform(spec.mean, spec.std, crop_padding=4 * augment, flip=augment)
    try:
        dataset = spec.dataset_class(
            root, train=train, transform=transform.torchvision(32), download=download
        )
    except RuntimeError as err:
        # torchvision reports missing and corrupted files alike; by now the
        # files exist, so their md5 sums did not match.
        raise RuntimeError(
            f"{spec.title} files in {folder} failed torchvision's md5 check; "
            f"delete the folder and set download=true to fetch them again"
        ) from err
    # The same transform for the GPU's data path (fedx.data.device), which
    # batches the uint8 images of `dataset.data` on the device.
    dataset.image_transform = transform
    return dataset


def missing_cifar_files(dataset_class: "type[CIFAR10]", folder: str) -> list[str]:
    """Names of the files torchvision will read that are not in ``folder``."""
    names = [name for name, _md5 in dataset_class.train_list + dataset_class.test_list]
    names.append(dataset_class.meta["filename"])
    return [name for name in names if not os.path.isfile(os.path.join(folder, name))]
