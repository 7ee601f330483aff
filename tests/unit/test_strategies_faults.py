"""Lost nodes: replies the SuperLink writes for them, leaving them out, taking them back."""

import logging

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message

from fedx.strategies import FedMR, to_arrayrecord
from tests.support.standin_grid import NODE_IDS, StandInGrid, sent_models, trained_reply

pytestmark = pytest.mark.usefixtures("server_task_identity")

SUPERLINK_NODE_ID = 1
NODE_UNAVAILABLE = 5


def unavailable(message: Message) -> Message:
    """What Flower's SuperLink answers for a node that stopped sending heartbeats."""
    reply = Message(
        Error(code=NODE_UNAVAILABLE, reason="Error: Node Unavailable"), reply_to=message
    )
    reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
    return reply


class FlakyGrid(StandInGrid):
    """Nodes in ``dead`` never answer themselves; how the SuperLink answers is up to ``mode``."""

    def __init__(self, node_ids, mode="silent"):
        super().__init__(node_ids, reply=self.answer)
        self.dead: set[int] = set()
        self.mode = mode

    def answer(self, message):
        if message.metadata.dst_node_id not in self.dead:
            return trained_reply(message)
        return unavailable(message) if self.mode == "superlink" else None


def train_round(strategy, grid, server_round, initial):
    messages = list(
        strategy.configure_train(server_round, to_arrayrecord(initial), ConfigRecord(), grid)
    )
    replies = grid.send_and_receive(messages, timeout=1)
    strategy.aggregate_train(server_round, replies)
    return [m.metadata.dst_node_id for m in messages]


@pytest.mark.parametrize("mode", ["silent", "superlink"])
def test_a_lost_node_is_named_its_slot_kept_and_it_is_left_out_next(initial, caplog, mode):
    grid = FlakyGrid(NODE_IDS[:4], mode)
    strategy = FedMR(seed=0, min_available_nodes=1)
    train_round(strategy, grid, 1, initial)
    pool_before = list(strategy.pool)
    victim = NODE_IDS[2]
    grid.dead.add(victim)
    with caplog.at_level(logging.INFO):
        sampled = train_round(strategy, grid, 2, initial)
    assert victim in sampled
    slot = sampled.index(victim)  # all K slots are used: node i has slot i
    if mode == "silent":
        assert (
            f"Round 2: no reply from node {victim} (slot {slot}) within the round timeout"
            in caplog.text
        )
    else:  # the error comes from the SuperLink, yet the log names the lost node
        assert (
            f"Round 2: node {victim} (slot {slot}) is lost: Error: Node Unavailable" in caplog.text
        )
        assert f"node {SUPERLINK_NODE_ID}," not in caplog.text
    assert "ignored a reply" not in caplog.text

    caplog.clear()
    with caplog.at_level(logging.INFO):
        sampled = train_round(strategy, grid, 3, initial)
    assert victim not in sampled and len(sampled) == 3
    assert f"Leaving out node {victim}: no reply in round 2" in caplog.text
    assert len(strategy.pool) == 4 and pool_before  # K stays 4; 3 slots trained


def test_a_node_that_errs_itself_is_alive_and_not_left_out(initial, caplog):
    def crashing_clientapp(message):
        if message.metadata.dst_node_id == NODE_IDS[0]:
            return Message(Error(code=0, reason="ClientApp raised ValueError"), reply_to=message)
        return trained_reply(message)

    grid = StandInGrid(NODE_IDS[:3], reply=crashing_clientapp)
    strategy = FedMR(seed=0, min_available_nodes=1)
    with caplog.at_level(logging.INFO):
        train_round(strategy, grid, 1, initial)
        sampled = train_round(strategy, grid, 2, initial)
    assert f"Round 1: dropped the reply of node {NODE_IDS[0]} (slot " in caplog.text
    assert "the node reported an error: ClientApp raised ValueError" in caplog.text
    assert NODE_IDS[0] in sampled and "Leaving out" not in caplog.text


def test_a_left_out_node_returns_after_the_cooldown_or_once_the_superlink_dropped_it(
    initial, monkeypatch
):
    grid = FlakyGrid(NODE_IDS[:4])
    strategy = FedMR(seed=0, min_available_nodes=1, unresponsive_cooldown=30.0)
    train_round(strategy, grid, 1, initial)
    victim = NODE_IDS[1]
    grid.dead.add(victim)
    train_round(strategy, grid, 2, initial)
    grid.dead.clear()  # it is back, under the same id (a registered SuperNode)
    assert victim not in train_round(strategy, grid, 3, initial)

    clock = strategy._unresponsive[victim][1]  # pylint: disable=protected-access
    monkeypatch.setattr("fedx.strategy_core.multi_model.time.monotonic", lambda: clock + 31.0)
    assert victim in train_round(strategy, grid, 4, initial)

    # Dropped by the SuperLink (heartbeats missed) and back later: used at once.
    monkeypatch.undo()
    grid.dead.add(victim)
    train_round(strategy, grid, 5, initial)
    grid.node_ids.remove(victim)
    grid.dead.clear()
    assert victim not in train_round(strategy, grid, 6, initial)
    grid.node_ids.append(victim)
    assert victim in train_round(strategy, grid, 7, initial)


def test_left_out_nodes_are_used_when_too_few_others_are_connected(initial, caplog):
    grid = FlakyGrid(NODE_IDS[:3])
    strategy = FedMR(seed=0, min_available_nodes=1, min_train_nodes=3)
    train_round(strategy, grid, 1, initial)
    grid.dead.add(NODE_IDS[0])
    train_round(strategy, grid, 2, initial)
    with caplog.at_level(logging.INFO):
        sampled = train_round(strategy, grid, 3, initial)
    assert NODE_IDS[0] in sampled and "Leaving out" not in caplog.text


def test_the_pool_of_a_round_with_a_lost_node_keeps_its_dispatched_model(initial):
    grid = FlakyGrid(NODE_IDS[:3], "superlink")
    strategy = FedMR(seed=0, min_available_nodes=1, grouping="tensor")
    train_round(strategy, grid, 1, initial)
    grid.dead.add(NODE_IDS[1])
    messages = list(strategy.configure_train(2, to_arrayrecord(initial), ConfigRecord(), grid))
    dispatched = sent_models(messages)[NODE_IDS[1]]
    strategy.aggregate_train(2, grid.send_and_receive(messages, timeout=1))
    # Recombination moves layers between slots: the dispatched layers are all still in the pool.
    for name, array in dispatched.items():
        assert any(np.array_equal(model[name], array) for model in strategy.pool), name
