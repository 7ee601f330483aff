"""Tests for fedx.data: dataset loaders, partitioning and the per-process caches."""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch.utils.data import Subset
from torchvision.datasets import CIFAR10, CIFAR100

from fedx.data import (
    DATASET_NAMES,
    PARTITIONINGS,
    DatasetInfo,
    dataset_info,
    load_partition,
    load_split,
    partition_indices,
)
from fedx.data.cache import CACHE_ENV
from tests.support.torch_helpers import expect_generated_checksums

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


# --- dataset_info -----------------------------------------------------------


def test_dataset_info() -> None:
    assert DATASET_NAMES == ("digits", "cifar10", "cifar100", "femnist", "shakespeare")
    assert dataset_info("digits") == DatasetInfo(input_shape=(1, 8, 8), num_classes=10)
    assert dataset_info("cifar10") == DatasetInfo(input_shape=(3, 32, 32), num_classes=10)
    assert dataset_info("cifar100") == DatasetInfo(input_shape=(3, 32, 32), num_classes=100)
    assert dataset_info("femnist") == DatasetInfo(input_shape=(1, 28, 28), num_classes=62)
    assert dataset_info("shakespeare") == DatasetInfo(input_shape=(80,), num_classes=80)


def test_unknown_dataset_names_the_allowed_ones() -> None:
    for call in (lambda: dataset_info("mnist"), lambda: load_split("mnist", "train")):
        with pytest.raises(ValueError) as info:
            call()
        assert "'mnist'" in str(info.value)
        assert all(name in str(info.value) for name in DATASET_NAMES)


# --- digits -----------------------------------------------------------------


def test_digits_splits_are_stratified_and_scaled() -> None:
    train = load_split("digits", "train")
    test = load_split("digits", "test")
    full = load_digits()
    assert len(test) == 360  # ceil(0.2 * 1797)
    assert len(train) + len(test) == len(full.target)

    image, label = train[0]
    assert image.shape == (1, 8, 8) and image.dtype == torch.float32
    assert isinstance(label, int) and label == train.targets[0]
    for split in (train, test):
        assert split.data.min() == 0.0 and split.data.max() == 1.0
        assert np.asarray(split.targets).ndim == 1

    # Stratified: every class in both splits, in its overall proportion.
    overall = np.bincount(full.target) / len(full.target)
    for split in (train, test):
        share = np.bincount(split.targets, minlength=10) / len(split)
        assert (share > 0).all()
        np.testing.assert_allclose(share, overall, atol=0.01)


def test_digits_splits_partition_the_dataset() -> None:
    train = load_split("digits", "train", seed=1)
    test = load_split("digits", "test", seed=1)
    # Same multiset of (image, label) rows as the whole dataset.
    full = load_digits()
    expected = np.column_stack([full.images.reshape(len(full.target), -1) / 16, full.target])
    got = np.vstack(
        [np.column_stack([s.data.reshape(len(s), -1).numpy(), s.targets]) for s in (train, test)]
    )
    np.testing.assert_allclose(got[np.lexsort(got.T)], expected[np.lexsort(expected.T)], atol=1e-6)


def test_digits_split_depends_on_seed_and_fraction() -> None:
    first = load_split("digits", "test", seed=0)
    assert load_split("digits", "test", seed=0) is first  # cached
    assert not np.array_equal(load_split("digits", "test", seed=1).targets, first.targets)
    assert len(load_split("digits", "test", test_fraction=0.5)) == 899


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"split": "valid"}, "split"),
        ({"test_fraction": 0.0}, "test-fraction"),
        ({"test_fraction": 1.0}, "test-fraction"),
    ],
)
def test_load_split_rejects_bad_arguments(kwargs: dict, key: str) -> None:
    arguments = {"split": "train"} | kwargs
    with pytest.raises(ValueError, match=key):
        load_split("digits", **arguments)


# --- partition_indices ------------------------------------------------------

# 1,000 samples sorted by label, 100 per class.
SORTED_LABELS = np.repeat(np.arange(10), 100)


def _assert_disjoint_cover(partitions: list[np.ndarray], num_samples: int) -> None:
    assert all(p.dtype == np.int64 for p in partitions)
    merged = np.concatenate(partitions)
    assert len(merged) == num_samples
    np.testing.assert_array_equal(np.sort(merged), np.arange(num_samples))


