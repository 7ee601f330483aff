"""MultiModelStrategy, FedMR and FedIndep against a stand-in grid of numpy clients."""

import logging

import numpy as np
import pytest
from flwr.app import Array, ConfigRecord, Error, Message, MetricRecord
from flwr.serverapp.strategy import FedAvg

from fedx.strategies import FedIndep, FedMR, to_arrayrecord, to_model
from tests.support.helpers import make_model
from tests.support.standin_grid import (
    NODE_IDS,
    StandInGrid,
    owners_of,
    run_round,
    sent_models,
    trained_reply,
)

pytestmark = pytest.mark.usefixtures("server_task_identity")


def test_node_ids_survive_sampling_exactly(initial):
    grid = StandInGrid(NODE_IDS)
    strategy = FedMR(seed=1, min_available_nodes=1, fraction_train=0.6, min_train_nodes=1)
    messages = list(strategy.configure_train(1, to_arrayrecord(initial), ConfigRecord(), grid))
    destinations = [m.metadata.dst_node_id for m in messages]
    assert len(destinations) == 3
    assert set(destinations) <= set(NODE_IDS)
    assert len(set(destinations)) == 3


def test_sampling_is_reproducible_and_shared_across_methods(initial):
    def destinations(strategy):
        grid = StandInGrid(NODE_IDS)
        rounds = []
        for r in (1, 2, 3):
            messages, _, _ = run_round(strategy, grid, r, initial)
            rounds.append(sorted(m.metadata.dst_node_id for m in messages))
        return rounds

    kwargs = {"fraction_train": 0.6, "min_available_nodes": 1}
    assert destinations(FedMR(seed=4, **kwargs)) == destinations(FedMR(seed=4, **kwargs))
    # The same seed samples the same nodes whatever the method does with its own randomness.
    assert destinations(FedMR(seed=4, **kwargs)) == destinations(FedIndep(seed=4, **kwargs))
    assert destinations(FedMR(seed=4, **kwargs)) != destinations(FedMR(seed=5, **kwargs))


def test_each_node_gets_a_different_recombined_model(initial):
    grid = StandInGrid(NODE_IDS)
    strategy = FedMR(seed=3, min_available_nodes=1)
    first, replies, (global_arrays, metrics) = run_round(strategy, grid, 1, initial)
    # Round 1: every slot starts from the initial model.
    assert all(
        np.array_equal(m[n], initial[n]) for m in sent_models(first).values() for n in initial
    )
    trained = [to_model(r.content["arrays"]) for r in replies]
    second = sent_models(list(strategy.configure_train(2, global_arrays, ConfigRecord(), grid)))
    received = list(second.values())
    assert len(received) == len(NODE_IDS)
    for i in range(len(received)):
        for j in range(i + 1, len(received)):
            assert any(not np.array_equal(received[i][n], received[j][n]) for n in initial)
    # Every uploaded layer went to exactly one node.
    for name in initial:
        sent_layers = sorted(received_model[name].tobytes() for received_model in received)
        uploaded = sorted(model[name].tobytes() for model in trained)
        assert sent_layers == uploaded
    # At least one node got a model made of several clients' layers.
    assert any(len(owners_of(m, trained)) > 1 for m in received)
    # The global model is the plain mean of the trained models.
    expected = np.mean([t["fc1.weight"] for t in trained], axis=0)
    np.testing.assert_allclose(
        to_model(global_arrays)["fc1.weight"], expected, rtol=1e-6, atol=1e-6
    )
    assert metrics["trained-slots"] == len(NODE_IDS)


