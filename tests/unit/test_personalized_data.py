"""FedMe's data layout: Dirichlet sizes and labels, local splits, the server's unlabeled set."""

import numpy as np
import pytest

from fedx.data import (
    dataset_labels,
    dirichlet_sizes,
    load_local_splits,
    load_split,
    load_unlabeled,
    partition_indices,
    split_local,
    unlabeled_size,
)


def test_dirichlet_sizes_sum_up_respect_the_minimum_and_follow_alpha():
    rng = np.random.default_rng(0)
    sizes = dirichlet_sizes(1000, 20, 10.0, 5, rng)
    assert sizes.sum() == 1000 and sizes.min() >= 5 and sizes.dtype == np.int64
    assert np.array_equal(sizes, dirichlet_sizes(1000, 20, 10.0, 5, np.random.default_rng(0)))
    # Smaller alpha, more unequal sizes (coefficient of variation over many draws).
    spread = {
        alpha: np.mean(
            [
                np.std(s) / np.mean(s)
                for s in (
                    dirichlet_sizes(10_000, 20, alpha, 0, np.random.default_rng(k))
                    for k in range(20)
                )
            ]
        )
        for alpha in (0.5, 10.0, 1000.0)
    }
    assert spread[0.5] > 3 * spread[10.0] > 3 * spread[1000.0]
    # The paper's alpha_size = 10: sizes within a factor of a few of the mean.
    assert spread[10.0] == pytest.approx(np.sqrt((20 - 1) / (20 * 10 + 1)), rel=0.25)
    with pytest.raises(ValueError, match="at least 50 of 999"):
        dirichlet_sizes(999, 20, 10.0, 50, rng)


def test_size_label_dirichlet_partitions_cover_the_data_with_skewed_labels():
    labels = dataset_labels(load_split("digits", "train"))
    settings = {
        "partitioning": "dirichlet-size-label",
        "alpha": 0.1,
        "size_alpha": 10.0,
        "min_partition_size": 10,
        "seed": 3,
    }
    parts = partition_indices(labels, 8, **settings)
    joined = np.concatenate(parts)
    assert len(joined) == len(labels) and len(np.unique(joined)) == len(labels)
    assert sorted(len(p) for p in parts) == sorted(
        dirichlet_sizes(len(labels), 8, 10.0, 10, np.random.default_rng(3)).tolist()
    )

    # alpha_label = 0.1: most of a partition comes from its top two classes;
    # alpha_label = 1000: close to the overall label mix.
    def top_two_share(alpha: float) -> float:
        shares = []
        for part in partition_indices(
            labels, 8, partitioning="dirichlet-size-label", alpha=alpha, seed=3
        ):
            counts = np.sort(np.bincount(labels[part], minlength=10))
            shares.append(counts[-2:].sum() / counts.sum())
        return float(np.mean(shares))

    assert top_two_share(0.1) > 0.6 > 0.3 > top_two_share(1000.0)
    again = partition_indices(labels, 8, **settings)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_split_local_gives_disjoint_non_empty_splits():
    train, validation, test = split_local(100, 0.2, 0.2, np.random.default_rng(0))
    assert (len(train), len(validation), len(test)) == (64, 16, 20)  # the paper's 8:2, then 8:2
    assert sorted(np.concatenate([train, validation, test]).tolist()) == list(range(100))
    assert [len(s) for s in split_local(3, 0.2, 0.2, np.random.default_rng(0))] == [1, 1, 1]
    with pytest.raises(ValueError, match="at least 3 samples"):
        split_local(2, 0.2, 0.2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="local-validation-fraction=1.0"):
        split_local(10, 0.2, 1.0, np.random.default_rng(0))


def test_clients_and_the_unlabeled_set_share_out_the_training_split():
    num_train = len(load_split("digits", "train"))
    unlabeled = load_unlabeled("digits")
    assert unlabeled_size("digits", 0) == len(unlabeled) == 200
    assert unlabeled_size("cifar10", 0) == 1000 and unlabeled_size("digits", 50) == 50
    clients = [load_local_splits("digits", i, 5, alpha=0.5) for i in range(5)]
    used = [np.asarray(unlabeled.indices)]
    for splits in clients:
        parts = [np.asarray(s.indices) for s in (splits.train, splits.validation, splits.test)]
        assert all(len(p) for p in parts)
        used += parts
        # Label skew reaches every split of a client (they are its own data).
        assert np.array_equal(
            splits.train.targets, dataset_labels(load_split("digits", "train"))[parts[0]]
        )
    joined = np.concatenate(used)
    assert len(joined) == num_train and len(np.unique(joined)) == num_train
    # The server's set does not depend on the number of clients; the clients' data does.
    assert np.array_equal(unlabeled.indices, load_unlabeled("digits", seed=0).indices)
    other = load_local_splits("digits", 0, 3, alpha=0.5)
    assert not set(other.test.indices) & set(unlabeled.indices)
    assert not np.array_equal(load_unlabeled("digits", seed=1).indices, unlabeled.indices)
    with pytest.raises(ValueError, match="unlabeled-size=5000"):
        load_unlabeled("digits", size=5000)