def _label_skew(labels: np.ndarray, partitions: list[np.ndarray]) -> float:
    """Mean total-variation distance between partition and overall label shares."""
    num_classes = labels.max() + 1
    overall = np.bincount(labels, minlength=num_classes) / len(labels)
    return float(
        np.mean(
            [
                0.5 * np.abs(np.bincount(labels[p], minlength=num_classes) / len(p) - overall).sum()
                for p in partitions
            ]
        )
    )


def test_iid_partitions_are_equal_shuffled_shares() -> None:
    partitions = partition_indices(SORTED_LABELS, 7, partitioning="iid", seed=0)
    assert len(partitions) == 7
    _assert_disjoint_cover(partitions, len(SORTED_LABELS))
    sizes = [len(p) for p in partitions]
    assert max(sizes) - min(sizes) <= 1
    # Shuffled before sharding: even on label-sorted input every share sees
    # (nearly) every class.
    assert all(len(np.unique(SORTED_LABELS[p])) >= 9 for p in partitions)


def test_iid_partitions_depend_on_seed_only() -> None:
    first = partition_indices(SORTED_LABELS, 4, seed=5)
    again = partition_indices(SORTED_LABELS, 4, seed=5)
    other = partition_indices(SORTED_LABELS, 4, seed=6)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_dirichlet_partitions_are_deterministic_disjoint_and_covering() -> None:
    def run(seed: int) -> list[np.ndarray]:
        return partition_indices(SORTED_LABELS, 10, partitioning="dirichlet", alpha=0.5, seed=seed)

    first, again, other = run(0), run(0), run(1)
    _assert_disjoint_cover(first, len(SORTED_LABELS))
    _assert_disjoint_cover(other, len(SORTED_LABELS))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_dirichlet_redraws_until_min_partition_size_is_met() -> None:
    kwargs = {"partitioning": "dirichlet", "alpha": 0.5, "seed": 6}
    unconstrained = partition_indices(SORTED_LABELS, 20, **kwargs)
    # With this seed the first draw leaves a partition below 15 samples ...
    assert min(len(p) for p in unconstrained) < 15
    constrained = partition_indices(SORTED_LABELS, 20, min_partition_size=15, **kwargs)
    # ... so the constraint forced a redraw that satisfies it.
    assert min(len(p) for p in constrained) >= 15
    _assert_disjoint_cover(constrained, len(SORTED_LABELS))


def test_dirichlet_impossible_min_partition_size_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="min-partition-size=60"):
        partition_indices(
            SORTED_LABELS, 20, partitioning="dirichlet", alpha=0.1, min_partition_size=60
        )


def test_iid_min_partition_size_is_checked() -> None:
    with pytest.raises(ValueError, match="min-partition-size=101"):
        partition_indices(SORTED_LABELS, 10, min_partition_size=101)


def test_small_alpha_skews_labels_more_than_large_alpha() -> None:
    def skew(alpha: float) -> float:
        partitions = partition_indices(
            SORTED_LABELS, 10, partitioning="dirichlet", alpha=alpha, seed=0
        )
        return _label_skew(SORTED_LABELS, partitions)

    skewed, balanced = skew(0.1), skew(100.0)
    assert skewed > 0.4
    assert balanced < 0.1
    assert skewed > 4 * balanced


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"partitioning": "shards"}, ["partitioning", "'shards'", *PARTITIONINGS]),
        ({"partitioning": "dirichlet", "alpha": 0.0}, ["dirichlet-alpha", "0.0", "> 0"]),
        ({"partitioning": "dirichlet", "alpha": -1.0}, ["dirichlet-alpha", "-1.0", "> 0"]),
        ({"num_partitions": 0}, ["num-partitions", "0"]),
        ({"num_partitions": 1001}, ["num-partitions", "1001", "1000"]),
        ({"min_partition_size": -1}, ["min-partition-size", "-1"]),
    ],
)
def test_partition_indices_rejects_bad_arguments(kwargs: dict, fragments: list[str]) -> None:
    arguments = {"num_partitions": 10} | kwargs
    with pytest.raises(ValueError) as info:
        partition_indices(SORTED_LABELS, **arguments)
    assert all(fragment in str(info.value) for fragment in fragments)


