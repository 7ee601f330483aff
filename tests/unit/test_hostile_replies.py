"""Hostile replies: checked against the model they answer before anything of them is built.

A strategy reads a training reply with :func:`fedx.strategy_core.base.read_model`
against the model it sent. A reply whose header (packed) or records
(standard) say other arrays than that model's is refused before the server
parses a header longer than a valid one or builds any array: what it costs
in memory stays about what a valid reply of the model costs (measured here
with ``tracemalloc``, which numpy reports its buffers to; the times are
``benchmarks/hostile_replies.py``'s). The reasons name at most one array,
cut short. An array in the other byte order is read in this machine's.
"""

import functools
import json
import tracemalloc

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

import fedx.arrays
from fedx.arrays import PACKED_NAME, PACKED_STYPE, pack, to_numpy_dict, unpack
from fedx.strategy_core.base import read_model

_rng = np.random.default_rng(0)
#: The model sent: a small CNN's state dict, 140 KB (a reply's cost is its arrays' bytes).
SENT = {
    "conv1.weight": _rng.normal(size=(32, 1, 5, 5)).astype(np.float32),
    "conv1.bias": _rng.normal(size=32).astype(np.float32),
    "bn1.num_batches_tracked": np.array(7, dtype=np.int64),
    "fc1.weight": _rng.normal(size=(64, 512)).astype(np.float32),
    "fc1.bias": _rng.normal(size=64).astype(np.float32),
    "fc2.weight": _rng.normal(size=(10, 64)).astype(np.float32),
    "fc2.bias": _rng.normal(size=10).astype(np.float32),
}
MATRIX = "fc1.weight"


def packed(data: bytes) -> ArrayRecord:
    return ArrayRecord(
        {PACKED_NAME: Array(dtype="uint8", shape=(len(data),), stype=PACKED_STYPE, data=data)}
    )


def relabeled(data: bytes, index: int, value) -> bytes:
    """Packed ``data`` with entry ``MATRIX``'s field ``index`` set to ``value``, the bytes kept."""
    end = 4 + int.from_bytes(data[:4], "little")
    entries = json.loads(data[4:end])
    next(e for e in entries if e[0] == MATRIX)[index] = value
    header = json.dumps(entries, separators=(",", ":")).encode()
    assert len(header) <= end - 4
    return data[:4] + header.ljust(end - 4) + data[end:]


def renamed(model: dict, name: str) -> dict:
    """``model`` with ``MATRIX`` under another name."""
    return {name if key == MATRIX else key: value for key, value in model.items()}


def header_of_empty_entries(count: int) -> bytes:
    """Packed bytes whose header lists ``count`` entries ``["x<i>", "|u1", [0]]`` (no data)."""
    header = b"[" + b",".join(b'["x%d","|u1",[0]]' % i for i in range(count)) + b"]"
    return len(header).to_bytes(4, "little") + header


VALID = pack(SENT).data
MILLION = 10**6
# Each case: the reply, and what its refusal says.
HOSTILE_PACKED = {
    "a header of 10^6 empty entries": (
        lambda: packed(header_of_empty_entries(MILLION)),
        "a header of",
    ),
    "10^4 extra arrays": (
        lambda: packed(
            pack({**SENT, **{f"x{i}": np.zeros(1, np.uint8) for i in range(10**4)}}).data
        ),
        "a header of",
    ),
    "a name of 10^6 characters": (
        lambda: packed(pack(renamed(SENT, "n" * MILLION)).data),
        "a header of",
    ),
    "a dtype that lies": (lambda: packed(relabeled(VALID, 1, "<i4")), "dtype int32"),
    "a shape that lies": (
        lambda: packed(relabeled(VALID, 2, list(SENT[MATRIX].shape[::-1]))),
        f"'{MATRIX}': shape",
    ),
    "a size that lies": (
        lambda: packed(relabeled(VALID, 2, [SENT[MATRIX].shape[0] + 1, SENT[MATRIX].shape[1]])),
        f"'{MATRIX}': shape",
    ),
    "an unexpected name of the same length": (
        lambda: packed(pack(renamed(SENT, "fc9.weight")).data),
        "unexpected array 'fc9.weight'",
    ),
    "truncated bytes": (lambda: packed(VALID[:-8]), "ends at byte"),
    "extended bytes": (lambda: packed(VALID + bytes(1 << 20)), "its arrays end at byte"),
}


