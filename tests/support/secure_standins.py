"""Stand-ins for secure recombination's tests: numpy clients behind fedx's protocol handlers.

Shared by tests/unit/test_secure_protocol.py and the packed wire's tests.
"""

from collections import Counter

import numpy as np
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict

from fedx.ops import Model
from fedx.secure.client import is_secure_round, secure_train_reply
from fedx.secure.loopback import LoopbackGrid
from fedx.strategies import FedMR, to_arrayrecord, to_model


class NumpyClients:
    """What a ClientApp's train handler does, in numpy: every node moves its model its own way."""

    def __init__(self, examples: dict[int, int] | None = None) -> None:
        self.trained: dict[int, Model] = {}
        self.examples = examples or {}
        self.failing: set[int] = set()
        self.plain: set[int] = set()  # nodes whose ClientApp ignores secure recombination

    def train(self, msg: Message, context: Context) -> Message:
        node = msg.metadata.dst_node_id
        if node in self.failing:
            return Message(Error(code=2, reason="out of memory"), reply_to=msg)
        rng = np.random.default_rng(node % 10_007)
        model = to_model(msg.content["arrays"])
        trained = {
            n: (a + rng.normal(size=a.shape).astype(a.dtype))
            if a.dtype.kind == "f"
            else np.asarray(a + 1)
            for n, a in model.items()
        }
        self.trained[node] = trained
        metrics = MetricRecord({"num-examples": self.examples.get(node, 10)})
        if is_secure_round(msg) and node not in self.plain:
            return secure_train_reply(msg, context, to_arrayrecord(trained), metrics)
        return Message(
            RecordDict({"arrays": to_arrayrecord(trained), "metrics": metrics}), reply_to=msg
        )


def secure_fedmr(**kwargs) -> FedMR:
    settings = {"secure_repeats": 3, "secure_min_layers": 2, "secure_max_layers": 4}
    return FedMR(seed=0, min_available_nodes=1, secure_recombination=True, **{**settings, **kwargs})


def secure_round(strategy: FedMR, grid: LoopbackGrid, initial: Model, server_round: int = 1):
    messages = list(
        strategy.configure_train(server_round, to_arrayrecord(initial), ConfigRecord(), grid)
    )
    return strategy.aggregate_train(server_round, grid.send_and_receive(messages))


def uploads_of(grid: LoopbackGrid) -> dict[int, Model]:
    """The models the server received in the last upload exchange."""
    return {
        r.metadata.src_node_id: to_model(r.content["arrays"])
        for r in grid.replies[-1]
        if not r.has_error() and "arrays" in r.content.array_records
    }


def assert_same_layers(models: list[Model], reference: list[Model]) -> None:
    """Per tensor, the multiset of arrays is the same: nothing lost, nothing duplicated."""
    assert len(models) == len(reference)
    for name in reference[0]:
        assert Counter(m[name].tobytes() for m in models) == Counter(
            r[name].tobytes() for r in reference
        ), name
