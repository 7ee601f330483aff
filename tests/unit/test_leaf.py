"""LEAF's FEMNIST and Shakespeare: loaders, user selection, natural partitioning, training.

The tests write small files in LEAF's real format (what ``preprocess.sh ...
-t sample`` leaves in ``data/train`` and ``data/test``) into a temporary
folder and read them through the public loaders.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from torch.utils.data import DataLoader

from fedx import client_app
from fedx.config import ConfigError, RunConfig
from fedx.data import (
    DATASET_NAMES,
    PARTITIONINGS,
    dataset_info,
    decode_text,
    encode_text,
    load_local_splits,
    load_partition,
    load_split,
    partition_indices,
)
from fedx.data.leaf import SHAKESPEARE_LETTERS, select_users
from fedx.models import build_model
from fedx.server.building import build_strategy, check_natural_clients
from fedx.strategies import FedMR
from fedx.training import evaluate, train
from tests.support.helpers import run_config
from tests.support.torch_helpers import CPU

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- writing LEAF files -----------------------------------------------------


def write_leaf_file(folder: Path, file_name: str, users: dict[str, tuple[list, list]]) -> None:
    """One LEAF JSON file, with the empty entry split_data.py leaves for a dropped user."""
    folder.mkdir(parents=True, exist_ok=True)
    user_data = {user: {"x": xs, "y": ys} for user, (xs, ys) in users.items()}
    user_data["dropped_user"] = {"x": [], "y": []}
    content = {
        "users": list(users),
        "num_samples": [len(ys) for _, ys in users.values()],
        "user_data": user_data,
    }
    (folder / file_name).write_text(json.dumps(content))


def femnist_samples(user_seed: int, count: int) -> tuple[list, list]:
    """``count`` images as LEAF stores them (784 values k/255), labels 0..61.

    The class shows in the image: a bright row at ``label % 28`` on a dark
    background, so a CNN can learn it in a few steps.
    """
    rng = np.random.default_rng(user_seed)
    labels = rng.choice([0, 1, 2, 61], size=count)
    images = rng.integers(0, 40, size=(count, 28, 28))
    images[np.arange(count), labels % 28, :] = 255
    return (images.reshape(count, -1) / 255).tolist(), labels.tolist()


# Text that uses every letter of LEAF's alphabet.
_TEXT = (SHAKESPEARE_LETTERS + " To be, or not to be: that is the question.\n") * 6


def shakespeare_samples(offset: int, count: int) -> tuple[list, list]:
    """``count`` LEAF samples: 80 characters of text and the character after them."""
    xs = [_TEXT[offset + i : offset + i + 80] for i in range(count)]
    ys = [_TEXT[offset + i + 80] for i in range(count)]
    return xs, ys


# Samples per user (train, test). With leaf-min-samples = 4 (more than 4 in
# all) a, c and d are eligible; b has exactly 4 and e has no training sample.
COUNTS = {"f_a": (6, 2), "f_b": (3, 1), "f_c": (5, 0), "f_d": (4, 1), "f_e": (0, 7)}


def write_femnist(root: Path, counts: dict[str, tuple[int, int]] = COUNTS) -> dict:
    """FEMNIST in two train and two test files; returns every user's (train, test) samples."""
    samples = {}
    for i, (user, (n_train, n_test)) in enumerate(counts.items()):
        xs, ys = femnist_samples(i, n_train + n_test)
        samples[user] = ((xs[:n_train], ys[:n_train]), (xs[n_train:], ys[n_train:]))
    users = list(counts)
    for split, part in (("train", 0), ("test", 1)):
        folder = root / "femnist" / "data" / split
        for j, chunk in enumerate((users[:2], users[2:])):
            kept = {u: samples[u][part] for u in chunk if samples[u][part][1] or split == "test"}
            write_leaf_file(folder, f"all_data_{j}_niid_1_keep_4_{split}_9.json", kept)
    return samples


