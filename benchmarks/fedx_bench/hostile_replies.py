"""What reading a hostile reply costs the server, against reading a valid reply of the same model.

The strategies read every training reply with
:func:`fedx.strategy_core.base.read_model` against the model they sent
(:mod:`fedx.arrays`: ``expected``). Each case below is one reply's
``ArrayRecord`` as Flower hands it to the strategy (its objects already
inflated), packed (fedx's one-array form) or standard (one ``Array`` per
array), and this script reads it with ``read_model`` and reports:

* what became of it: read, or refused and why (the reason, cut here);
* its best time of ``--repeats`` reads, and that time as a multiple of the
  valid reply's of the same form, measured in the same run;
* the peak of the memory the read allocates (``tracemalloc``, which numpy
  reports its buffers to), and that as a multiple of the valid reply's.

The cases: a valid reply; a header of 10^6 empty entries ``["x<i>", "|u1",
[0]]`` (25 MB); the model with 10^5 extra one-byte arrays; one name of 10^6
characters; a dtype that lies (``<i4`` for a ``<f4`` array: the same bytes);
a shape that lies (the first matrix transposed: the same size); a size that
lies (one element more); every array in the other byte order (a valid
reply, read converted); the bytes cut short by 8; the bytes extended by
1 MiB. The standard form has the same cases where it can say them (one
matrix's bytes cut short or extended).

Usage::

    python benchmarks/hostile_replies.py                 # digits' CNN, both forms
    python benchmarks/hostile_replies.py --model resnet20 --repeats 5
    python benchmarks/hostile_replies.py --quick          # 10^4 instead of 10^6 and 10^5

Compare another copy of fedx with ``PYTHONPATH=/tmp/fedx-before python
benchmarks/hostile_replies.py`` (a copy made with ``git archive <commit>
fedx``). This script reports; it is not a test, and it always exits with
status 0.
"""

import gc
import json
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord

from fedx.arrays import PACKED_NAME, PACKED_STYPE, pack
from fedx.strategy_core.base import read_model

from fedx_bench import common

Model = dict[str, np.ndarray]
#: Input shape and classes of each model this script can use (fedx.models names).
MODELS = {"cnn": ((1, 8, 8), 10), "resnet20": ((3, 32, 32), 10), "vgg16": ((3, 32, 32), 10)}


def state_dict(name: str) -> Model:
    """The state dict of fedx's model ``name``, as numpy arrays (what the server sent)."""
    import torch  # pylint: disable=import-outside-toplevel

    from fedx.models import build_model  # pylint: disable=import-outside-toplevel

    torch.manual_seed(0)
    input_shape, classes = MODELS[name]
    return {
        k: v.numpy().copy() for k, v in build_model(name, input_shape, classes).state_dict().items()
    }


# ----------------------------------------------------------------------
# The replies
# ----------------------------------------------------------------------


def packed(data: bytes) -> ArrayRecord:
    return ArrayRecord(
        {PACKED_NAME: Array(dtype="uint8", shape=(len(data),), stype=PACKED_STYPE, data=data)}
    )


def packed_bytes(entries: list, body: bytes) -> bytes:
    header = json.dumps(entries, separators=(",", ":")).encode()
    return len(header).to_bytes(4, "little") + header + body


def relabeled(data: bytes, change: Callable[[list], None]) -> bytes:
    """Packed ``data`` whose header ``change`` edits; the arrays' bytes stay where they were."""
    end = 4 + int.from_bytes(data[:4], "little")
    entries = json.loads(data[4:end])
    change(entries)
    header = json.dumps(entries, separators=(",", ":")).encode()
    assert len(header) <= end - 4, "the edited header must fit in the old one's bytes"
    return data[:4] + header.ljust(end - 4) + data[end:]


def first_matrix(model: Model) -> str:
    return next(
        name for name, array in model.items() if array.ndim >= 2 and array.dtype == np.float32
    )


def other_order(model: Model) -> Model:
    return {name: array.astype(array.dtype.newbyteorder("S")) for name, array in model.items()}


def standard(model: Model) -> ArrayRecord:
    return ArrayRecord({name: Array(array) for name, array in model.items()})


