"""A stand-in for Flower's Grid whose nodes are numpy clients, for strategy tests."""

import functools
from collections.abc import Callable, Iterable

import numpy as np
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict

from fedx.ops import Model
from fedx.strategies import to_arrayrecord, to_model

# Node ids are unsigned 64-bit: values above 2**63 break if they pass through int64.
NODE_IDS = [2**64 - 1, 2**63 + 17, 12, 9_007_199_254_740_993, 5]

Reply = Callable[[Message], Message | None]


def without_query_handler(client: Reply) -> Reply:
    """A numpy client answers a ``query`` as a ClientApp with no query handler does."""

    @functools.wraps(client)
    def reply(message: Message, **kwargs) -> Message | None:
        if message.metadata.message_type == "query":
            return Message(Error(code=0, reason="no query handler"), reply_to=message)
        return client(message, **kwargs)

    return reply


@without_query_handler
def trained_reply(message: Message, delta: float | None = None, examples: int = 10) -> Message:
    """What a well-behaved client sends: the model moved by a node-specific delta."""
    node = message.metadata.dst_node_id
    step = delta if delta is not None else (node % 97) / 97 + 0.01
    model = to_model(message.content["arrays"])
    trained = {
        n: np.asarray(a + np.asarray(step, dtype=a.dtype) if a.dtype.kind == "f" else a + 1)
        for n, a in model.items()
    }
    content = RecordDict(
        {
            "arrays": to_arrayrecord(trained),
            "metrics": MetricRecord({"num-examples": examples, "train-loss": float(step)}),
        }
    )
    return Message(content=content, reply_to=message)


@without_query_handler
def pulled_reply(message: Message) -> Message:
    """A deterministic client: half-way from the model to a target of its own.

    Unlike a fixed step, the result depends on the model sent, so a resumed
    run only matches if every node gets the same model in every round.
    """
    node = message.metadata.dst_node_id
    rng = np.random.default_rng(node % 2**32)
    model = to_model(message.content["arrays"])
    trained = {
        name: np.asarray(
            (0.5 * array + 0.5 * rng.normal(size=array.shape)).astype(array.dtype)
            if array.dtype.kind == "f"
            else array + 1
        )
        for name, array in model.items()
    }
    content = RecordDict(
        {
            "arrays": to_arrayrecord(trained),
            "metrics": MetricRecord({"num-examples": 10 + node % 7, "train-loss": float(node % 5)}),
        }
    )
    return Message(content=content, reply_to=message)


class StandInGrid:
    """Just enough of Flower's Grid: node ids and a synchronous send_and_receive."""

    def __init__(self, node_ids: list[int], reply: Reply = trained_reply) -> None:
        self.node_ids = list(node_ids)
        self.reply = reply
        self.sent: list[list[Message]] = []

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        messages = list(messages)
        for message in messages:  # as Flower's Grid does when it pushes them
            message.metadata.__dict__["_message_id"] = message.object_id
        self.sent.append(messages)
        replies = [self.reply(m) for m in messages]
        return [r for r in replies if r is not None]


class CrashingGrid(StandInGrid):
    """Deterministic clients (:func:`pulled_reply`); the server dies when training round ``crash_in`` is sent."""

    def __init__(self, node_ids: list[int], crash_in: int | None) -> None:
        super().__init__(node_ids, reply=pulled_reply)
        self.crash_in = crash_in
        self.train_rounds = 0

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == "train":
            self.train_rounds += 1
            if self.train_rounds == self.crash_in:
                raise RuntimeError("the server process died")
        return super().send_and_receive(messages, timeout=timeout)


def run_round(strategy, grid, server_round: int, initial: Model):
    messages = list(
        strategy.configure_train(server_round, to_arrayrecord(initial), ConfigRecord(), grid)
    )
    replies = grid.send_and_receive(messages)
    return messages, replies, strategy.aggregate_train(server_round, replies)


def owners_of(model: Model, trained: list[Model]) -> set[int]:
    """Which trained models the float layers of ``model`` came from."""
    return {
        next(k for k, t in enumerate(trained) if np.array_equal(t[n], a))
        for n, a in model.items()
        if a.dtype.kind == "f"
    }


def sent_models(messages: list[Message]) -> dict[int, Model]:
    return {m.metadata.dst_node_id: to_model(m.content["arrays"]) for m in messages}


def real_clients_grid(node_ids: list[int], config: dict) -> StandInGrid:
    """Nodes answering with the real ClientApp functions (torch, the run's data); node i holds partition i."""
    from fedx import client_app  # pylint: disable=import-outside-toplevel  (imports torch)

    handlers = {
        "query": client_app.identify,
        "train": client_app.train_model,
        "evaluate": client_app.evaluate_model,
    }
    contexts = {
        node: Context(
            1, node, {"partition-id": i, "num-partitions": len(node_ids)}, RecordDict(), config
        )
        for i, node in enumerate(node_ids)
    }
    grid = StandInGrid(
        node_ids, lambda m: handlers[m.metadata.message_type](m, contexts[m.metadata.dst_node_id])
    )
    # Flower lists nodes as a set: the order carries no meaning.
    grid.node_ids = sorted(node_ids)
    return grid