def write_shakespeare(root: Path, counts: dict[str, tuple[int, int]]) -> dict:
    samples, offset = {}, 0
    for user, (n_train, n_test) in counts.items():
        xs, ys = shakespeare_samples(offset, n_train + n_test)
        offset += 7
        samples[user] = ((xs[:n_train], ys[:n_train]), (xs[n_train:], ys[n_train:]))
    for split, part in (("train", 0), ("test", 1)):
        write_leaf_file(
            root / "shakespeare" / "data" / split,
            f"all_data_niid_2_keep_0_{split}_8.json",
            {u: samples[u][part] for u in counts},
        )
    return samples


# --- dataset info, encoding -------------------------------------------------


def test_leaf_datasets_are_registered():
    assert {"femnist", "shakespeare"} <= set(DATASET_NAMES)
    assert "natural" in PARTITIONINGS
    assert dataset_info("femnist").input_shape == (1, 28, 28)
    assert dataset_info("femnist").num_classes == 62
    assert dataset_info("shakespeare").input_shape == (80,)
    assert dataset_info("shakespeare").num_classes == 80


def test_shakespeare_alphabet_round_trips():
    assert len(SHAKESPEARE_LETTERS) == 80 == len(set(SHAKESPEARE_LETTERS))
    tokens = encode_text(SHAKESPEARE_LETTERS)
    np.testing.assert_array_equal(tokens, np.arange(80))
    assert tokens.dtype == np.int64
    line = "ROMEO. But soft! what light through yonder window breaks?\n"
    assert decode_text(encode_text(line)) == line
    assert encode_text("\n A]a}").tolist() == [0, 1, 25, 52, 53, 79]


@pytest.mark.parametrize("text", ["naïve", "tilde ~", "tab\there"])
def test_characters_outside_the_alphabet_are_errors(text):
    with pytest.raises(ValueError, match="not in LEAF's Shakespeare alphabet"):
        encode_text(text)


# --- user selection ---------------------------------------------------------


def test_selection_keeps_users_with_more_than_min_samples():
    train = {"c": 5, "a": 6, "b": 3, "d": 4, "e": 0}
    test = {"a": 2, "b": 1, "c": 0, "d": 1, "e": 7}
    # Totals a 8, b 4, c 5, d 5, e 7 (but no training sample).
    assert select_users(train, test, 0, 4, seed=0) == ("a", "c", "d")
    assert select_users(train, test, 0, 5, seed=0) == ("a",)
    assert select_users(train, test, 0, 0, seed=0) == ("a", "b", "c", "d")
    with pytest.raises(
        ValueError,
        match="leaf-users=4 but only 3 of the 5 users have more than leaf-min-samples=4 samples",
    ):
        select_users(train, test, 4, 4, seed=0)
    with pytest.raises(ValueError, match="no user has more than leaf-min-samples=8"):
        select_users(train, test, 0, 8, seed=0)


def test_selection_is_a_seeded_sample_in_id_order():
    train = {f"w{i:03d}": 10 + i for i in range(40)}
    test = {}
    first = select_users(train, test, 12, 20, seed=3)
    assert len(first) == 12 and list(first) == sorted(first)
    assert all(train[user] > 20 for user in first)
    assert select_users(dict(reversed(train.items())), test, 12, 20, seed=3) == first
    assert select_users(train, test, 12, 20, seed=4) != first
    # Asking for every eligible user takes them all, whatever the seed.
    assert select_users(train, test, 29, 20, seed=9) == tuple(f"w{i:03d}" for i in range(11, 40))


# --- FEMNIST ----------------------------------------------------------------


def test_femnist_users_become_natural_partitions(tmp_path):
    samples = write_femnist(tmp_path)
    settings = {"root": str(tmp_path), "leaf_min_samples": 4}
    train = load_split("femnist", "train", **settings)
    assert train.users == ("f_a", "f_c", "f_d")
    assert len(train) == 6 + 5 + 4
    image, label = train[0]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    assert 0.0 <= float(train.data.min()) and float(train.data.max()) == 1.0
    assert isinstance(label, int) and set(train.targets) <= {0, 1, 2, 61}

    for partition_id, user in enumerate(train.users):
        part = load_partition("femnist", partition_id, 3, partitioning="natural", **settings)
        (xs, ys), _ = samples[user]
        assert len(part) == len(ys)
        np.testing.assert_array_equal(part.targets, ys)
        images = torch.stack([part[i][0] for i in range(len(part))]).numpy()
        np.testing.assert_allclose(images.reshape(len(ys), -1), np.asarray(xs), atol=1e-7)

    # The central test set: the selected users' test samples, and only theirs.
    test = load_split("femnist", "test", **settings)
    assert test.users == train.users
    assert len(test) == 2 + 0 + 1
    np.testing.assert_array_equal(test.targets, samples["f_a"][1][1] + samples["f_d"][1][1])


