"""fedx's packed model form: exact round trips, malformed models dropped, agreement per node.

The form is :mod:`fedx.arrays`; the ClientApp's side
:mod:`fedx.client.packing`, the server's :mod:`fedx.strategy_core.packing`.
Messages here cross Flower's object transport as the SuperLink and the
SuperNodes move them (deflated into objects, inflated from them), so what
the form does not survive there it does not survive here either.
"""

import functools
import json
import logging
import math
import random

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import SType
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

from fedx.arrays import (
    ALIGNMENT,
    PACKED_NAME,
    PACKED_STYPE,
    is_packed,
    pack,
    pack_models,
    packed_record,
    packs_models,
    standard_record,
    to_numpy_dict,
    unpack,
)
from fedx.client.packing import packed_models
from fedx.strategies import FedMe, FedMR, to_arrayrecord, to_model
from fedx.strategy_core.capabilities import reads_packed_models
from fedx.strategy_core.client_identity import query_client_ids
from fedx.strategy_core.packing import PackingGrid
from tests.support.helpers import make_model
from tests.support.standin_grid import NODE_IDS, StandInGrid, trained_reply

pytestmark = pytest.mark.usefixtures("server_task_identity")

MODEL = {
    "float32": np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7,
    "float64 column": np.linspace(0, 1, 5)[:, None],
    "float16": np.array([1.5, -2.25, np.inf], dtype=np.float16),
    "int64 scalar": np.array(42, dtype=np.int64),  # BatchNorm's num_batches_tracked
    "float32 scalar": np.array(-0.5, dtype=np.float32),
    "int8": np.array([-128, 127], dtype=np.int8),
    "int16": np.array([-3], dtype=np.int16),
    "int32": np.array([[1, -2]], dtype=np.int32),
    "uint8": np.arange(10, dtype=np.uint8),
    "uint16": np.array([65535], dtype=np.uint16),
    "uint32": np.array([2**32 - 1], dtype=np.uint32),
    "uint64": np.array([2**64 - 1], dtype=np.uint64),
    "bool": np.array([True, False, True]),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "empty int": np.zeros((4, 0), dtype=np.int64),
    "big-endian float": np.arange(4, dtype=">f8") / 3,
    "big-endian int": np.arange(4, dtype=">i4"),
    "complex64": np.array([1 + 2j], dtype=np.complex64),
    "complex128": np.array([[1e300 - 1j]], dtype=np.complex128),
    "fortran order": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
    "strided view": np.arange(20, dtype=np.float64)[::3],
    "nan payload": np.array([np.nan, -0.0], dtype=np.float32),
    "text": np.array(["ab", "c"]),
    "datetime": np.array(["2020-01-01"], dtype="datetime64[s]"),
    "many dimensions": np.zeros((1,) * 20, dtype=np.float32),
}


def native(array: np.ndarray) -> np.ndarray:
    """``array`` in this machine's byte order, as the packed form is read (C order)."""
    return np.require(array.astype(array.dtype.newbyteorder("="), copy=False), requirements="C")


def assert_same_model(got: dict, expected: dict) -> None:
    """Same names in the same order, and every array the same dtype (in this machine's byte
    order), shape and bits."""
    assert list(got) == list(expected)
    for name, array in expected.items():
        assert got[name].dtype == array.dtype.newbyteorder("="), name
        assert got[name].dtype.isnative, name
        assert got[name].shape == array.shape, name
        assert got[name].tobytes() == native(array).tobytes(), name


def through_flowers_objects(message: Message) -> tuple[Message, int]:
    """``message`` deflated into Flower's objects and inflated back, and how many objects."""
    objects = get_all_nested_objects(message)
    contents = {object_id: obj.deflate() for object_id, obj in objects.items()}
    return inflate_object_from_contents(message.object_id, contents), len(objects)


def train_message(content: RecordDict, node_id: int = 7) -> Message:
    return Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_id)


@pytest.fixture
def resnet20():
    """ResNet-20's state dict for CIFAR-10 (with BatchNorm's int64 counters), as torch gives it."""
    import torch  # pylint: disable=import-outside-toplevel

    from fedx.models import build_model  # pylint: disable=import-outside-toplevel

    torch.manual_seed(0)
    return build_model("resnet20", (3, 32, 32), 10).state_dict()


def as_numpy(state_dict) -> dict[str, np.ndarray]:
    return {name: tensor.numpy() for name, tensor in state_dict.items()}