# --- load_partition ---------------------------------------------------------


# "natural" needs users (LEAF data): tests/unit/test_leaf.py.
@pytest.mark.parametrize("partitioning", [p for p in PARTITIONINGS if p != "natural"])
def test_load_partition_splits_the_digits_training_set(partitioning: str) -> None:
    train = load_split("digits", "train")
    parts = [
        load_partition("digits", i, 5, partitioning=partitioning, min_partition_size=10)
        for i in range(5)
    ]
    assert all(isinstance(p, Subset) and p.dataset is train for p in parts)
    _assert_disjoint_cover([np.asarray(p.indices) for p in parts], len(train))
    assert all(len(p) >= 10 for p in parts)
    # The partition's labels are those of its samples.
    part = parts[2]
    np.testing.assert_array_equal(part.targets, train.targets[part.indices])
    assert part[0][1] == part.targets[0]


def test_load_partition_is_cached_and_read_only() -> None:
    first = load_partition("digits", 1, 3, partitioning="dirichlet", seed=2)
    again = load_partition("digits", 1, 3, partitioning="dirichlet", seed=2)
    assert again.indices is first.indices
    with pytest.raises(ValueError):
        first.indices[0] = 0


@pytest.mark.parametrize("partition_id", [-1, 3])
def test_load_partition_rejects_bad_partition_id(partition_id: int) -> None:
    with pytest.raises(ValueError, match="partition-id"):
        load_partition("digits", partition_id, 3)


_PARTITIONS_SCRIPT = """
import json, sys
from fedx.data import load_partition
print(json.dumps([
    [load_partition("digits", i, 4, partitioning=p, alpha=0.3, seed=7).indices.tolist()
     for i in range(4)]
    for p in ("iid", "dirichlet")
]))
"""


def test_partitions_are_the_same_in_another_process() -> None:
    # A SuperNode computes its partition in its own process: it must agree
    # with every other process (different hash seed included). Without the
    # disk cache, so that the other process computes them.
    environment = os.environ | {"PYTHONHASHSEED": "12345", CACHE_ENV: ""}
    output = subprocess.run(
        [sys.executable, "-c", _PARTITIONS_SCRIPT],
        capture_output=True,
        text=True,
        check=True,
        env=environment,
    ).stdout
    here = [
        [
            load_partition("digits", i, 4, partitioning=p, alpha=0.3, seed=7).indices.tolist()
            for i in range(4)
        ]
        for p in ("iid", "dirichlet")
    ]
    assert json.loads(output.strip().splitlines()[-1]) == here


# --- CIFAR from generated files in torchvision's on-disk format ------------