def test_leaf_users_draws_a_seeded_subset(tmp_path):
    write_femnist(tmp_path)
    chosen = {
        seed: load_split(
            "femnist", "train", root=str(tmp_path), leaf_users=2, leaf_min_samples=4, seed=seed
        ).users
        for seed in range(6)
    }
    assert all(len(users) == 2 and set(users) <= {"f_a", "f_c", "f_d"} for users in chosen.values())
    assert len(set(chosen.values())) > 1  # the seed decides which two
    again = load_split(
        "femnist", "train", root=str(tmp_path), leaf_users=2, leaf_min_samples=4, seed=5
    )
    assert again.users == chosen[5]


def test_natural_partitioning_needs_one_node_per_user(tmp_path):
    write_femnist(tmp_path)
    with pytest.raises(ValueError) as error:
        load_partition(
            "femnist", 0, 100, partitioning="natural", root=str(tmp_path), leaf_min_samples=4
        )
    message = str(error.value)
    assert "3 users are selected but num-partitions=100" in message
    assert "num-supernodes=3" in message and "leaf-users=100" in message


def test_natural_partitioning_needs_a_leaf_dataset():
    with pytest.raises(ValueError, match="needs a LEAF dataset .*dataset='digits' has no users"):
        load_partition("digits", 0, 4, partitioning="natural")
    with pytest.raises(ValueError, match="needs data whose samples belong to users"):
        partition_indices(np.zeros(10), 2, partitioning="natural")
    with pytest.raises(ValueError, match="the data has 3 users but num-partitions=2"):
        partition_indices(np.zeros(6), 2, partitioning="natural", groups=[0, 0, 1, 1, 2, 2])


def test_iid_and_dirichlet_pool_the_selected_users(tmp_path):
    write_femnist(tmp_path)
    settings = {"root": str(tmp_path), "leaf_min_samples": 4}
    for partitioning in ("iid", "dirichlet"):
        parts = [
            load_partition("femnist", i, 3, partitioning=partitioning, alpha=1.0, **settings)
            for i in range(3)
        ]
        positions = np.sort(np.concatenate([p.indices for p in parts]))
        np.testing.assert_array_equal(positions, np.arange(15))


def test_personalized_layout_follows_the_users(tmp_path):
    write_femnist(tmp_path, {"w1": (9, 1), "w2": (12, 2)})
    for partition_id, size in enumerate((9, 12)):
        splits = load_local_splits(
            "femnist", partition_id, 2, root=str(tmp_path), partitioning="natural", unlabeled=1
        )
        local = [len(splits.train), len(splits.validation), len(splits.test)]
        assert min(local) >= 1 and size - 1 <= sum(local) <= size
        user = load_split("femnist", "train", root=str(tmp_path)).user_index
        for part in (splits.train, splits.validation, splits.test):
            assert set(user[part.indices]) == {partition_id}


# --- errors -----------------------------------------------------------------


def test_missing_files_name_the_path_and_leaf_command(tmp_path):
    for name, command in (
        ("femnist", "./preprocess.sh -s niid --sf 0.1 -k 100 -t sample"),
        ("shakespeare", "./preprocess.sh -s niid --sf 0.3 -k 100 -t sample --tf 0.8"),
    ):
        # download=true changes nothing: LEAF data is never fetched.
        with pytest.raises(FileNotFoundError) as error:
            load_split(name, "train", root=str(tmp_path), download=True)
        message = str(error.value)
        assert str(tmp_path / name / "data" / "train") in message
        assert f"cd leaf/data/{name} && {command}" in message
        assert not (tmp_path / name).exists()


