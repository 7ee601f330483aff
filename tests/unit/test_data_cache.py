"""The disk cache of partitions (fedx.data.cache) and the digits read without scikit-learn."""

import logging
import os

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from fedx.data import load_split, load_test_share, partition_indices
from fedx.data.cache import CACHE_ENV, cache_dir, cached_indices, code_identity
from fedx.data.digits import digits_splits, read_digits


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder of the test's own."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder


class Counting:
    """``compute`` for cached_indices that counts its calls."""

    def __init__(self, *arrays: list[int]) -> None:
        self.arrays = [np.array(values) for values in arrays]
        self.calls = 0

    def __call__(self) -> list[np.ndarray]:
        self.calls += 1
        return self.arrays


def entries(folder) -> list:
    return sorted(path for path in folder.rglob("*") if path.is_file())


def test_computed_once_then_read(cache) -> None:
    compute = Counting([3, 1], [], [0, 2, 4])
    first = cached_indices("parts", {"seed": 1}, compute)
    again = cached_indices("parts", {"seed": 1}, compute)
    assert compute.calls == 1
    for got in (first, again):
        assert [part.tolist() for part in got] == [[3, 1], [], [0, 2, 4]]
        assert all(part.dtype == np.int64 and not part.flags.writeable for part in got)
    # One entry, written whole: no temporary file is left beside it.
    (entry,) = entries(cache)
    assert entry.parent.name == "parts" and entry.suffix == ".npz"


def test_any_change_of_the_key_is_another_entry(cache) -> None:
    compute = Counting([0, 1])
    for key in ({"seed": 1}, {"seed": 2}, {"seed": 1, "labels": "abc"}, {"seed": 1.0 + 1e-12}):
        cached_indices("parts", key, compute)
    assert compute.calls == 4
    assert len(entries(cache)) == 4


def test_a_damaged_entry_is_recomputed_and_replaced(cache, caplog) -> None:
    compute = Counting([5, 6], [7])
    cached_indices("parts", {"seed": 1}, compute)
    (entry,) = entries(cache)
    entry.write_bytes(entry.read_bytes()[:40])  # cut off, as by a full disk
    with caplog.at_level(logging.WARNING, logger="flwr"):
        parts = cached_indices("parts", {"seed": 1}, compute)
    assert compute.calls == 2
    assert [part.tolist() for part in parts] == [[5, 6], [7]]
    assert "damaged cache entry" in caplog.text
    # Replaced by a good one: read, not computed, next time.
    cached_indices("parts", {"seed": 1}, compute)
    assert compute.calls == 2