def _pickle(path: Path, content: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as file:
        pickle.dump(content, file)


def _images(labels: list[int], rng: np.random.Generator) -> np.ndarray:
    """Rows of 3072 bytes (R plane, G plane, B plane) of one random colour each."""
    colours = rng.integers(1, 256, size=(len(labels), 3), dtype=np.uint8)
    return np.repeat(colours, 1024, axis=1)


def _write_cifar10(root: Path, per_batch: int = 4, num_test: int = 6) -> dict[str, list[int]]:
    """Write a tiny CIFAR-10 in ``root``; return the labels of both splits."""
    rng = np.random.default_rng(0)
    folder = root / "cifar-10-batches-py"
    labels: dict[str, list[int]] = {"train": [], "test": []}
    for name, count, split in [(f"data_batch_{i}", per_batch, "train") for i in range(1, 6)] + [
        ("test_batch", num_test, "test")
    ]:
        batch_labels = rng.integers(0, 10, size=count).tolist()
        _pickle(folder / name, {"data": _images(batch_labels, rng), "labels": batch_labels})
        labels[split] += batch_labels
    _pickle(folder / "batches.meta", {"label_names": [f"class{i}" for i in range(10)]})
    return labels


def _write_cifar100(root: Path, num_train: int = 12, num_test: int = 5) -> dict[str, list[int]]:
    rng = np.random.default_rng(1)
    folder = root / "cifar-100-python"
    labels: dict[str, list[int]] = {}
    for split, count in (("train", num_train), ("test", num_test)):
        fine = rng.integers(0, 100, size=count).tolist()
        fine[0] = 99  # the largest label occurs
        coarse = [label // 5 for label in fine]
        _pickle(
            folder / split,
            {"data": _images(fine, rng), "fine_labels": fine, "coarse_labels": coarse},
        )
        labels[split] = fine
    _pickle(folder / "meta", {"fine_label_names": [f"fine{i}" for i in range(100)]})
    return labels


def _load_written(tmp_path: Path, monkeypatch, name: str):
    """Write a small CIFAR in torchvision's format; load both splits; their labels are the ones written."""
    write, dataset, folder = {
        "cifar10": (_write_cifar10, CIFAR10, "cifar-10-batches-py"),
        "cifar100": (_write_cifar100, CIFAR100, "cifar-100-python"),
    }[name]
    labels = write(tmp_path)
    expect_generated_checksums(monkeypatch, dataset, tmp_path / folder)
    train, test = (load_split(name, split, root=str(tmp_path)) for split in ("train", "test"))
    assert list(train.targets) == labels["train"] and list(test.targets) == labels["test"]
    return labels, train, test


def test_cifar10_loads_from_torchvision_files(tmp_path: Path, monkeypatch) -> None:
    labels, train, test = _load_written(tmp_path, monkeypatch, "cifar10")
    assert len(train) == 20 and len(test) == 6

    mean = torch.tensor(CIFAR10_MEAN).view(3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(3, 1, 1)
    raw = torch.as_tensor(test.data[0]).permute(2, 0, 1).float() / 255
    image, label = test[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert label == labels["test"][0]
    torch.testing.assert_close(image, (raw - mean) / std)

    # Training images are randomly cropped from a zero-padded image: every
    # pixel is the image's colour or the normalised padding.
    raw = torch.as_tensor(train.data[0]).permute(2, 0, 1).float() / 255
    image, _ = train[0]
    assert image.shape == (3, 32, 32)
    colour, padding = (raw[:, 0, 0] - mean[:, 0, 0]) / std[:, 0, 0], -mean[:, 0, 0] / std[:, 0, 0]
    is_colour = torch.isclose(image, colour.view(3, 1, 1), atol=1e-5).all(dim=0)
    is_padding = torch.isclose(image, padding.view(3, 1, 1), atol=1e-5).all(dim=0)
    assert (is_colour | is_padding).all()
    assert is_colour.sum() >= 28 * 28


def test_cifar10_partitions_cover_the_generated_training_set(tmp_path: Path, monkeypatch) -> None:
    _write_cifar10(tmp_path)
    expect_generated_checksums(monkeypatch, CIFAR10, tmp_path / "cifar-10-batches-py")
    parts = [load_partition("cifar10", i, 4, root=str(tmp_path)) for i in range(4)]
    _assert_disjoint_cover([np.asarray(p.indices) for p in parts], 20)
    assert parts[0][0][0].shape == (3, 32, 32)


def test_cifar100_loads_fine_labels(tmp_path: Path, monkeypatch) -> None:
    labels, train, test = _load_written(tmp_path, monkeypatch, "cifar100")
    assert len(train) == 12 and len(test) == 5 and max(train.targets) == 99
    assert len(train.classes) == dataset_info("cifar100").num_classes

    mean = torch.tensor((0.5071, 0.4865, 0.4409)).view(3, 1, 1)
    std = torch.tensor((0.2673, 0.2564, 0.2762)).view(3, 1, 1)
    raw = torch.as_tensor(test.data[1]).permute(2, 0, 1).float() / 255
    image, label = test[1]
    assert image.shape == (3, 32, 32) and label == labels["test"][1]
    torch.testing.assert_close(image, (raw - mean) / std)


@pytest.mark.parametrize(
    ("name", "folder"), [("cifar10", "cifar-10-batches-py"), ("cifar100", "cifar-100-python")]
)
def test_missing_cifar_files_say_where_and_how_to_fetch(
    tmp_path: Path, name: str, folder: str
) -> None:
    with pytest.raises(FileNotFoundError) as info:
        load_split(name, "train", root=str(tmp_path))
    message = str(info.value)
    assert "\n" not in message
    assert str(tmp_path / folder) in message
    assert "download=true" in message


def test_partly_missing_cifar_files_are_named(tmp_path: Path) -> None:
    _write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="lacks data_batch_3;"):
        load_split("cifar10", "test", root=str(tmp_path))