def test_a_user_split_without_shared_test_users_is_an_error(tmp_path):
    xs, ys = femnist_samples(0, 5)
    write_leaf_file(tmp_path / "femnist" / "data" / "train", "a_train.json", {"u1": (xs, ys)})
    write_leaf_file(tmp_path / "femnist" / "data" / "test", "a_test.json", {"u2": (xs, ys)})
    with pytest.raises(
        ValueError, match="have no samples in .*test: preprocess with LEAF's -t sample"
    ):
        load_split("femnist", "test", root=str(tmp_path))


@pytest.mark.parametrize(
    ("users", "problem"),
    [
        ({"u": ([[0.5] * 783], [3])}, "expected 1 images of 784 values"),
        ({"u": ([[0.5] * 784], [62])}, "labels must be in"),
        ({"u": ([[0.5] * 784], [1, 2])}, "has 1 inputs but 2 labels"),
    ],
)
def test_malformed_files_name_the_file(tmp_path, users, problem):
    write_leaf_file(tmp_path / "femnist" / "data" / "train", "bad.json", users)
    write_leaf_file(tmp_path / "femnist" / "data" / "test", "bad.json", users)
    with pytest.raises(ValueError, match=f"bad.json is not a valid LEAF femnist file: .*{problem}"):
        load_split("femnist", "train", root=str(tmp_path))


# --- Shakespeare ------------------------------------------------------------


def test_shakespeare_tokens_and_labels(tmp_path):
    samples = write_shakespeare(tmp_path, {"ROLE_B": (7, 2), "ROLE_A": (5, 1)})
    train = load_split("shakespeare", "train", root=str(tmp_path))
    assert train.users == ("ROLE_A", "ROLE_B")
    tokens, label = train[0]
    assert tokens.shape == (80,) and tokens.dtype == torch.int64
    assert 0 <= int(tokens.min()) and int(tokens.max()) < 80 and 0 <= label < 80
    (xs, ys), _ = samples["ROLE_A"]
    assert decode_text(tokens.tolist()) == xs[0]
    assert SHAKESPEARE_LETTERS[label] == ys[0]
    part = load_partition("shakespeare", 1, 2, partitioning="natural", root=str(tmp_path))
    assert len(part) == 7
    assert [SHAKESPEARE_LETTERS[c] for c in part.targets] == samples["ROLE_B"][0][1]
    assert len(load_split("shakespeare", "test", root=str(tmp_path))) == 3


def test_shakespeare_lines_must_have_80_characters(tmp_path):
    users = {"R": (["short line"], ["x"])}
    for split in ("train", "test"):
        write_leaf_file(tmp_path / "shakespeare" / "data" / split, "s.json", users)
    with pytest.raises(ValueError, match="expected strings of 80 characters, got 'short line'"):
        load_split("shakespeare", "train", root=str(tmp_path))


# --- training on a loaded partition -----------------------------------------