def packed_cases(model: Model, many: int, extra: int) -> dict[str, ArrayRecord]:
    """The packed replies: a valid one first."""
    valid = pack(model).data
    matrix = first_matrix(model)

    def set_entry(index: int, value) -> Callable[[list], None]:
        def change(entries: list) -> None:
            entry = next(e for e in entries if e[0] == matrix)
            entry[index] = value(entry[index])

        return change

    with_extra = {**model, **{f"x{i}": np.zeros(1, np.uint8) for i in range(extra)}}
    long_name = dict(model)
    long_name["n" * 10**6] = long_name.pop(matrix)
    return {
        "valid": packed(valid),
        f"header of {many:,} empty entries": packed(
            packed_bytes([[f"x{i}", "|u1", [0]] for i in range(many)], b"")
        ),
        f"{extra:,} extra arrays": packed(pack(with_extra).data),
        "a name of 10^6 characters": packed(pack(long_name).data),
        "dtype lies (<i4 for <f4)": packed(relabeled(valid, set_entry(1, lambda _: "<i4"))),
        "shape lies (transposed)": packed(relabeled(valid, set_entry(2, lambda s: s[::-1]))),
        "size lies (one more)": packed(
            relabeled(valid, set_entry(2, lambda s: [s[0] + 1, *s[1:]]))
        ),
        "other byte order (valid)": packed(pack(other_order(model)).data),
        "truncated by 8 bytes": packed(valid[:-8]),
        "extended by 1 MiB": packed(valid + bytes(1 << 20)),
    }


def standard_cases(model: Model, extra: int) -> dict[str, ArrayRecord]:
    """The standard replies: a valid one first."""
    matrix = first_matrix(model)
    record = standard(model)
    long_name = standard(model)
    long_name["n" * 10**6] = long_name.pop(matrix)
    with_extra = standard(model)
    for i in range(extra):
        with_extra[f"x{i}"] = Array(np.zeros(1, np.uint8))
    lying_dtype = standard(model)
    lying_dtype[matrix] = Array(model[matrix].view(np.int32))
    lying_shape = standard(model)
    lying_shape[matrix] = Array(model[matrix].reshape(model[matrix].shape[::-1]))
    truncated = standard(model)
    array = record[matrix]
    truncated[matrix] = Array(
        dtype=array.dtype, shape=array.shape, stype=array.stype, data=array.data[:-8]
    )
    extended = standard(model)
    extended[matrix] = Array(
        dtype=array.dtype, shape=array.shape, stype=array.stype, data=array.data + bytes(1 << 20)
    )
    return {
        "valid": record,
        f"{extra:,} extra arrays": with_extra,
        "a name of 10^6 characters": long_name,
        "dtype lies (<i4 for <f4)": lying_dtype,
        "shape lies (transposed)": lying_shape,
        "other byte order (valid)": standard(other_order(model)),
        "truncated by 8 bytes": truncated,
        "extended by 1 MiB": extended,
    }


# ----------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------


@dataclass
class Reading:
    """One case: what the read gave, its best time and its peak allocation."""

    form: str
    case: str
    outcome: str
    seconds: float
    peak_bytes: int


def measure(form: str, case: str, record: ArrayRecord, sent: Model, repeats: int) -> Reading:
    """Read ``record`` against ``sent`` ``repeats`` times (the best time), then once traced (the peak)."""
    times = []
    result: Model | str = ""
    for _ in range(repeats):
        gc.collect()
        started = time.perf_counter()
        result = read_model(record, sent)
        times.append(time.perf_counter() - started)
        del result
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    result = read_model(record, sent)
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    outcome = "read" if isinstance(result, dict) else f"refused: {result}"
    return Reading(form, case, outcome, min(times), peak)


def print_readings(readings: Sequence[Reading]) -> None:
    common.print_header(
        f"{'form':8} {'case':34} {'ms':>9} {'x valid':>8} {'peak KiB':>10} {'x valid':>8}  outcome"
    )
    valid = {r.form: r for r in readings if r.case == "valid"}
    for r in readings:
        base = valid[r.form]
        print(
            f"{r.form:8} {r.case:34} {r.seconds * 1e3:9.3f} {r.seconds / base.seconds:8.2f} "
            f"{r.peak_bytes / common.KIB:10.1f} {r.peak_bytes / max(base.peak_bytes, 1):8.2f}  "
            f"{r.outcome[:90]}"
        )


def main(argv: Sequence[str] | None = None) -> list[Reading]:
    parser = common.benchmark_parser(__doc__)
    parser.add_argument(
        "--model", choices=sorted(MODELS), default="cnn", help="default: %(default)s"
    )
    parser.add_argument("--repeats", type=int, default=3, help="reads per case, the best counts")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="10^4 entries and extra arrays instead of 10^6 and 10^5",
    )
    args = parser.parse_args(argv)
    many, extra = (10**4, 10**4) if args.quick else (10**6, 10**5)
    sent = state_dict(args.model)
    size = sum(a.nbytes for a in sent.values())
    print(
        f"model {args.model}: {len(sent)} arrays, {size / common.KIB:.0f} KiB; best of {args.repeats} reads"
    )
    readings = []
    for form, cases in (
        ("packed", packed_cases(sent, many, extra)),
        ("standard", standard_cases(sent, extra)),
    ):
        for case, record in cases.items():
            readings.append(measure(form, case, record, sent, args.repeats))
    print_readings(readings)
    return readings