# ----------------------------------------------------------------------
# The form
# ----------------------------------------------------------------------


def test_a_model_of_every_dtype_packs_and_unpacks_exactly():
    array = pack(MODEL)
    assert (array.stype, array.dtype, array.shape) == (PACKED_STYPE, "uint8", (len(array.data),))
    got = unpack(array)
    assert_same_model(got, MODEL)
    for value in got.values():  # the reader's own arrays, as Array.numpy() gives
        assert value.flags.writeable and value.flags.owndata


def test_every_array_starts_aligned_in_the_packed_bytes():
    data = pack(MODEL).data
    header_end = 4 + int.from_bytes(data[:4], "little")
    entries = json.loads(data[4:header_end])
    offset = header_end
    for name, dtype, shape in entries:
        size = math.prod(shape) * np.dtype(dtype).itemsize
        if size:
            start = -(-offset // ALIGNMENT) * ALIGNMENT
            assert data[offset:start] == bytes(start - offset), name  # zeros in between
            array = np.frombuffer(data, np.dtype(dtype), math.prod(shape), start)
            assert array.tobytes() == np.ascontiguousarray(MODEL[name]).tobytes(), name
            offset = start + size
    assert offset == len(data)


def test_a_standard_record_and_its_packed_form_hold_the_same_model():
    record = to_arrayrecord(MODEL)
    packed = packed_record(record)
    assert is_packed(packed) and list(packed) == [PACKED_NAME]
    assert_same_model(to_numpy_dict(packed), MODEL)
    assert packed_record(packed) is packed
    standard = standard_record(packed)
    assert not is_packed(standard)
    for name, array in standard.items():
        # The same .npy bytes as Flower's own Array of the array.
        assert array.stype == SType.NUMPY
        assert array.data == Array(native(MODEL[name])).data, name
    assert standard_record(record) is record


@pytest.mark.parametrize("chunk_size", [5 * 1024 * 1024, 1000])
def test_a_state_dict_crosses_flowers_objects_bit_for_bit(resnet20, monkeypatch, chunk_size):
    # Flower cuts an Array's bytes into chunks of at most this size.
    monkeypatch.setattr("flwr.app.message.array.FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE", chunk_size)
    # As the ClientApp replies: an ArrayRecord of the module's state dict.
    content = RecordDict({"arrays": packed_record(ArrayRecord(resnet20)), "config": ConfigRecord()})
    received, _ = through_flowers_objects(train_message(content))
    assert_same_model(to_numpy_dict(received.content["arrays"]), as_numpy(resnet20))
    assert received.content["config"] == content["config"]
    assert as_numpy(resnet20)["bn1.num_batches_tracked"].dtype == np.int64


def test_a_packed_message_is_a_handful_of_objects_whatever_the_layer_count(resnet20):
    # Trained, every array differs from every other (a fresh model's equal ones are one object).
    trained = {
        name: np.asarray(array + (1e-3 * (index + 1) if array.dtype.kind == "f" else index))
        for index, (name, array) in enumerate(as_numpy(resnet20).items())
    }
    standard = RecordDict({"arrays": to_arrayrecord(trained), "config": ConfigRecord({"a": 1})})
    packed = pack_models(standard)
    _, standard_objects = through_flowers_objects(train_message(standard))
    _, packed_objects = through_flowers_objects(train_message(packed))
    # Message, RecordDict, ArrayRecord, ConfigRecord, the Array and its one chunk.
    assert packed_objects == 6
    assert standard_objects == 4 + 2 * len(trained)  # an Array and its chunk per array
    # Above Flower's chunk size (5 MB), the one Array is cut into chunks.
    big = RecordDict(
        {"arrays": packed_record(to_arrayrecord({"w": np.ones(3_000_000, np.float32)}))}
    )
    _, objects = through_flowers_objects(train_message(big))
    assert objects == 4 + math.ceil(len(next(iter(big["arrays"].values())).data) / 5_242_880)


def test_arrays_without_a_packed_form_are_refused_and_their_record_travels_standard():
    structured = np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")])
    with pytest.raises(ValueError, match="no packed form"):
        pack({"structured": structured})
    with pytest.raises(ValueError, match="no packed form"):
        pack({"objects": np.array([None, 1], dtype=object)})
    record = ArrayRecord({"structured": Array(structured)})
    content = pack_models(RecordDict({"arrays": record, "model": to_arrayrecord(MODEL)}))
    assert content["arrays"] is record
    assert is_packed(content["model"])


def test_packing_a_message_packs_every_model_and_keeps_the_rest():
    config = ConfigRecord({"server-round": 2})
    content = RecordDict(
        {
            "personalized": ArrayRecord({"w": Array(np.ones(3, np.float32))}),
            "exchanged": ArrayRecord({"w": Array(np.zeros(3, np.float32))}),
            "none": ArrayRecord(),
            "config": config,
        }
    )
    packed = pack_models(content)
    assert is_packed(packed["personalized"]) and is_packed(packed["exchanged"])
    assert len(packed["none"]) == 0 and packed["config"] is config
    assert not is_packed(content["personalized"])  # the original is left alone


# ----------------------------------------------------------------------
# Malformed packed models
# ----------------------------------------------------------------------


def packed_bytes(entries: list, body: bytes) -> bytes:
    """Packed bytes with this header and this body."""
    header = json.dumps(entries).encode()
    return len(header).to_bytes(4, "little") + header + body


def relabeled(data: bytes, change) -> bytes:
    """``data`` with ``change(entries)`` applied to its header, the header's length and the
    arrays' bytes kept (JSON allows the blanks that pad it)."""
    end = 4 + int.from_bytes(data[:4], "little")
    entries = json.loads(data[4:end])
    change(entries)
    header = json.dumps(entries, separators=(",", ":")).encode()
    assert len(header) <= end - 4
    return data[:4] + header.ljust(end - 4) + data[end:]


def with_data(data: bytes) -> Array:
    return Array(dtype="uint8", shape=(len(data),), stype=PACKED_STYPE, data=data)


# w fills its 64 bytes: a w that grows pushes b out of the bytes, one that shrinks leaves
# w's last values where zeros belong.
GOOD = pack({"w": np.arange(16, dtype=np.float32), "b": np.ones(2, np.float64)}).data
MALFORMED = {
    "truncated": GOOD[:-3],
    "one byte more": GOOD + b"\0",
    "no header": b"\x01\x00",
    "header longer than the bytes": (10**6).to_bytes(4, "little") + GOOD[4:],
    "header not JSON": (2).to_bytes(4, "little") + b"[}",
    "header not UTF-8": (2).to_bytes(4, "little") + b"\xff\xfe",
    "header not a list": packed_bytes({"w": 1}, b""),
    "entry not a triple": packed_bytes([["w", "<f4"]], b""),
    "shape lies: more": relabeled(GOOD, lambda e: e[0].__setitem__(2, [17])),
    "shape lies: less": relabeled(GOOD, lambda e: e[0].__setitem__(2, [15])),
    "dtype lies": relabeled(GOOD, lambda e: e[0].__setitem__(1, "<f8")),
    "an array left out": relabeled(GOOD, lambda e: e.pop()),
    "unknown dtype": packed_bytes([["w", "<q9", [1]]], b""),
    "object dtype": packed_bytes([["w", "|O", [1]]], b""),
    "structured dtype": packed_bytes([["w", "|V12", [1]]], b""),
    "negative size": packed_bytes([["w", "<f4", [-1]]], b""),
    "size not a number": packed_bytes([["w", "<f4", [True]]], b""),
    "name twice": packed_bytes([["w", "<f4", [0]], ["w", "<f4", [0]]], b""),
    "deep nesting": (200_000).to_bytes(4, "little") + b"[" * 200_000,
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_packed_model_fails_with_a_reason(case):
    with pytest.raises(ValueError, match="packed model"):
        unpack(with_data(MALFORMED[case]))


def test_a_packed_array_among_others_is_not_a_packed_model():
    record = ArrayRecord({PACKED_NAME: pack(MODEL), "other": Array(np.ones(2))})
    assert not is_packed(record)
    with pytest.raises(TypeError, match="Unsupported serialization type"):
        to_numpy_dict(record)


# ----------------------------------------------------------------------
# The ClientApp's mod
# ----------------------------------------------------------------------


def node_context(node_id: int = 7) -> Context:
    return Context(
        run_id=1,
        node_id=node_id,
        node_config={"partition-id": 0},
        state=RecordDict(),
        run_config={},
    )


def handler_seeing(seen: list):
    """A ClientApp handler that records the records it got and replies with the model plus one."""

    def handle(message: Message, context: Context) -> Message:
        del context
        if message.metadata.message_type == MessageType.QUERY:
            return Message(
                RecordDict({"metrics": MetricRecord({"client-id": 3})}), reply_to=message
            )
        seen.append(message.content["arrays"])
        model = {n: np.asarray(a.numpy() + 1) for n, a in message.content["arrays"].items()}
        return Message(
            RecordDict(
                {"arrays": to_arrayrecord(model), "metrics": MetricRecord({"num-examples": 1})}
            ),
            reply_to=message,
        )

    return handle


def test_the_mod_hands_packed_models_over_standard_and_replies_packed():
    seen: list[ArrayRecord] = []
    model = {"w": np.arange(3, dtype=np.float32), "n": np.array(5, dtype=np.int64)}
    message, _ = through_flowers_objects(
        train_message(RecordDict({"arrays": packed_record(to_arrayrecord(model))}))
    )
    reply = packed_models(message, node_context(), handler_seeing(seen))
    assert not is_packed(seen[0]) and all(a.stype == SType.NUMPY for a in seen[0].values())
    assert is_packed(reply.content["arrays"])
    assert_same_model(to_numpy_dict(reply.content["arrays"]), {k: v + 1 for k, v in model.items()})


def test_the_mod_replies_standard_to_a_standard_message():
    seen: list[ArrayRecord] = []
    message = train_message(RecordDict({"arrays": ArrayRecord({"w": Array(np.ones(2))})}))
    reply = packed_models(message, node_context(), handler_seeing(seen))
    assert not is_packed(seen[0]) and not is_packed(reply.content["arrays"])


def test_the_mods_answer_to_the_query_says_it_reads_packed():
    query = Message(RecordDict(), message_type=MessageType.QUERY, dst_node_id=7)
    reply = packed_models(query, node_context(), handler_seeing([]))
    assert dict(reply.content["metrics"]) == {"client-id": 3, "reads-packed": 1}
    silent = packed_models(query, node_context(), lambda m, c: Message(RecordDict(), reply_to=m))
    assert dict(silent.content["metrics"]) == {"reads-packed": 1}


def test_a_malformed_packed_message_fails_in_the_mod():
    bad = ArrayRecord({PACKED_NAME: with_data(MALFORMED["truncated"])})
    with pytest.raises(ValueError, match="packed model"):
        packed_models(
            train_message(RecordDict({"arrays": bad})), node_context(), handler_seeing([])
        )


# ----------------------------------------------------------------------
# Agreement per node, and the strategies
# ----------------------------------------------------------------------


def fedx_node(message: Message) -> Message:
    """A node whose ClientApp speaks the packed form (the mod around a numpy client)."""

    def handle(msg: Message, context: Context) -> Message:
        del context
        if msg.metadata.message_type == MessageType.QUERY:
            return Message(RecordDict({"metrics": MetricRecord({"client-id": 0})}), reply_to=msg)
        return trained_reply(msg)

    return packed_models(message, node_context(message.metadata.dst_node_id), handle)


class WireGrid(StandInGrid):
    """Nodes ``packed`` speak the packed form, the others are Flower-quickstart-like numpy
    clients with no query handler; every message and reply crosses Flower's objects."""

    def __init__(self, node_ids, packed, damage=None):
        super().__init__(node_ids, reply=self.deliver)
        self.packed = set(packed)
        self.damage = damage or {}
        self.replies: list[list[Message]] = []

    def deliver(self, message: Message) -> Message:
        message, _ = through_flowers_objects(message)
        node = message.metadata.dst_node_id
        reply = fedx_node(message) if node in self.packed else trained_reply(message)
        if node in self.damage and message.metadata.message_type == MessageType.TRAIN:
            reply.content["arrays"] = self.damage[node](reply.content["arrays"])
        return reply

    def send_and_receive(self, messages, *, timeout=None):
        replies = super().send_and_receive(messages, timeout=timeout)
        self.replies.append(replies)
        return replies


def run_fedmr(grid, initial, rounds=2):
    """FedMR's rounds on ``grid`` after the identity query; the pool."""
    strategy = FedMR(seed=0, min_available_nodes=1)
    query_client_ids(grid, list(grid.get_node_ids()), timeout=1.0)
    for server_round in range(1, rounds + 1):
        messages = list(
            strategy.configure_train(server_round, to_arrayrecord(initial), ConfigRecord(), grid)
        )
        strategy.aggregate_train(server_round, grid.send_and_receive(messages, timeout=1))
    return strategy


def test_nodes_that_say_they_read_packed_get_it_and_the_others_standard_arrayrecords(initial):
    nodes, speakers = NODE_IDS[:4], set(NODE_IDS[:2])
    wire = WireGrid(nodes, speakers)
    grid = PackingGrid(wire)
    strategy = run_fedmr(grid, initial)
    assert grid.packed_nodes == speakers
    assert grid.sent_packed == 4 and grid.sent_standard == 4  # 2 rounds
    for sent, replies in zip(wire.sent[1:], wire.replies[1:], strict=True):  # after the query
        for message in sent:
            packed = message.metadata.dst_node_id in speakers
            assert is_packed(message.content["arrays"]) == packed
            if not packed:  # what Flower's quickstarts read: one .npy Array per array
                assert all(a.stype == SType.NUMPY for a in message.content["arrays"].values())
        for reply in replies:
            assert is_packed(reply.content["arrays"]) == (reply.metadata.src_node_id in speakers)
    # The same run with every node standard ends with the same pool, bit for bit.
    plain = run_fedmr(StandInGrid(nodes), initial)
    for got, expected in zip(strategy.pool, plain.pool, strict=True):
        assert_same_model(got, expected)


def test_a_grid_that_is_not_asked_sends_standard_arrayrecords(initial):
    wire = WireGrid(NODE_IDS[:3], NODE_IDS[:3])
    strategy = FedMR(seed=0, min_available_nodes=1)
    messages = list(strategy.configure_train(1, to_arrayrecord(initial), ConfigRecord(), wire))
    replies = PackingGrid(wire).send_and_receive(messages, timeout=1)  # no query: nobody said
    assert not any(is_packed(m.content["arrays"]) for m in messages)
    assert not any(is_packed(r.content["arrays"]) for r in replies)


def truncate(record: ArrayRecord) -> ArrayRecord:
    (array,) = record.values()
    return ArrayRecord({PACKED_NAME: with_data(array.data[:-8])})


def lie(record: ArrayRecord) -> ArrayRecord:
    """The same bytes under a header that gives fc1.weight (8, 16) as (16, 8): it reads."""

    def transpose(entries: list) -> None:
        entry = next(entry for entry in entries if entry[0] == "fc1.weight")
        entry[2] = entry[2][::-1]

    (array,) = record.values()
    return ArrayRecord({PACKED_NAME: with_data(relabeled(array.data, transpose))})


@pytest.mark.parametrize("damage", [truncate, lie])
def test_a_malformed_packed_reply_is_dropped_with_a_log_line(initial, caplog, damage):
    nodes = NODE_IDS[:3]
    victim = nodes[1]
    grid = PackingGrid(WireGrid(nodes, nodes, damage={victim: damage}))
    strategy = FedMR(seed=0, min_available_nodes=1)
    query_client_ids(grid, nodes, timeout=1.0)
    messages = list(strategy.configure_train(1, to_arrayrecord(initial), ConfigRecord(), grid))
    with caplog.at_level(logging.WARNING):
        _, metrics = strategy.aggregate_train(1, grid.send_and_receive(messages, timeout=1))
    assert metrics["trained-slots"] == 2
    slot = [m.metadata.dst_node_id for m in messages].index(victim)
    lines = [r.getMessage() for r in caplog.records if f"node {victim}" in r.getMessage()]
    assert len(lines) == 1, caplog.text
    assert lines[0].startswith(f"Round 1: dropped the reply of node {victim} (slot {slot}): ")
    reason = "packed model" if damage is truncate else "'fc1.weight': shape (16, 8)"
    assert reason in lines[0]


def plain_numpy_reply(message: Message) -> Message:
    """A Flower-quickstart-like ClientApp: each Array read with ``numpy()``, the floats moved by one.

    Sent a packed model, ``Array.numpy()`` refuses it, and Flower's ClientApp replies with the
    error.
    """
    try:
        arrays = {n: a.numpy() for n, a in message.content["arrays"].items()}
    except TypeError as err:
        return Message(Error(code=0, reason=str(err)), reply_to=message)
    trained = {n: a + 1 if a.dtype.kind == "f" else a for n, a in arrays.items()}
    content = RecordDict(
        {"arrays": to_arrayrecord(trained), "metrics": MetricRecord({"num-examples": 10})}
    )
    return Message(content=content, reply_to=message)


def own_model_reply(message: Message) -> Message:
    """A ClientApp that replies with a model of its own (it never reads what it was sent)."""
    model = {k: np.asarray(v + 1) for k, v in make_model(np.random.default_rng(0)).items()}
    content = RecordDict(
        {"arrays": to_arrayrecord(model), "metrics": MetricRecord({"num-examples": 10})}
    )
    return Message(content=content, reply_to=message)


class RestartingGrid(WireGrid):
    """A :class:`WireGrid` whose nodes can restart (keeping their node ids) as another ClientApp."""

    def __init__(self, node_ids, packed):
        super().__init__(node_ids, packed)
        self.restarted: dict[int, object] = {}

    def restart(self, node: int, reply=None) -> None:
        """Node ``node`` restarts: with ``reply`` (a ClientApp without the mod), or as fedx's again."""
        if reply is None:
            self.restarted.pop(node, None)
            self.packed.add(node)
        else:
            self.restarted[node] = reply
            self.packed.discard(node)

    def deliver(self, message: Message) -> Message:
        node = message.metadata.dst_node_id
        if node in self.restarted:
            message, _ = through_flowers_objects(message)
            return self.restarted[node](message)
        return super().deliver(message)


def fedmr_round(strategy, grid, server_round, initial) -> tuple[list[Message], dict]:
    messages = list(
        strategy.configure_train(server_round, to_arrayrecord(initial), ConfigRecord(), grid)
    )
    _, metrics = strategy.aggregate_train(server_round, grid.send_and_receive(messages, timeout=1))
    return messages, metrics


@pytest.mark.parametrize(
    "restarted_as, trained_in_round_2", [(plain_numpy_reply, 2), (own_model_reply, 3)]
)
def test_a_node_restarted_without_the_packed_mod_is_trained_again_from_its_next_round(
    initial, restarted_as, trained_in_round_2
):
    nodes = NODE_IDS[:3]
    victim = nodes[1]
    wire = RestartingGrid(nodes, nodes)
    grid = PackingGrid(wire)
    strategy = FedMR(seed=0, min_available_nodes=1)
    query_client_ids(grid, nodes, timeout=1.0)
    _, metrics = fedmr_round(strategy, grid, 1, initial)
    assert metrics["trained-slots"] == 3 and grid.packed_nodes == set(nodes)
    # It restarts with the same node id as a ClientApp that does not read the packed form:
    # it cannot use the packed model it is sent now, and its reply says so (an error, or no
    # word of the packed form).
    wire.restart(victim, restarted_as)
    _, metrics = fedmr_round(strategy, grid, 2, initial)
    assert metrics["trained-slots"] == trained_in_round_2
    assert grid.packed_nodes == set(nodes) - {victim}
    # From its next message on it gets standard records, and trains.
    messages, metrics = fedmr_round(strategy, grid, 3, initial)
    assert metrics["trained-slots"] == 3
    for message in messages:
        assert is_packed(message.content["arrays"]) == (message.metadata.dst_node_id != victim)
    # Back as fedx's ClientApp: its next reply (to a standard message) says it reads the
    # packed form, and the message after that goes packed.
    wire.restart(victim)
    _, metrics = fedmr_round(strategy, grid, 4, initial)
    assert metrics["trained-slots"] == 3 and grid.packed_nodes == set(nodes)
    messages, _ = fedmr_round(strategy, grid, 5, initial)
    assert all(is_packed(message.content["arrays"]) for message in messages)


def test_the_superlinks_word_that_a_node_is_lost_turns_it_to_standard_records():
    grid = PackingGrid(StandInGrid(NODE_IDS[:2]))
    grid.packed_nodes = set(NODE_IDS[:2])
    model = to_arrayrecord({"w": np.ones(3, np.float32)})
    messages = [train_message(RecordDict({"arrays": model}), node) for node in NODE_IDS[:2]]
    grid.pack(messages)
    for message in messages:  # as the Grid does when it pushes them
        message.metadata.__dict__["_message_id"] = message.object_id
    lost = Message(Error(code=0, reason="Node Unavailable"), reply_to=messages[0])
    lost.metadata.__dict__["_src_node_id"] = 1  # the SuperLink writes it
    grid.listen([lost])
    assert grid.packed_nodes == {NODE_IDS[1]}


def test_every_reply_of_the_mod_says_it_reads_the_packed_form():
    from fedx.strategy_core.client_identity import reads_packed  # pylint: disable=import-outside-toplevel

    model = {"w": np.arange(3, dtype=np.float32)}
    standard = train_message(RecordDict({"arrays": to_arrayrecord(model)}))
    packed = train_message(RecordDict({"arrays": packed_record(to_arrayrecord(model))}))

    def no_model(message: Message, context: Context) -> Message:
        del context
        return Message(RecordDict({"metrics": MetricRecord({"a": 1})}), reply_to=message)

    for message, handler in (
        (standard, handler_seeing([])),
        (packed, handler_seeing([])),
        (standard, no_model),
        (packed, no_model),
    ):
        reply = packed_models(message, node_context(), handler)
        assert reads_packed(reply)
        # One more object only where the reply holds no packed model: it says so by itself.
        assert ("fedx.wire" in reply.content) != packs_models(reply.content)
        assert list(reply.content.metric_records) == ["metrics"]  # the metrics stay the handler's
    assert not reads_packed(handler_seeing([])(standard, node_context()))


def test_fedx_strategies_read_packed_replies_and_flowers_own_do_not():
    assert reads_packed_models(FedMR())
    assert reads_packed_models(FedMe)  # the class says so for every instance
    assert not reads_packed_models(FedAvg())


def test_a_reply_read_as_a_model_gives_the_same_model_in_either_form(initial):
    record = to_arrayrecord(initial)
    assert_same_model(to_model(packed_record(record)), to_model(record))


# ----------------------------------------------------------------------
# FedMe's two-model messages and secure recombination, packed
# ----------------------------------------------------------------------


def test_fedmes_two_model_messages_go_packed_and_train_as_they_do_standard():
    from tests.support.fedme_standins import NumpyClients, make_fedme, train_round

    clients = NumpyClients()

    def packed_node(message: Message) -> Message | None:
        message, _ = through_flowers_objects(message)
        node = message.metadata.dst_node_id
        return packed_models(message, node_context(node), lambda m, c: clients(m))

    wire = StandInGrid(NODE_IDS, packed_node)
    grid, plain_grid = PackingGrid(wire), StandInGrid(NODE_IDS, clients)
    strategy, plain = make_fedme(), make_fedme()
    for server_round in (1, 2):
        train_round(strategy, grid, server_round)
        train_round(plain, plain_grid, server_round)
    # FedMe asked the nodes it met itself; its trained messages then went packed both ways.
    assert grid.packed_nodes == set(NODE_IDS) and grid.sent_packed == 2 * len(NODE_IDS)
    for message in wire.sent[-1]:
        assert set(message.content.array_records) == {"personalized", "exchanged"}
        assert all(is_packed(record) for record in message.content.array_records.values())
    assert strategy.clients.keys() == plain.clients.keys()
    for client_id, client in strategy.clients.items():
        assert client.architecture == plain.clients[client_id].architecture
        assert_same_model(client.model, plain.clients[client_id].model)


def test_secure_recombination_runs_on_packed_models_and_conserves_every_layer(initial):
    from fedx.secure.loopback import LoopbackGrid
    from tests.support.secure_standins import (
        NumpyClients,
        assert_same_layers,
        secure_fedmr,
        secure_round,
        uploads_of,
    )

    clients = NumpyClients()
    loopback = LoopbackGrid(NODE_IDS, clients.train, rng=random.Random(0))
    loopback.handlers["query"] = lambda m, c: Message(RecordDict(), reply_to=m)
    loopback.handlers = {
        kind: functools.partial(packed_models, call_next=handler)
        for kind, handler in loopback.handlers.items()
    }
    grid = PackingGrid(loopback)
    query_client_ids(grid, NODE_IDS, timeout=1.0)
    _, metrics = secure_round(secure_fedmr(), grid, initial)
    assert grid.packed_nodes == set(NODE_IDS)
    (train,) = [batch for batch in loopback.requests if batch[0].metadata.message_type == "train"]
    assert all(is_packed(message.content["arrays"]) for message in train)
    # The exchanges hold only ciphertext; the uploads answer a message without models, and
    # so come standard. Every layer is uploaded once, as without packing.
    uploads = uploads_of(loopback)
    assert sorted(uploads) == sorted(NODE_IDS) and metrics["trained-slots"] == len(NODE_IDS)
    assert metrics["secure-aborted"] == 0
    assert_same_layers(list(uploads.values()), list(clients.trained.values()))
