"""Property-based tests (hypothesis): every strategy through rounds of generated replies, and the ops.

Each example drives a strategy through a few rounds on the stand-in grid.
Every node's training reply in every round is one generated behaviour: a
well-behaved or degenerate reply (a trained model, the model it was sent,
zeros, denormals, extreme but positive weights), or one of the ways a reply
goes wrong (silence, an error, NaN/Inf, other names, shapes or dtypes, a
missing or extra array, no arrays, a missing, non-positive, non-finite or
non-numeric weight, two MetricRecords). On top of that a round may carry a
duplicate reply or one from a node that was sent nothing. Every float of an
invalid reply (and of a record or reply that must be ignored) is
:data:`SENTINEL`, far above anything a valid reply can lead to, so a leak
into the pool or the global model shows. After every round:

* no exception;
* K pool models (FedMe: one per client), each with the initial layout;
* every float finite;
* no trace of :data:`SENTINEL` (every value below :data:`LEAK`).

A second property feeds only valid but extreme replies (finite values near
float32's limit, zeros, denormals) and checks the same invariants; the ops
get their own properties on generated shapes and values.

Example counts are bounded and derandomized (:func:`profile`), so the
module runs the same examples in CI every time, in a few seconds;
``FEDX_HYPOTHESIS_EXAMPLES=500`` explores more, and
``FEDX_HYPOTHESIS_RANDOM=1`` draws new examples on each run.
"""

import os

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedx.ops import (
    average,
    cosine_similarity_matrix,
    cross_aggregate,
    find_problem,
    mutate,
    recombine,
)
from fedx.strategies import (
    FedAvgFT,
    FedCross,
    FedIndep,
    FedMR,
    FedMut,
    to_arrayrecord,
    to_model,
)
from tests.support.fedme_standins import CLIENT_OF, NumpyClients, initial_model, make_fedme
from tests.support.standin_grid import NODE_IDS, StandInGrid, trained_reply

pytestmark = pytest.mark.usefixtures("server_task_identity")


