"""What a ClientApp process reuses between messages: model skeletons and gathered batches.

A reused skeleton must give the reply a fresh one gives, bit for bit, and
the caches must stay within their bounds. The runs ask for deterministic
kernels: on a GPU, training the same model twice gives the same bits only
with them (on a CPU always).
"""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from torch import nn
from torch.utils.data import DataLoader, Subset

from fedx import client_app
from fedx.client import skeletons
from fedx.client.skeletons import ModelCache
from fedx.data import batch_gatherer, batch_loader, load_partition, load_split
from fedx.models import build_model
from tests.support.helpers import DEFAULTS

pytestmark = pytest.mark.usefixtures("server_task_identity", "one_torch_thread")
NODE = 7


@pytest.fixture
def cache(monkeypatch) -> ModelCache:
    """An empty skeleton cache in place of the process's."""
    fresh = ModelCache()
    monkeypatch.setattr(skeletons, "SKELETONS", fresh)
    monkeypatch.setattr("fedx.client.task.SKELETONS", fresh)
    return fresh


def initial_record(architecture: str) -> ArrayRecord:
    torch.manual_seed(0)
    return ArrayRecord(build_model(architecture, (1, 8, 8), 10).state_dict())


def train_message(record: ArrayRecord, server_round: int = 3) -> Message:
    content = RecordDict({"arrays": record, "config": ConfigRecord({"server-round": server_round})})
    return Message(content, dst_node_id=NODE, message_type="train")


def context(**config) -> Context:
    run_config = {**DEFAULTS, "local-epochs": 1, "deterministic": True, **config}
    return Context(1, NODE, {"partition-id": 1, "num-partitions": 10}, RecordDict(), run_config)


def reply_arrays(reply: Message) -> dict[str, np.ndarray]:
    assert not reply.has_error(), reply.error if reply.has_error() else ""
    return {name: array.numpy() for name, array in reply.content["arrays"].items()}


def assert_same_reply(first: Message, second: Message) -> None:
    one, other = reply_arrays(first), reply_arrays(second)
    assert list(one) == list(other)
    for name in one:
        assert one[name].dtype == other[name].dtype
        assert np.array_equal(one[name], other[name]), name  # bit for bit
    assert dict(first.content["metrics"]) == dict(second.content["metrics"])


@pytest.mark.parametrize("architecture", ["cnn", "resnet20"])
def test_a_reused_skeleton_gives_the_reply_of_a_fresh_one(cache, architecture):
    """ResNet-20 has BatchNorm: its running statistics come from the message, not the last call."""
    ctx = context(model=architecture)
    record = initial_record(architecture)
    fresh = client_app.train_model(train_message(record), ctx)
    assert (cache.built, cache.reused, len(cache)) == (1, 0, 1)
    # The next call gets the module the first one trained (weights, BatchNorm
    # statistics, gradients, mode all changed); another round's message runs on it in between.
    client_app.train_model(train_message(fresh.content["arrays"], 4), ctx)
    torch.manual_seed(1234)  # whatever the generator held before, the call seeds its own
    reused = client_app.train_model(train_message(record), ctx)
    assert (cache.built, cache.reused, len(cache)) == (1, 2, 1)
    assert_same_reply(fresh, reused)
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(reply_arrays(fresh).values(), record.to_numpy_ndarrays(), strict=True)
    )  # it trained


def test_a_skeleton_left_in_any_state_is_reset_before_it_is_lent_again(cache):
    ctx = context(model="resnet20")
    record = initial_record("resnet20")
    expected = client_app.train_model(train_message(record), ctx)
    model = cache.borrow("resnet20", (1, 8, 8), 10)
    assert len(cache) == 0  # lent out: no second call can get it meanwhile
    model.eval()
    for parameter in model.parameters():
        parameter.grad = torch.ones_like(parameter)
        parameter.requires_grad_(False)
    for buffer in model.buffers():
        buffer.add_(3)
    cache.give_back(model, "resnet20", (1, 8, 8), 10)
    assert_same_reply(expected, client_app.train_model(train_message(record), ctx))
    assert cache.built == 1


def test_building_a_skeleton_draws_nothing_from_the_calls_generator(cache):
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    cache.borrow("cnn", (1, 8, 8), 10)
    assert torch.equal(torch.rand(3), expected)


def test_two_models_of_one_architecture_in_one_call_are_two_modules(cache):
    first = cache.borrow("cnn-2", (1, 8, 8), 10)
    second = cache.borrow("cnn-2", (1, 8, 8), 10)
    assert first is not second and cache.built == 2
    cache.give_back(first, "cnn-2", (1, 8, 8), 10)
    cache.give_back(second, "cnn-2", (1, 8, 8), 10)
    assert len(cache) == 1  # one idle module per architecture
    assert cache.borrow("cnn-2", (1, 8, 8), 10) is second