def _parameters(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


@pytest.mark.parametrize(
    ("name", "model_name", "learning_rate"),
    [("femnist", "cnn", 0.05), ("shakespeare", "lstm", 0.5)],
)
def test_one_local_training_lowers_the_loss(tmp_path, name, model_name, learning_rate):
    if name == "femnist":
        write_femnist(tmp_path, {"w1": (40, 4), "w2": (30, 3)})
    else:
        write_shakespeare(tmp_path, {"R1": (40, 4), "R2": (30, 3)})
    part = load_partition(name, 0, 2, partitioning="natural", root=str(tmp_path))
    info = dataset_info(name)
    torch.manual_seed(0)
    model = build_model(model_name, info.input_shape, info.num_classes)
    loader = DataLoader(
        part, batch_size=10, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    inputs, _ = next(iter(loader))
    assert inputs.dtype == (torch.int64 if name == "shakespeare" else torch.float32)

    before = _parameters(model)
    loss_before, _ = evaluate(model, DataLoader(part, batch_size=64), device=CPU)
    first = train(model, loader, epochs=1, learning_rate=learning_rate, device=CPU)
    last = train(model, loader, epochs=3, learning_rate=learning_rate, device=CPU)
    loss_after, accuracy = evaluate(model, DataLoader(part, batch_size=64), device=CPU)

    assert not torch.equal(before, _parameters(model))
    assert loss_before == pytest.approx(np.log(info.num_classes), rel=0.3)  # about uniform
    assert last < first and loss_after < loss_before
    assert 0.0 <= accuracy <= 1.0


# --- the app: run config, ClientApp, ServerApp checks -----------------------


def test_the_client_app_trains_on_its_writer(tmp_path, server_task_identity):
    samples = write_femnist(tmp_path)
    config = run_config(
        dataset="femnist",
        model="cnn",
        partitioning="natural",
        **{"data-root": str(tmp_path), "leaf-min-samples": 4, "local-epochs": 1},
    )
    info = dataset_info("femnist")
    torch.manual_seed(0)
    initial = build_model("cnn", info.input_shape, info.num_classes).state_dict()
    content = RecordDict(
        {
            "arrays": ArrayRecord(initial),
            "config": ConfigRecord(
                {
                    "server-round": 1,
                    "learning-rate": 0.05,
                    "momentum": 0.0,
                    "weight-decay": 0.0,
                    "batch-size": 4,
                    "local-epochs": 1,
                }
            ),
        }
    )
    context = Context(1, 7, {"partition-id": 1, "num-partitions": 3}, RecordDict(), config)
    reply = client_app.train_model(Message(content, dst_node_id=7, message_type="train"), context)
    assert reply.content["metrics"]["num-examples"] == len(samples["f_c"][0][1])  # user 1: f_c
    trained = reply.content["arrays"].to_torch_state_dict()
    assert list(trained) == list(initial)
    assert not torch.equal(trained["classifier.2.weight"], initial["classifier.2.weight"])


def test_data_and_model_keys_that_do_not_fit_are_config_errors():
    cases = [
        (
            {"partitioning": "natural", "dataset": "cifar10"},
            "invalid run config partitioning='natural': it makes every user of a LEAF dataset",
        ),
        (
            {"model": "lstm", "dataset": "cifar10"},
            "invalid run config model='lstm' for dataset='cifar10': model lstm reads token sequences",
        ),
        (
            {"model": "cnn", "dataset": "shakespeare"},
            "invalid run config model='cnn' for dataset='shakespeare': model cnn reads images",
        ),
        (
            {"model": "vgg16", "dataset": "femnist"},
            "invalid run config model='vgg16' for dataset='femnist': vgg16 needs inputs of at least",
        ),
    ]
    for overrides, message in cases:
        cfg = RunConfig.from_mapping(run_config(**overrides))
        with pytest.raises(ConfigError) as error:
            build_strategy(cfg)
        assert str(error.value).startswith(message)
    cfg = RunConfig.from_mapping(
        run_config(model="lstm", dataset="shakespeare", partitioning="natural")
    )
    assert isinstance(build_strategy(cfg), FedMR)


def test_the_server_checks_the_node_count_of_natural_partitioning(tmp_path):
    write_femnist(tmp_path)
    cfg = RunConfig.from_mapping(
        run_config(
            dataset="femnist",
            partitioning="natural",
            **{"data-root": str(tmp_path), "leaf-min-samples": 4},
        )
    )
    check_natural_clients(cfg, 3)
    with pytest.raises(
        ConfigError,
        match="each of the 3 selected femnist users .* one client, but "
        "100 nodes are connected: run 3 SuperNodes",
    ):
        check_natural_clients(cfg, 100)
    check_natural_clients(cfg, 2)  # a deployment may run some clients only: logged
    missing = RunConfig.from_mapping({**cfg.to_dict(), "data-root": str(tmp_path / "none")})
    with pytest.raises(ConfigError, match="FEMNIST not found: no .json files in"):
        check_natural_clients(missing, 3)
    check_natural_clients(RunConfig.from_mapping(run_config()), 1000)  # not natural: no check
