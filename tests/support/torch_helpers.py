"""What the test modules that run torch share.

Kept apart from tests/support/helpers.py, which conftest.py imports in every run:
importing torch there would load it for the tests that need none.
"""

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

if TYPE_CHECKING:  # torchvision only for the tests that load its data sets
    from torchvision.datasets import CIFAR10

#: Where the tests train and evaluate: CI has no GPU, and a GPU would change the figures.
CPU = torch.device("cpu")


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def expect_generated_checksums(
    monkeypatch: pytest.MonkeyPatch, dataset_class: "type[CIFAR10]", folder: Path
) -> None:
    """Let torchvision's ``dataset_class`` accept the files generated in ``folder``."""

    # torchvision checks every file against the md5 of the real download,
    # which generated files cannot match. Rather than switching the check
    # off (the metadata file is checked by a module-level function that a
    # patched _check_integrity would not cover), let the class expect the
    # md5 sums of the generated files, so torchvision's own checks still run.
    def with_generated(entries: list[list[str]]) -> list[list[str]]:
        return [[name, _md5(folder / name)] for name, _ in entries]

    monkeypatch.setattr(dataset_class, "train_list", with_generated(dataset_class.train_list))
    monkeypatch.setattr(dataset_class, "test_list", with_generated(dataset_class.test_list))
    meta = dataset_class.meta | {"md5": _md5(folder / dataset_class.meta["filename"])}
    monkeypatch.setattr(dataset_class, "meta", meta)