def profile(examples: int) -> settings:
    """Bounded, reproducible example counts for CI (see the module docstring)."""
    return settings(
        max_examples=int(os.environ.get("FEDX_HYPOTHESIS_EXAMPLES", examples)),
        deadline=None,
        derandomize=not os.environ.get("FEDX_HYPOTHESIS_RANDOM"),
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


#: A strategy example is 3 rounds of 5 messages through Flower's records
#: (about 0.15 s); an ops example is a few numpy calls.
STRATEGY_PROFILE = profile(12)
OPS_PROFILE = profile(40)
ROUNDS = 3
#: The value of every float of a reply (or part of one) that must not be used.
SENTINEL = np.float32(1e30)
#: Above this, a value came from a reply that must not be used.
LEAK = 1e20
FLOAT32_LARGE = np.float32(3e38)

#: Replies the strategies must use: well-behaved, degenerate, extreme weights.
VALID = ("trained", "unchanged", "zeros", "denormal", "weight-tiny", "weight-huge")
#: Replies they must drop (or, for ``extra-record``, whose extra record they must ignore).
INVALID = (
    "silent",
    "error",
    "nan",
    "inf",
    "wrong-name",
    "wrong-shape",
    "wrong-dtype",
    "missing-array",
    "extra-array",
    "no-arrays",
    "no-weight",
    "weight-zero",
    "weight-negative",
    "weight-nan",
    "weight-inf",
    "weight-text",
    "weight-list",
    "two-metric-records",
    "extra-record",
)
#: What else may arrive in a round: a node's second reply, a reply from a node sent nothing.
EXTRAS = ("none", "duplicate", "unsolicited")


# --------------------------------------------------------------------------- replies


def _filled(model, value):
    return {n: np.full_like(a, value) if a.dtype.kind == "f" else a for n, a in model.items()}


def _first_float(model) -> str:
    return next(n for n, a in model.items() if a.dtype.kind == "f")


def _break_arrays(model, behaviour: str):
    """The arrays of a reply that goes wrong as ``behaviour`` says (SENTINEL everywhere)."""
    model = _filled(model, SENTINEL)
    name = _first_float(model)
    if behaviour in ("nan", "inf"):
        model[name] = model[name].copy()
        model[name].flat[0] = np.nan if behaviour == "nan" else np.inf
    elif behaviour == "wrong-name":
        model = {(n + ".renamed" if n == name else n): a for n, a in model.items()}
    elif behaviour == "wrong-shape":
        model[name] = np.append(model[name].ravel(), SENTINEL)
    elif behaviour == "wrong-dtype":
        model[name] = model[name].astype(np.float64)
    elif behaviour == "missing-array":
        del model[list(model)[-1]]
    elif behaviour == "extra-array":
        model["extra.weight"] = np.full((2, 2), SENTINEL, dtype=np.float32)
    return model


def _valid_arrays(model, behaviour: str, node: int):
    if behaviour == "unchanged":
        return model
    if behaviour == "zeros":
        return _filled(model, 0.0)
    if behaviour == "denormal":
        return _filled(model, np.float32(1e-45))
    if behaviour == "huge":
        return _filled(model, FLOAT32_LARGE if node % 2 else -FLOAT32_LARGE)
    return model  # "trained" and the weight behaviours: the trained model as it came


WEIGHTS = {
    "weight-tiny": 1e-300,
    "weight-huge": 1e300,
    "no-weight": None,
    "weight-zero": 0,
    "weight-negative": -3,
    "weight-nan": float("nan"),
    "weight-inf": float("inf"),
    "weight-list": [1, 2],
}


def reshape_reply(good: Message, sent: Message, behaviour: str) -> Message | None:
    """``good`` (a well-behaved reply to ``sent``) turned into ``behaviour``."""
    if behaviour == "silent":
        return None
    if behaviour == "error":
        return Message(Error(code=0, reason="out of memory"), reply_to=sent)
    node = sent.metadata.dst_node_id
    content = good.content
    records: dict = {}
    for key, record in content.array_records.items():
        model = to_model(record)
        if behaviour in INVALID and behaviour != "extra-record":
            model = _break_arrays(model, behaviour)
        else:
            model = _valid_arrays(model, behaviour, node)
        records[key] = to_arrayrecord(model)
    if behaviour == "no-arrays":
        records = {}
    if behaviour == "extra-record":
        first = next(iter(content.array_records.values()))
        records["ignored-extra"] = to_arrayrecord(_filled(to_model(first), SENTINEL))
    metrics = dict(next(iter(content.metric_records.values())))
    if behaviour in WEIGHTS:
        metrics.pop("num-examples")
        if WEIGHTS[behaviour] is not None:
            metrics["num-examples"] = WEIGHTS[behaviour]
    if behaviour == "weight-text":
        records["metrics"] = ConfigRecord({**metrics, "num-examples": "ten"})
    else:
        records["metrics"] = MetricRecord(metrics)
    if behaviour == "two-metric-records":
        records["more-metrics"] = MetricRecord({"num-examples": 5})
    return Message(RecordDict(records), reply_to=sent)


def _poisoned(sent: Message, good: Message) -> Message:
    """A reply to ``sent`` whose every float is SENTINEL (weights and records intact)."""
    records: dict = {
        k: to_arrayrecord(_filled(to_model(r), SENTINEL))
        for k, r in good.content.array_records.items()
    }
    records.update(good.content.metric_records)
    return Message(RecordDict(records), reply_to=sent)


def _unsolicited(sent: Message, good: Message) -> Message:
    """A poisoned reply that claims to come from a node that was sent nothing."""
    reply = _poisoned(sent, good)
    reply.metadata.__dict__["_src_node_id"] = 987_654_321
    reply.metadata.__dict__["_reply_to_message_id"] = "not-a-message-of-this-round"
    return reply


class GeneratedGrid(StandInGrid):
    """Training replies as a generated plan says: ``plan[round][i]`` for the i-th message."""

    def __init__(self, good, plan, extras) -> None:
        super().__init__(NODE_IDS, good)
        self.plan, self.extras = plan, extras
        self.train_rounds = 0

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if not messages or messages[0].metadata.message_type != "train":
            return super().send_and_receive(messages, timeout=timeout)
        for message in messages:
            message.metadata.__dict__["_message_id"] = message.object_id
        behaviours, extra = self.plan[self.train_rounds], self.extras[self.train_rounds]
        self.train_rounds += 1
        replies, answered = [], []
        for index, message in enumerate(messages):
            good = self.reply(message)
            reply = reshape_reply(good, message, behaviours[index % len(behaviours)])
            if reply is not None:
                replies.append(reply)
                answered.append(message)
        if answered and extra == "duplicate":  # a second reply from a node that answered
            replies.append(_poisoned(answered[0], self.reply(answered[0])))
        if messages and extra == "unsolicited":
            replies.append(_unsolicited(messages[0], self.reply(messages[0])))
        return replies


# --------------------------------------------------------------------------- invariants


def check_model(model, reference, where: str, sentinel: bool = True) -> None:
    """``model`` has ``reference``'s layout, finite floats and no SENTINEL."""
    problem = find_problem(reference, model)
    assert problem is None, f"{where}: {problem}"
    if sentinel:
        for name, array in model.items():
            if array.dtype.kind == "f":
                assert np.abs(array).max(initial=0.0) < LEAK, (
                    f"{where}: {name} holds a dropped value"
                )


POOL_STRATEGIES = {
    "fedmr": lambda: FedMR(seed=0, min_available_nodes=1, fraction_evaluate=0.0),
    "fedmr-two-stage": lambda: FedMR(
        seed=0, first_stage_rounds=1, min_available_nodes=1, fraction_evaluate=0.0
    ),
    "fedindep": lambda: FedIndep(seed=0, min_available_nodes=1, fraction_evaluate=0.0),
    "fedmut": lambda: FedMut(seed=0, alpha=4.0, min_available_nodes=1, fraction_evaluate=0.0),
    "fedmut-weighted": lambda: FedMut(
        seed=0, alpha=4.0, pool_mean="weighted", min_available_nodes=1, fraction_evaluate=0.0
    ),
    "fedcross": lambda: FedCross(seed=0, min_available_nodes=1, fraction_evaluate=0.0),
    "fedcross-highest": lambda: FedCross(
        seed=0, selection="highest_similarity", alpha=0.5, min_available_nodes=1,
        fraction_evaluate=0.0,
    ),
    "fedavgft": lambda: FedAvgFT(seed=0, min_available_nodes=1, fraction_evaluate=0.0),
}  # fmt: skip

behaviours = st.sampled_from(VALID + INVALID)
round_plans = st.lists(
    st.lists(behaviours, min_size=len(NODE_IDS), max_size=len(NODE_IDS)),
    min_size=ROUNDS,
    max_size=ROUNDS,
)
round_extras = st.lists(st.sampled_from(EXTRAS), min_size=ROUNDS, max_size=ROUNDS)


def small_model() -> dict[str, np.ndarray]:
    """A layer, its bias and an integer counter: every kind of tensor, few of them.

    Each array costs a serialization per message (Flower's ``Array``), so
    a small model keeps the examples many and the module fast.
    """
    rng = np.random.default_rng(0)
    return {
        "layer.weight": rng.normal(size=(3, 2)).astype(np.float32),
        "layer.bias": rng.normal(size=(3,)).astype(np.float32),
        "norm.num_batches_tracked": np.array(7, dtype=np.int64),
    }


def run_pool_strategy(name: str, plan, extras, sentinel: bool = True) -> int:
    """Rounds of ``name`` on a GeneratedGrid, checking the invariants after each; the rounds checked."""
    initial = small_model()
    strategy = POOL_STRATEGIES[name]()
    grid = GeneratedGrid(trained_reply, plan, extras)
    arrays = to_arrayrecord(initial)
    for server_round in range(1, ROUNDS + 1):
        messages = strategy.configure_train(server_round, arrays, ConfigRecord(), grid)
        new, _ = strategy.aggregate_train(server_round, grid.send_and_receive(messages))
        if new is not None:
            arrays = new
        check_model(to_model(arrays), initial, f"round {server_round} global", sentinel)
        pool = getattr(strategy, "pool", None)
        if pool is not None:
            assert len(pool) == len(NODE_IDS), f"round {server_round}: {len(pool)} pool models"
            for slot, model in enumerate(pool):
                check_model(model, initial, f"round {server_round} slot {slot}", sentinel)
    return server_round


@pytest.mark.parametrize("name", sorted(POOL_STRATEGIES))
@STRATEGY_PROFILE
@given(plan=round_plans, extras=round_extras)
def test_pool_and_global_model_survive_generated_replies(name, plan, extras):
    assert run_pool_strategy(name, plan, extras) == ROUNDS


def test_fedme_clients_models_survive_generated_replies():
    @STRATEGY_PROFILE
    @given(plan=round_plans, extras=round_extras)
    def rounds(plan, extras):
        strategy = make_fedme()
        grid = GeneratedGrid(NumpyClients(), plan, extras)
        for server_round in range(1, ROUNDS + 1):
            messages = strategy.configure_train(server_round, ArrayRecord(), ConfigRecord(), grid)
            strategy.aggregate_train(server_round, grid.send_and_receive(messages))
            assert sorted(strategy.clients) == sorted(CLIENT_OF.values())
            for cid, client in strategy.clients.items():
                reference = initial_model(client.architecture, cid)
                check_model(client.model, reference, f"round {server_round} client {cid}")

    rounds()  # pylint: disable=no-value-for-parameter


EXTREME = (
    "trained",
    "unchanged",
    "zeros",
    "denormal",
    "huge",
    "weight-tiny",
    "weight-huge",
    "silent",
)


# One of each kind of arithmetic: recombination, mutation, cross-aggregation, FedAvg.
@pytest.mark.parametrize("name", ["fedavgft", "fedcross", "fedmr", "fedmut"])
@STRATEGY_PROFILE
@given(
    plan=st.lists(
        st.lists(st.sampled_from(EXTREME), min_size=len(NODE_IDS), max_size=len(NODE_IDS)),
        min_size=ROUNDS,
        max_size=ROUNDS,
    )
)
def test_extreme_but_valid_replies_keep_every_model_finite(name, plan):
    assert run_pool_strategy(name, plan, ["none"] * ROUNDS, sentinel=False) == ROUNDS


# --------------------------------------------------------------------------- ops


finite32 = st.floats(
    min_value=float(-FLOAT32_LARGE),
    max_value=float(FLOAT32_LARGE),
    allow_nan=False,
    allow_infinity=False,
    width=32,
    allow_subnormal=True,
)


@st.composite
def model_sets(draw, min_models=1, max_models=5):
    """K models of one generated layout, with finite float32 values (extremes included)."""
    shapes = draw(
        st.lists(hnp.array_shapes(min_dims=0, max_dims=3, max_side=4), min_size=1, max_size=3)
    )
    count = draw(st.integers(min_models, max_models))
    models = []
    for _ in range(count):
        model = {
            f"layer{i}.weight": draw(hnp.arrays(np.float32, shape, elements=finite32))
            for i, shape in enumerate(shapes)
        }
        model["counter"] = np.array(draw(st.integers(0, 2**40)), dtype=np.int64)
        models.append(model)
    return models


def _copies(models):
    return [{n: a.copy() for n, a in m.items()} for m in models]


@OPS_PROFILE
@given(models=model_sets(), data=st.data())
def test_average_is_finite_and_between_its_inputs(models, data):
    weights = data.draw(
        st.one_of(
            st.none(),
            st.lists(st.floats(1e-300, 1e300), min_size=len(models), max_size=len(models)),
        )
    )
    before = _copies(models)
    mean = average(models, weights)
    for name, reference in models[0].items():
        assert mean[name].shape == reference.shape and mean[name].dtype == reference.dtype
        if reference.dtype.kind == "f":
            stacked = np.stack([m[name] for m in models])
            assert np.isfinite(mean[name]).all()
            spread = np.abs(stacked).max(initial=0.0) * 1e-6
            assert np.all(mean[name] >= stacked.min(axis=0) - spread)
            assert np.all(mean[name] <= stacked.max(axis=0) + spread)
    assert all(find_problem(b, m) is None for b, m in zip(before, models, strict=True))
    assert all(
        np.array_equal(b[n], m[n]) for b, m in zip(before, models, strict=True) for n in m
    ), "average must not write into its inputs"


@OPS_PROFILE
@given(models=model_sets(), seed=st.integers(0, 2**32 - 1))
def test_recombination_moves_every_layer_to_exactly_one_model(models, seed):
    mixed = recombine(models, np.random.default_rng(seed))
    assert len(mixed) == len(models)
    for name in models[0]:
        sent = sorted(m[name].tobytes() for m in models)
        assert sorted(m[name].tobytes() for m in mixed) == sent


@OPS_PROFILE
@given(
    pair=model_sets(min_models=2, max_models=2),
    k=st.integers(1, 6),
    alpha=st.floats(0.0, 1e6),
    beta=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_mutation_gives_k_finite_models_of_the_layout(pair, k, alpha, beta, seed):
    center, previous = pair
    mutated = mutate(center, previous, np.random.default_rng(seed), k=k, alpha=alpha, beta=beta)
    assert len(mutated) == k
    for model in mutated:
        assert find_problem(center, model) is None


@OPS_PROFILE
@given(
    models=model_sets(),
    alpha=st.floats(0.5, 1.0, exclude_max=True),
    selection=st.sampled_from(["lowest_similarity", "highest_similarity", "in_order"]),
    round_index=st.integers(1, 50),
)
def test_cross_aggregation_is_finite_and_between_each_pair(models, alpha, selection, round_index):
    similarity = cosine_similarity_matrix(models)
    assert similarity.shape == (len(models), len(models)) and np.isfinite(similarity).all()
    assert np.all(np.abs(similarity) <= 1.0 + 1e-6)
    fused = cross_aggregate(
        models, alpha=alpha, selection=selection, round_index=round_index, similarity=similarity
    )
    assert len(fused) == len(models)
    low = {n: np.min([m[n] for m in models], axis=0) for n in models[0]}
    high = {n: np.max([m[n] for m in models], axis=0) for n in models[0]}
    for model in fused:
        assert find_problem(models[0], model) is None
        for name, array in model.items():
            if array.dtype.kind == "f":
                spread = (
                    np.abs(high[name]).max(initial=0.0) * 1e-6
                    + np.abs(low[name]).max(initial=0.0) * 1e-6
                )
                assert np.all(array >= low[name] - spread) and np.all(array <= high[name] + spread)