def test_failed_missing_and_invalid_replies_are_logged_and_dropped(initial, caplog):
    bad = {}

    def reply(message: Message) -> Message | None:
        node = message.metadata.dst_node_id
        if node == NODE_IDS[0]:
            return Message(Error(code=0, reason="client crashed"), reply_to=message)
        if node == NODE_IDS[1]:
            return None  # timed out
        if node in bad:
            return bad[node](message)
        return trained_reply(message)

    def wrong_shape(message):
        reply_message = trained_reply(message)
        record = reply_message.content["arrays"]
        record["fc1.weight"] = Array(np.zeros((2, 2), np.float32))
        return reply_message

    def with_nan(message):
        reply_message = trained_reply(message)
        record = reply_message.content["arrays"]
        weights = record["fc2.bias"].numpy()
        weights[0] = np.nan
        record["fc2.bias"] = Array(weights)
        return reply_message

    def without_weight(message):
        reply_message = trained_reply(message)
        reply_message.content["metrics"] = MetricRecord({"train-loss": 0.1})
        return reply_message

    nodes = NODE_IDS + [77, 78]
    bad.update({NODE_IDS[2]: wrong_shape, NODE_IDS[3]: with_nan, 77: without_weight})
    grid = StandInGrid(nodes, reply)
    strategy = FedMR(seed=0, min_available_nodes=1)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        messages, replies, (global_arrays, metrics) = run_round(strategy, grid, 1, initial)
    log = caplog.text
    assert str(NODE_IDS[0]) in log and "client crashed" in log
    assert str(NODE_IDS[1]) in log and "no reply" in log
    assert str(NODE_IDS[2]) in log and "shape" in log
    assert str(NODE_IDS[3]) in log and "NaN" in log
    assert "77" in log and "num-examples" in log
    # Only the two good replies count: nodes 5 and 78.
    assert metrics["trained-slots"] == 2
    good = [
        to_model(r.content["arrays"])
        for r in replies
        if r.metadata.src_node_id in (NODE_IDS[4], 78)
    ]
    # The global model is the plain mean of the K slot models: the two trained
    # ones and, for the five dropped slots, the model each was sent.
    slot_models = [g["fc1.weight"] for g in good] + [initial["fc1.weight"]] * (len(nodes) - 2)
    expected = np.mean(slot_models, axis=0)
    np.testing.assert_allclose(
        to_model(global_arrays)["fc1.weight"], expected, rtol=1e-6, atol=1e-6
    )
    # The pool still holds K models of the right shapes and dtypes, no NaN.
    assert len(strategy.pool) == len(nodes)
    for model in strategy.pool:
        assert list(model) == list(initial)
        for name, array in model.items():
            assert array.shape == initial[name].shape and array.dtype == initial[name].dtype
            assert np.isfinite(array).all()
    # Dropped slots kept their dispatched (initial) model: 5 copies of each initial layer.
    for name in initial:
        same = sum(np.array_equal(m[name], initial[name]) for m in strategy.pool)
        assert same == len(nodes) - 2


def test_round_with_no_usable_reply_keeps_the_pool(initial):
    grid = StandInGrid(NODE_IDS, reply=lambda m: None)
    strategy = FedMR(seed=0, min_available_nodes=1)
    _, _, (arrays, metrics) = run_round(strategy, grid, 1, initial)
    assert arrays is None and metrics is None
    assert len(strategy.pool) == len(NODE_IDS)
    assert all(m is strategy.pool[0] for m in strategy.pool)


@pytest.mark.parametrize("pool_mean", ["uniform", "weighted"])
def test_first_stage_rounds_behave_as_fedavg(initial, pool_mean):
    # Unequal example counts: the uniform (authors') and weighted means differ.
    examples = {node: 5 + i * 7 for i, node in enumerate(NODE_IDS)}

    def reply(message):
        return trained_reply(message, examples=examples[message.metadata.dst_node_id])

    grid = StandInGrid(NODE_IDS, reply)
    strategy = FedMR(seed=0, first_stage_rounds=2, min_available_nodes=1, pool_mean=pool_mean)
    for server_round in (1, 2):
        messages, replies, _ = run_round(strategy, grid, server_round, initial)
        trained = [to_model(r.content["arrays"]) for r in replies]
        if pool_mean == "weighted":
            expected = to_model(FedAvg().aggregate_train(server_round, replies)[0])
        else:
            expected = {n: np.mean([m[n] for m in trained], axis=0) for n in initial}
        for model in strategy.pool:
            for name, array in model.items():
                if array.dtype.kind == "f":
                    np.testing.assert_allclose(array, expected[name], rtol=1e-5, atol=1e-6)
        sent = sent_models(messages)
        first = next(iter(sent.values()))
        assert all(all(np.array_equal(m[n], first[n]) for n in first) for m in sent.values())
    # Round 3 recombines: nodes get different models again.
    third = sent_models(
        list(strategy.configure_train(3, to_arrayrecord(initial), ConfigRecord(), grid))
    )
    assert all(
        all(np.array_equal(m[n], strategy.pool[0][n]) for n in initial) for m in third.values()
    )
    _, replies, _ = run_round(strategy, grid, 3, initial)
    fourth = list(
        sent_models(
            list(strategy.configure_train(4, to_arrayrecord(initial), ConfigRecord(), grid))
        ).values()
    )
    assert any(not np.array_equal(fourth[0][n], fourth[1][n]) for n in initial)


