"""Client groups that end, whatever happens, and batched steps that train what ``train()`` trains.

The collector (:mod:`fedx.simulation.groups`): a group's call that raises a
``BaseException``, answers with the wrong number of outcomes, or never
returns (a lost actor) ends every member's wait with an error, within the
group's timeout. The ClientApp's side (:mod:`fedx.client.groups`): a batched
step that fails turns groups off for its model with one WARNING and the
traceback. The batched step (:mod:`fedx.group_training`): non-persistent
buffers are stacked like the others, and a parameter the forward pass does
not use is left alone, as ``train()``'s SGD leaves a parameter without a
gradient.
"""

import copy
import logging
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedx.client import groups as client_groups
from fedx.group_training import ClientRandom, GroupMember, train_group
from fedx.models import build_model
from fedx.simulation.groups import GroupCollector
from fedx.training import train
from tests.support.helpers import DEFAULTS

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CPU = torch.device("cpu")


def stand_in(node: int):
    """What the collector reads of a message: its run, round and type."""
    metadata = SimpleNamespace(run_id=1, group_id="3", message_type="train", dst_node_id=node)
    return SimpleNamespace(metadata=metadata)


def run_members(collector: GroupCollector, run_group, count: int = 4, join: float = 30.0):
    """``count`` members of one round through ``collector``; each one's outcome, or what it raised."""
    outcomes: dict[int, object] = {}

    def run_one(message, context):
        return f"reply {message.metadata.dst_node_id}", context

    def member(node: int) -> None:
        try:
            outcomes[node] = collector.run(stand_in(node), None, node, count, run_group, run_one)
        except Exception as err:  # pylint: disable=broad-exception-caught
            outcomes[node] = err

    threads = [threading.Thread(target=member, args=(node,), daemon=True) for node in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + join
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a member still waits for its group"
    return outcomes


@pytest.mark.parametrize("raised", [KeyboardInterrupt("stop"), SystemExit(3)])
def test_a_base_exception_in_the_groups_call_ends_every_members_wait(raised):
    def run_group(messages, contexts):
        raise raised

    collector = GroupCollector(actors=lambda: 1, workers=lambda: 64, quiet=0.02)
    outcomes = run_members(collector, run_group)
    assert sorted(outcomes) == [0, 1, 2, 3]
    for outcome in outcomes.values():
        assert isinstance(outcome, RuntimeError) and type(raised).__name__ in str(outcome)


def test_an_answer_of_the_wrong_length_is_every_members_error():
    def run_group(messages, contexts):
        return [("only one", contexts[0])]

    collector = GroupCollector(actors=lambda: 1, workers=lambda: 64, quiet=0.02)
    outcomes = run_members(collector, run_group)
    assert len(outcomes) == 4
    for outcome in outcomes.values():
        assert isinstance(outcome, RuntimeError) and "1 outcomes for 4 messages" in str(outcome)


def test_a_call_that_never_returns_ends_every_wait_at_the_groups_timeout():
    release = threading.Event()

    def run_group(messages, contexts):  # a lost actor: nothing ever comes back
        release.wait(60)
        return [("late", c) for c in contexts]

    collector = GroupCollector(actors=lambda: 1, workers=lambda: 64, quiet=0.02, timeout=1.0)
    started = time.monotonic()
    try:
        outcomes = run_members(collector, run_group, join=20.0)
    finally:
        release.set()
    assert time.monotonic() - started < 15
    assert len(outcomes) == 4
    assert all(isinstance(outcome, TimeoutError) for outcome in outcomes.values()), outcomes


def test_a_groups_timeout_is_what_is_left_of_its_messages_time_to_live():
    collector = GroupCollector()
    soon = SimpleNamespace(metadata=SimpleNamespace(created_at=time.time() - 10, ttl=12.0))
    later = SimpleNamespace(metadata=SimpleNamespace(created_at=time.time(), ttl=3600.0))
    members = [SimpleNamespace(message=soon), SimpleNamespace(message=later)]
    left = collector._deadline(members) - time.monotonic()  # pylint: disable=protected-access
    assert 0 < left <= 2.0


# ----------------------------------------------------------------------
# The ClientApp's side: a batched step that fails
# ----------------------------------------------------------------------


def train_message(record: ArrayRecord, node: int) -> Message:
    config = ConfigRecord({"server-round": 3, "proximal-mu": 0.0})
    return Message(
        RecordDict({"arrays": record, "config": config}), dst_node_id=node, message_type="train"
    )


def node_context(node: int) -> Context:
    run_config = {**DEFAULTS, "local-epochs": 1, "batch-size": 16}
    return Context(1, node, {"partition-id": node, "num-partitions": 12}, RecordDict(), run_config)


@pytest.mark.usefixtures("server_task_identity")
def test_a_failed_batched_step_turns_groups_off_for_its_model_with_one_warning(caplog, monkeypatch):
    monkeypatch.setattr(client_groups, "_failed", {}, raising=False)  # a fresh process
    tried = []

    def failing(messages, contexts):
        tried.append(len(messages))
        raise RuntimeError("vmap: no batching rule")

    monkeypatch.setattr(client_groups, "_train_together", failing)
    torch.manual_seed(0)
    record = ArrayRecord(build_model("cnn", (1, 8, 8), 10).state_dict())
    messages = [train_message(record, node) for node in (0, 1, 2)]
    contexts = [node_context(node) for node in (0, 1, 2)]
    alone = []
    with caplog.at_level(logging.INFO, logger="flwr"):
        for _ in range(3):  # three rounds
            outcomes = client_groups.train_messages(
                messages, contexts, lambda m, c: alone.append(m) or "alone"
            )
            assert outcomes == ["alone"] * 3
    assert tried == [3]  # tried once; every later round trains one by one at once
    assert len(alone) == 9
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "batched step of model cnn failed" in warnings[0].getMessage()
    assert warnings[0].exc_info is not None  # the traceback
    assert "vmap: no batching rule" in caplog.text


# ----------------------------------------------------------------------
# The batched step: what train() trains
# ----------------------------------------------------------------------


class Quirky(nn.Module):
    """A model with a non-persistent buffer its forward pass reads and a parameter it never uses."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 5)
        self.head = nn.Linear(5, 3)
        self.spare = nn.Linear(6, 3)  # never called: train() never moves it
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 6), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x * self.scale)))


def test_a_model_with_a_non_persistent_buffer_and_an_unused_parameter_trains_as_alone():
    torch.manual_seed(0)
    model = Quirky()
    start = copy.deepcopy(model.state_dict())
    assert "scale" not in start  # not in what a member receives
    rng = np.random.default_rng(0)
    datasets = []
    for size in (20, 20, 13):
        inputs = torch.from_numpy(rng.normal(size=(size, 6)).astype(np.float32))
        datasets.append(TensorDataset(inputs, torch.from_numpy(rng.integers(0, 3, size))))
    # Weight decay and momentum: what would move a parameter with a zero gradient.
    settings = {
        "epochs": 2,
        "device": CPU,
        "learning_rate": 0.1,
        "momentum": 0.9,
        "weight_decay": 0.01,
    }
    alone = []
    for client, data in enumerate(datasets):
        mine = copy.deepcopy(model)
        torch.manual_seed(100 + client)
        train(mine, DataLoader(data, batch_size=8, shuffle=True), **settings)
        alone.append(mine.state_dict())
    members = []
    for client, data in enumerate(datasets):
        torch.manual_seed(100 + client)
        batches = DataLoader(data, batch_size=8, shuffle=True)
        members.append(GroupMember(start, batches, ClientRandom.capture(CPU)))
    together = train_group(model, members, **settings)
    for client, (expected, mine) in enumerate(zip(alone, together, strict=True)):
        assert list(mine.state) == list(expected)
        for name, tensor in expected.items():
            assert torch.allclose(mine.state[name], tensor, rtol=0, atol=1e-6), (client, name)
        assert torch.equal(mine.state["spare.weight"], start["spare.weight"])  # left alone
        assert not torch.equal(mine.state["body.weight"], start["body.weight"])  # trained
