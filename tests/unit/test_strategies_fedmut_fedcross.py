"""FedMut and FedCross rounds against the stand-in grid: what nodes get, what the pool becomes."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from fedx.ops import average, cosine_similarity_matrix
from fedx.strategies import FedCross, FedIndep, FedMR, FedMut, to_arrayrecord, to_model
from tests.support.helpers import make_model
from tests.support.standin_grid import NODE_IDS, StandInGrid, run_round, sent_models, trained_reply

pytestmark = pytest.mark.usefixtures("server_task_identity")


def _float_names(model):
    return [n for n, a in model.items() if a.dtype.kind == "f"]


def trained_by_slot(strategy, grid, server_round, initial):
    """Send a round and collect it: the replies, and the trained models by pool slot."""
    strategy.configure_train(server_round, to_arrayrecord(initial), ConfigRecord(), grid)
    in_flight = strategy.training.sent
    replies = grid.send_and_receive(in_flight.messages)
    trained = [None] * len(in_flight.targets)
    for reply in replies:
        trained[in_flight.targets[reply.metadata.src_node_id]] = to_model(reply.content["arrays"])
    return replies, trained


def test_fedmut_round_one_sends_the_initial_model_then_mutates_around_the_mean(initial):
    examples = {node: 3 + 4 * i for i, node in enumerate(NODE_IDS[:4])}
    grid = StandInGrid(
        NODE_IDS[:4], lambda m: trained_reply(m, examples=examples[m.metadata.dst_node_id])
    )
    strategy = FedMut(seed=0, alpha=2.0, beta0=0.0, min_available_nodes=1)
    messages, replies, (global_arrays, _) = run_round(strategy, grid, 1, initial)
    for model in sent_models(messages).values():
        assert all(np.array_equal(model[n], initial[n]) for n in initial)
    # The global model w_glb is the plain mean of the trained models.
    trained = [to_model(r.content["arrays"]) for r in replies]
    glb = to_model(global_arrays)
    for name in _float_names(initial):
        np.testing.assert_allclose(
            glb[name], np.mean([m[name] for m in trained], axis=0), rtol=1e-5, atol=1e-6
        )
    # Round 2: the four nodes get mutations of w_glb along g = w_glb - w_initial.
    received = list(
        sent_models(list(strategy.configure_train(2, global_arrays, ConfigRecord(), grid))).values()
    )
    for name in _float_names(initial):
        gradient = glb[name] - initial[name]
        np.testing.assert_allclose(
            np.mean([m[name] for m in received], axis=0), glb[name], rtol=1e-5, atol=1e-5
        )
        for model in received:
            distance = np.linalg.norm(model[name] - glb[name])
            assert distance == pytest.approx(2.0 * np.linalg.norm(gradient), rel=1e-4)
    assert len({tuple(m["fc1.weight"].ravel()[:3]) for m in received}) == 2


def test_fedmut_uses_the_previous_global_and_the_beta_schedule(initial):
    grid = StandInGrid(NODE_IDS[:4])
    strategy = FedMut(seed=1, alpha=4.0, beta0=0.5, beta_rounds=10, min_available_nodes=1)
    _, _, (first_global, _) = run_round(strategy, grid, 1, initial)
    _, _, (second_global, _) = run_round(strategy, grid, 2, initial)
    previous, current = to_model(first_global), to_model(second_global)
    received = list(
        sent_models(list(strategy.configure_train(3, second_global, ConfigRecord(), grid))).values()
    )
    beta = 0.5 * (1 - 2 / 10)  # beta_t at t = 2
    for name in _float_names(initial):
        gradient = (current[name] - previous[name]).astype(np.float64)
        mask = np.abs(gradient) > 1e-3
        coefficients = sorted(
            float(np.median(((m[name] - current[name]) / gradient)[mask]) / 4.0) for m in received
        )
        np.testing.assert_allclose(coefficients, [-1 + beta, -1 + beta, 1.0, 1.0], atol=1e-3)


def test_fedcross_shuffles_nodes_over_middleware_models(initial):
    grid = StandInGrid(NODE_IDS)
    strategy = FedCross(seed=0, min_available_nodes=1)
    pairings = []
    for server_round in (1, 2, 3):
        run_round(strategy, grid, server_round, initial)
        messages = list(
            strategy.configure_train(
                server_round + 1, to_arrayrecord(initial), ConfigRecord(), grid
            )
        )
        pairings.append(dict(strategy.training.sent.targets))  # node -> slot of this dispatch
        strategy.aggregate_train(server_round + 1, grid.send_and_receive(messages))
    assert all(sorted(p.values()) == list(range(len(NODE_IDS))) for p in pairings)
    assert len({tuple(sorted(p.items())) for p in pairings}) > 1, "pairing never changed"


@pytest.mark.parametrize("selection", ["in_order", "highest_similarity", "lowest_similarity"])
def test_fedcross_pool_is_the_cross_aggregate_and_global_its_mean(initial, selection):
    grid = StandInGrid(NODE_IDS[:4])
    strategy = FedCross(seed=3, alpha=0.9, selection=selection, min_available_nodes=1)
    run_round(strategy, grid, 1, initial)
    replies, trained = trained_by_slot(strategy, grid, 2, initial)
    global_arrays, _ = strategy.aggregate_train(2, replies)
    similarity = cosine_similarity_matrix(trained)
    for i, model in enumerate(strategy.pool):
        others = [j for j in range(4) if j != i]
        if selection == "in_order":
            partner = (i + (1 % 3) + 1) % 4  # round index r = server_round - 1 = 1
        elif selection == "highest_similarity":
            partner = max(others, key=lambda j: similarity[i, j])
        else:
            partner = min(others, key=lambda j: similarity[i, j])
        for name in _float_names(initial):
            expected = 0.9 * trained[i][name] + 0.1 * trained[partner][name]
            np.testing.assert_allclose(model[name], expected, rtol=1e-5, atol=1e-6)
    mean = average(strategy.pool)
    for name in _float_names(initial):
        np.testing.assert_allclose(to_model(global_arrays)[name], mean[name], rtol=1e-6)


def test_fedcross_acceleration_schedules():
    strategy = FedCross(alpha=0.99, propeller_rounds=50, dynamic_alpha_rounds=50, alpha_start=0.5)
    assert strategy.alpha_at(1) == 0.5 and strategy.alpha_at(51) == 0.5
    assert strategy.alpha_at(76) == pytest.approx(0.5 + 0.49 * 0.5)
    assert strategy.alpha_at(101) == pytest.approx(0.99) and strategy.alpha_at(
        500
    ) == pytest.approx(0.99)
    assert FedCross(alpha=0.9).alpha_at(1) == 0.9


def test_fedcross_propeller_rounds_fuse_two_in_order_models(initial):
    grid = StandInGrid(NODE_IDS[:4])
    strategy = FedCross(seed=0, alpha=0.8, propeller_rounds=1, min_available_nodes=1)
    replies, trained = trained_by_slot(strategy, grid, 1, initial)
    strategy.aggregate_train(1, replies)
    for i, model in enumerate(strategy.pool):
        p1, p2 = (i + 1) % 4, (i + 2) % 4  # in-order partners of r = 0 and r = 1
        for name in _float_names(initial):
            expected = 0.8 * trained[i][name] + 0.1 * (trained[p1][name] + trained[p2][name])
            np.testing.assert_allclose(model[name], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "cls, kwargs, message",
    [
        (FedMut, {"alpha": -1.0}, "alpha"),
        (FedMut, {"beta0": 1.5}, "beta0"),
        (FedMut, {"beta_rounds": 0}, "beta_rounds"),
        (FedCross, {"alpha": 1.0}, "alpha"),
        (FedCross, {"selection": "random"}, "selection"),
        (FedCross, {"propeller_rounds": -1}, "propeller_rounds"),
        (FedCross, {"alpha": 0.9, "alpha_start": 0.95}, "alpha_start"),
    ],
)
def test_bad_arguments_are_rejected(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


MULTI_MODEL_STRATEGIES = {
    "fedmr": lambda **kw: FedMR(**kw),
    "fedindep": lambda **kw: FedIndep(**kw),
    "fedmut": lambda **kw: FedMut(alpha=4.0, **kw),
    "fedcross": lambda **kw: FedCross(alpha=0.9, **kw),
}


@pytest.mark.parametrize("name", sorted(MULTI_MODEL_STRATEGIES))
@pytest.mark.parametrize("pool_mean", ["uniform", "weighted"])
def test_global_model_is_the_pool_mean_asked_for_on_unequal_example_counts(
    initial, name, pool_mean
):
    # Example counts two orders of magnitude apart, as with Dirichlet(0.1)
    # partitions: the uniform mean (the authors' code and the default) and
    # the weighted one differ clearly.
    examples = {node: 10 ** (i % 3) for i, node in enumerate(NODE_IDS)}
    grid = StandInGrid(
        NODE_IDS, lambda m: trained_reply(m, examples=examples[m.metadata.dst_node_id])
    )
    kwargs = {"seed": 0, "min_available_nodes": 1}
    if pool_mean == "weighted":
        kwargs["pool_mean"] = "weighted"
    strategy = MULTI_MODEL_STRATEGIES[name](**kwargs)
    assert strategy.pool_mean == pool_mean
    messages = list(strategy.configure_train(1, to_arrayrecord(initial), ConfigRecord(), grid))
    slot_of = dict(strategy.training.sent.targets)  # node id -> pool slot
    replies = grid.send_and_receive(messages)
    glb = to_model(strategy.aggregate_train(1, replies)[0])
    # FedCross's global model averages the new middleware models (slot i
    # comes from the model node i trained); the others average the trained models.
    nodes = sorted(slot_of, key=slot_of.get)
    if name == "fedcross":
        averaged = strategy.pool
    else:
        trained = {r.metadata.src_node_id: to_model(r.content["arrays"]) for r in replies}
        averaged = [trained[node] for node in nodes]
    counts = np.asarray([examples[node] for node in nodes], dtype=np.float64)
    weights, other = (
        (counts, np.ones_like(counts))
        if pool_mean == "weighted"
        else (np.ones_like(counts), counts)
    )
    for tensor in _float_names(initial):
        stacked = np.stack([m[tensor].astype(np.float64) for m in averaged])
        expected = np.tensordot(weights / weights.sum(), stacked, axes=1)
        np.testing.assert_allclose(glb[tensor], expected, rtol=1e-5, atol=1e-6)
        wrong = np.tensordot(other / other.sum(), stacked, axes=1)
        assert not np.allclose(glb[tensor], wrong, rtol=1e-5, atol=1e-6)


def test_weighted_pool_mean_is_refused_with_secure_recombination():
    with pytest.raises(
        ValueError, match=r"pool_mean must be 'uniform' with secure recombination .*got 'weighted'"
    ):
        FedMR(secure_recombination=True, pool_mean="weighted")
    with pytest.raises(
        ValueError, match="pool_mean must be one of uniform, weighted, got 'median'"
    ):
        FedMut(pool_mean="median")


@pytest.mark.parametrize("pool_mean", ["uniform", "weighted"])
def test_fedmut_stays_centred_when_only_one_node_replies(initial, pool_mean):
    # Every round only one node replies; it pulls its model half-way towards
    # a target of its own. With the uniform mean of the K slot models, the
    # K - 1 unanswered mutations still cancel the answered one and w_glb
    # moves by 1/K of one client's step. Averaging the trained model alone (as the
    # weighted mean does) makes w_glb that one mutation, 4|g| away, and g
    # doubles every round: the run blows up.
    nodes = NODE_IDS[:4]
    targets = {node: make_model(np.random.default_rng(i)) for i, node in enumerate(nodes)}
    answering = {"node": None}

    def reply(message):
        node = message.metadata.dst_node_id
        if node != answering["node"]:
            return None
        model = to_model(message.content["arrays"])
        pulled = {
            n: (0.5 * a + 0.5 * targets[node][n]).astype(a.dtype) if a.dtype.kind == "f" else a
            for n, a in model.items()
        }
        content = RecordDict(
            {"arrays": to_arrayrecord(pulled), "metrics": MetricRecord({"num-examples": 10})}
        )
        return Message(content=content, reply_to=message)

    grid = StandInGrid(nodes, reply)
    strategy = FedMut(seed=0, alpha=4.0, beta0=0.0, min_available_nodes=1, pool_mean=pool_mean)
    strategy.unresponsive_cooldown = 0.0  # silent nodes stay in the sample
    arrays = to_arrayrecord(initial)
    largest = 0.0
    for server_round in range(1, 16):
        answering["node"] = nodes[server_round % len(nodes)]
        messages = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        arrays, _ = strategy.aggregate_train(server_round, grid.send_and_receive(messages))
        largest = max(
            largest,
            max(float(np.abs(a).max()) for a in to_model(arrays).values() if a.dtype.kind == "f"),
        )
    scale = max(
        float(np.abs(a).max()) for t in targets.values() for a in t.values() if a.dtype.kind == "f"
    )
    if pool_mean == "uniform":
        assert largest < 2 * scale
    else:
        assert largest > 100 * scale
