"""Whole runs on the stand-in grid with replies that used to stop or spoil a run (issue 17).

Only the strategies' public API: a constructor, a stand-in grid, ``start()``.
"""

import numpy as np
import pytest
from flwr.app import Message, MetricRecord, RecordDict

from fedx.strategies import FedCross, FedMR, FedMut
from fedx.strategy_core.multi_model import to_arrayrecord, to_model
from tests.support.helpers import make_model
from tests.support.standin_grid import NODE_IDS, StandInGrid, trained_reply, without_query_handler

pytestmark = pytest.mark.usefixtures("server_task_identity")

FLOAT32_LARGE = np.float32(3e38)  # finite; the sum of two overflows float32


def _zero_model():
    return {
        name: np.zeros_like(array) for name, array in make_model(np.random.default_rng(0)).items()
    }


def _assert_finite(model):
    for name, array in model.items():
        if array.dtype.kind == "f":
            assert np.isfinite(array).all(), f"{name} is not finite"


@pytest.mark.parametrize("selection", ["lowest_similarity", "highest_similarity", "in_order"])
def test_fedcross_zero_initial_model_with_a_silent_node_in_round_one(selection):
    """The silent node's slot keeps the all-zero model: its similarity is 0, the run goes on."""
    silent = NODE_IDS[1]
    calls = {"silent": 0}

    def reply(message):
        if message.metadata.dst_node_id == silent and message.metadata.message_type == "train":
            calls["silent"] += 1
            if calls["silent"] == 1:
                return None  # no reply in round 1
        return trained_reply(message)

    grid = StandInGrid(NODE_IDS[:4], reply)
    strategy = FedCross(seed=0, selection=selection, min_available_nodes=1, fraction_evaluate=0.0)
    result = strategy.start(grid, to_arrayrecord(_zero_model()), num_rounds=3, timeout=5)
    assert calls["silent"] >= 1
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    final = to_model(result.arrays)
    _assert_finite(final)
    # Every node moved its model by a positive step in every round it replied:
    # the global model is no longer zero.
    assert all(np.all(final[name] > 0) for name in final if final[name].dtype.kind == "f")


@without_query_handler
def _huge_reply(message: Message) -> Message:
    """A finite but huge model (a diverging client): every float is +/-3e38."""
    model = to_model(message.content["arrays"])
    sign = 1 if message.metadata.dst_node_id % 2 else -1
    huge = {
        name: np.full_like(array, sign * FLOAT32_LARGE) if array.dtype.kind == "f" else array
        for name, array in model.items()
    }
    content = RecordDict(
        {"arrays": to_arrayrecord(huge), "metrics": MetricRecord({"num-examples": 10})}
    )
    return Message(content=content, reply_to=message)


@pytest.mark.parametrize(
    "strategy",
    [
        FedMR(seed=0, min_available_nodes=1, fraction_evaluate=0.0),
        FedCross(seed=0, alpha=0.5, min_available_nodes=1, fraction_evaluate=0.0),
        FedMut(seed=0, alpha=4.0, min_available_nodes=1, fraction_evaluate=0.0),
    ],
    ids=["fedmr", "fedcross", "fedmut"],
)
def test_finite_but_huge_replies_give_a_finite_global_model(strategy):
    """Replies of +/-3e38 pass validation; nothing the server computes from them overflows."""
    # Nodes with odd ids send +3e38, even ids -3e38: pick three of one sign
    # so that their plain float32 sum overflows.
    positive = [node for node in NODE_IDS if node % 2][:3]
    grid = StandInGrid(positive, _huge_reply)
    result = strategy.start(
        grid, to_arrayrecord(make_model(np.random.default_rng(1))), num_rounds=2, timeout=5
    )
    final = to_model(result.arrays)
    _assert_finite(final)
    for array in final.values():
        if array.dtype.kind == "f":
            np.testing.assert_allclose(array, FLOAT32_LARGE, rtol=1e-6)