def test_the_cache_keeps_at_most_max_models_the_least_recently_used_go(cache):
    names = ["cnn-1", "cnn-2", "cnn-3", "cnn-4", "cnn", "lstm"]
    shapes = {"lstm": (80,)}
    lent = {name: cache.borrow(name, shapes.get(name, (1, 8, 8)), 10) for name in names}
    for parameter in lent["lstm"].parameters():
        parameter.grad = torch.ones_like(parameter)
    for name in names:
        cache.give_back(lent[name], name, shapes.get(name, (1, 8, 8)), 10)
    assert len(cache) == cache.max_models == 4
    assert cache.borrow("cnn-2", (1, 8, 8), 10) is not lent["cnn-2"]  # evicted, built again
    assert cache.borrow("lstm", (80,), 10) is lent["lstm"]
    assert all(p.grad is None for p in lent["lstm"].parameters())  # idle modules hold weights only
    # The shape and the classes are part of the key.
    assert cache.borrow("cnn", (1, 8, 8), 62) is not lent["cnn"]
    assert cache.borrow("cnn", (1, 8, 8), 10) is lent["cnn"]


def test_a_module_that_could_carry_state_over_is_never_kept(cache):
    model = cache.borrow("cnn", (1, 8, 8), 10)
    model.register_buffer("scratch", torch.zeros(3), persistent=False)  # not in its state dict
    cache.give_back(model, "cnn", (1, 8, 8), 10)
    assert len(cache) == 0
    cache.give_back(nn.Linear(2, 2), "cnn", (1, 8, 8), 10)  # not lent by this cache
    assert len(cache) == 0
    none_kept = ModelCache(max_models=0)
    none_kept.give_back(none_kept.borrow("cnn", (1, 8, 8), 10), "cnn", (1, 8, 8), 10)
    assert len(none_kept) == 0
    with pytest.raises(ValueError, match="max_models"):
        ModelCache(max_models=-1)


def test_a_call_that_fails_gives_its_module_back_to_nobody(cache):
    ctx = context()
    client_app.train_model(train_message(initial_record("cnn")), ctx)
    assert len(cache) == 1
    wrong = initial_record("cnn-1")  # other layers than the run's cnn: load_state_dict refuses
    with pytest.raises(RuntimeError, match="state_dict"):
        client_app.train_model(train_message(wrong), ctx)
    assert len(cache) == 0 and cache.reused == 1


# ----------------------------------------------------------------------
# Gathered batches
# ----------------------------------------------------------------------


def batches(loader: DataLoader, epochs: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [batch for _ in range(epochs) for batch in loader]


@pytest.mark.parametrize("shuffle", [True, False])
def test_gathered_batches_are_the_plain_loaders_bit_for_bit(shuffle):
    partition = load_partition("digits", 2, 5, partitioning="dirichlet", min_partition_size=10)
    loaders = {
        "plain": lambda: DataLoader(partition, batch_size=16, shuffle=shuffle),
        "gathered": lambda: batch_loader(partition, 16, shuffle=shuffle),
    }
    seen, after = {}, {}
    for name, make in loaders.items():
        torch.manual_seed(11)
        seen[name] = batches(make())
        after[name] = torch.rand(2)  # the loaders drew the same numbers from the generator
    assert torch.equal(after["plain"], after["gathered"])
    assert len(seen["plain"]) == len(seen["gathered"]) == 2 * -(-len(partition) // 16)
    for (x1, y1), (x2, y2) in zip(seen["plain"], seen["gathered"], strict=True):
        assert (x1.dtype, y1.dtype, x1.shape) == (x2.dtype, y2.dtype, x2.shape)
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    order = torch.cat([y for _, y in seen["gathered"][: len(seen["gathered"]) // 2]])
    assert sorted(order.tolist()) == sorted(partition.targets.tolist())


def test_a_dataset_that_cannot_gather_gets_a_plain_loader():
    test = load_split("digits", "test")
    assert batch_gatherer(Subset(Subset(test, [5, 6, 7]), [2, 0])) is not None
    plain = Subset([(torch.zeros(2), 0), (torch.ones(2), 1)], [1])
    assert batch_gatherer(plain) is None
    loader = batch_loader(plain, 4)
    assert type(loader.dataset) is Subset
    ((inputs, labels),) = list(loader)
    assert torch.equal(inputs, torch.ones(1, 2)) and labels.tolist() == [1]