def traced_peak(function) -> tuple[object, int]:
    """``function()``'s result, and the most memory it allocated at once (bytes)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = function()
        return result, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@functools.cache
def hostile_packed(case: str) -> ArrayRecord:
    """The packed reply of ``case``, built once."""
    return HOSTILE_PACKED[case][0]()


@pytest.mark.parametrize("case", list(HOSTILE_PACKED))
def test_a_hostile_packed_reply_is_refused_for_less_than_a_valid_one_costs(case, monkeypatch):
    reason = HOSTILE_PACKED[case][1]
    record = hostile_packed(case)
    model, valid_peak = traced_peak(lambda: read_model(packed(VALID), SENT))
    assert isinstance(model, dict)
    # Nothing of a refused reply is built: no array.
    for builder in ("frombuffer", "zeros"):
        monkeypatch.setattr(np, builder, lambda *_, **__: pytest.fail("an array was built"))
    refused, peak = traced_peak(lambda: read_model(record, SENT))
    monkeypatch.undo()
    assert isinstance(refused, str) and reason in refused, refused
    assert len(refused) < 300  # one array named, its name cut short
    assert peak < valid_peak


def test_a_hostile_headers_json_is_not_parsed(monkeypatch):
    def parse(_):
        raise AssertionError("the header of a hostile reply was parsed")

    monkeypatch.setattr(fedx.arrays.json, "loads", parse)
    for case in (
        "a header of 10^6 empty entries",
        "10^4 extra arrays",
        "a name of 10^6 characters",
    ):
        reason = read_model(hostile_packed(case), SENT)
        assert isinstance(reason, str) and "a header of" in reason, (case, reason)


def standard(model: dict) -> ArrayRecord:
    return ArrayRecord({name: Array(array) for name, array in model.items()})


def with_array(model: dict, name: str, array: Array) -> ArrayRecord:
    record = standard(model)
    record[name] = array
    return record


EMPTY = Array(np.zeros(0, np.uint8))
HOSTILE_STANDARD = {
    "10^4 extra arrays": (
        lambda: ArrayRecord(
            {**standard(SENT), **dict.fromkeys((f"x{i}" for i in range(10**4)), EMPTY)}
        ),
        "10007 arrays, expected 7",
    ),
    "a name of 10^6 characters": (
        lambda: standard(renamed(SENT, "n" * MILLION)),
        "unexpected array 'nnn",
    ),
    "a dtype that lies": (
        lambda: with_array(SENT, MATRIX, Array(SENT[MATRIX].view(np.int32))),
        "dtype int32",
    ),
    "a shape that lies": (
        lambda: with_array(SENT, MATRIX, Array(SENT[MATRIX].T.copy())),
        f"'{MATRIX}': shape",
    ),
    "data of another size": (
        lambda: with_array(
            SENT,
            MATRIX,
            Array(
                dtype="float32",
                shape=SENT[MATRIX].shape,
                stype="numpy.ndarray",
                data=Array(np.zeros(10**6, np.float32)).data,
            ),
        ),
        "bytes for",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE_STANDARD))
def test_a_hostile_standard_reply_is_refused_before_an_array_is_read(case, monkeypatch):
    reply, reason = HOSTILE_STANDARD[case]
    record = reply()
    read: list[str] = []
    to_numpy = fedx.arrays.to_numpy
    monkeypatch.setattr(fedx.arrays, "to_numpy", lambda array: read.append(1) or to_numpy(array))
    refused = read_model(record, SENT)
    assert isinstance(refused, str) and reason in refused, refused
    assert len(refused) < 300
    assert read == []


def test_a_reply_in_the_other_byte_order_is_read_in_this_machines():
    swapped = {name: array.astype(array.dtype.newbyteorder("S")) for name, array in SENT.items()}
    for record in (packed(pack(swapped).data), standard(swapped)):
        model = read_model(record, SENT)
        assert isinstance(model, dict), model
        for name, array in SENT.items():
            assert model[name].dtype == array.dtype and model[name].dtype.isnative, name
            np.testing.assert_array_equal(model[name], array)
    # The ClientApp's read of a packed model (no expected model): native too, as torch needs.
    import torch  # pylint: disable=import-outside-toplevel

    for name, array in unpack(pack(swapped)).items():
        assert torch.equal(torch.from_numpy(array), torch.from_numpy(SENT[name])), name


def test_a_valid_reply_in_either_form_reads_as_the_model_it_holds():
    for record in (packed(VALID), standard(SENT)):
        model = to_numpy_dict(record, expected=SENT)
        assert list(model) == list(SENT)
        for name, array in SENT.items():
            np.testing.assert_array_equal(model[name], array)
            assert model[name].flags.writeable and model[name].flags.owndata