def test_fedindep_moves_whole_models(initial):
    grid = StandInGrid(NODE_IDS)
    strategy = FedIndep(seed=2, min_available_nodes=1)
    _, replies, _ = run_round(strategy, grid, 1, initial)
    trained = [to_model(r.content["arrays"]) for r in replies]
    owners = [owners_of(model, trained) for model in strategy.pool]
    assert all(len(o) == 1 for o in owners)
    assert sorted(o.pop() for o in owners) == list(range(len(trained)))


def test_fewer_nodes_than_slots_trains_a_subset(initial):
    grid = StandInGrid(NODE_IDS)
    strategy = FedMR(seed=0, min_available_nodes=1, node_wait_timeout=0.1)
    run_round(strategy, grid, 1, initial)
    pool_before = list(strategy.pool)
    grid.node_ids = NODE_IDS[:2]  # three nodes went away
    messages, _, (_, metrics) = run_round(strategy, grid, 2, initial)
    assert len(messages) == 2 and metrics["trained-slots"] == 2
    assert len(strategy.pool) == len(NODE_IDS)
    assert len(pool_before) == len(NODE_IDS)


def test_start_runs_rounds_and_reports_the_mean(initial):
    grid = StandInGrid(NODE_IDS[:4])
    strategy = FedMR(seed=0, min_available_nodes=1, fraction_evaluate=0.0)
    result = strategy.start(grid, to_arrayrecord(initial), num_rounds=3, timeout=5)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    trained_last = [
        to_model(r.content["arrays"]) for r in [trained_reply(m) for m in grid.sent[-2]]
    ]
    expected = np.mean([t["fc2.weight"] for t in trained_last], axis=0)
    np.testing.assert_allclose(to_model(result.arrays)["fc2.weight"], expected, rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"segment_fraction": 0.0}, "segment_fraction"),
        ({"segment_fraction": 1.5}, "segment_fraction"),
        ({"grouping": "block"}, "grouping"),
        ({"first_stage_rounds": -1}, "first_stage_rounds"),
        ({"fraction_train": 0.0}, "fraction_train"),
        ({"num_models": 0}, "num_models"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FedMR(**kwargs)


def test_the_clients_metrics_do_not_depend_on_the_order_their_replies_came_in():
    """A simulation's replies come in any order; the round's metrics add them up by slot."""
    losses = dict(zip(NODE_IDS, [1e8, 0.1, -1e8, 0.3, 0.7], strict=True))  # sums that see order

    def reply(message):
        answer = trained_reply(message)
        answer.content["metrics"]["train-loss"] = losses[message.metadata.dst_node_id]
        return answer

    class ReversedGrid(StandInGrid):
        def send_and_receive(self, messages, *, timeout=None):
            return list(reversed(super().send_and_receive(messages, timeout=timeout)))

    metrics = []
    for grid in (StandInGrid(NODE_IDS, reply), ReversedGrid(NODE_IDS, reply)):
        strategy = FedMR(seed=3, min_available_nodes=1)
        _, _, (_, round_metrics) = run_round(
            strategy, grid, 1, make_model(np.random.default_rng(0))
        )
        metrics.append(round_metrics["train-loss"])
    assert metrics[0] == metrics[1]  # bit for bit