def test_a_folder_that_cannot_be_written_costs_only_a_warning(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    compute = Counting([1, 2])
    with caplog.at_level(logging.WARNING, logger="flwr"):
        parts = cached_indices("parts", {"seed": 9}, compute)
    assert [part.tolist() for part in parts] == [[1, 2]]
    assert "cannot write the partition cache" in caplog.text and CACHE_ENV in caplog.text


def test_an_empty_setting_turns_the_disk_cache_off(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(CACHE_ENV, "")
    monkeypatch.chdir(tmp_path)
    assert cache_dir() is None
    compute = Counting([1])
    cached_indices("parts", {"seed": 1}, compute)
    cached_indices("parts", {"seed": 1}, compute)
    assert compute.calls == 2
    assert entries(tmp_path) == []


def test_the_default_folder_is_the_users_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "fedx"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "fedx"
    monkeypatch.setenv(CACHE_ENV, "~/elsewhere")
    assert cache_dir() == tmp_path / "home" / "elsewhere"


@pytest.mark.parametrize(
    ("partitioning", "groups"),
    [("iid", False), ("dirichlet", False), ("dirichlet-size-label", False), ("natural", True)],
)
def test_cached_partitions_are_those_computed(cache, monkeypatch, partitioning, groups) -> None:
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 5, size=300)
    arguments = {
        "partitioning": partitioning,
        "alpha": 0.5,
        "min_partition_size": 5,
        "seed": 3,
        "groups": rng.permutation(np.arange(300) % 6) if groups else None,
    }
    written = partition_indices(labels, 6, **arguments)
    read = partition_indices(labels, 6, **arguments)
    monkeypatch.setenv(CACHE_ENV, "")
    computed = partition_indices(labels, 6, **arguments)
    assert len(entries(cache)) == 1
    for parts in (written, read):
        assert [p.tolist() for p in parts] == [p.tolist() for p in computed]
    # Other labels (other data) with the same settings are another entry.
    monkeypatch.setenv(CACHE_ENV, str(cache))
    partition_indices(np.roll(labels, 1), 6, **arguments)
    assert len(entries(cache)) == 2


def test_errors_are_not_cached(cache) -> None:
    labels = np.repeat(np.arange(2), 10)
    for _ in range(2):
        with pytest.raises(ValueError, match="min-partition-size"):
            partition_indices(labels, 4, partitioning="dirichlet", alpha=0.01, min_partition_size=5)
    assert entries(cache) == []


def test_digits_are_read_as_scikit_learn_loads_them(cache) -> None:
    bunch = load_digits()
    for _ in range(2):  # parsed into the empty cache, then read from it
        read_digits.cache_clear()
        pixels, target = read_digits()
        np.testing.assert_array_equal(pixels, bunch.data)
        np.testing.assert_array_equal(target, bunch.target)
        assert (pixels.dtype, target.dtype) == (bunch.data.dtype, bunch.target.dtype)
        assert pixels.flags.writeable and target.flags.writeable
    assert len(entries(cache / "digits")) == 1
    read_digits.cache_clear()


@pytest.mark.parametrize(("seed", "fraction"), [(0, 0.2), (5, 0.35)])
def test_the_digits_split_is_scikit_learns(cache, seed, fraction) -> None:
    """The cached split gives the arrays train_test_split gives, whether computed or read."""
    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[:, np.newaxis]
    train_images, test_images, train_labels, test_labels = train_test_split(
        images, bunch.target, test_size=fraction, random_state=seed, stratify=bunch.target
    )
    for _ in range(2):  # computed into the empty cache, then read from it
        digits_splits.cache_clear()
        train = load_split("digits", "train", seed=seed, test_fraction=fraction)
        test = load_split("digits", "test", seed=seed, test_fraction=fraction)
        np.testing.assert_array_equal(train.data.numpy(), train_images)
        np.testing.assert_array_equal(test.data.numpy(), test_images)
        np.testing.assert_array_equal(train.targets, train_labels)
        np.testing.assert_array_equal(test.targets, test_labels)
    assert len(entries(cache / "digits-split")) == 1


def test_test_shares_split_the_test_set() -> None:
    test = load_split("digits", "test")
    shares = [load_test_share("digits", i, 4) for i in range(4)]
    positions = np.concatenate([share.indices for share in shares])
    assert sorted(positions.tolist()) == list(range(len(test)))
    assert load_test_share("digits", 2, 4).indices is shares[2].indices  # cached per process
    np.testing.assert_array_equal(shares[1].targets, test.targets[shares[1].indices])
    with pytest.raises(ValueError, match="partition-id"):
        load_test_share("digits", 4, 4)


def test_the_tests_never_use_the_users_cache() -> None:
    # conftest.py points the cache at a folder of the session's.
    assert os.environ[CACHE_ENV] and "fedx-cache" in os.environ[CACHE_ENV]


def test_the_code_identity_follows_the_module_and_the_libraries(tmp_path) -> None:
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_text("SPLIT = 1\n")
    second.write_text("SPLIT = 2\n")
    identity = code_identity(str(first), "flwr-datasets")
    assert identity != code_identity(str(second), "flwr-datasets")
    assert identity["numpy"] == np.__version__ and identity["flwr-datasets"] != "absent"
    assert code_identity(str(tmp_path / "gone.py"))["fedx-module"].startswith("fedx ")
