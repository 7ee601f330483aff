"""A model's arrays as Flower's messages carry them: standard ``Array`` s, or fedx's packed form.

**Standard.** A Flower ``Array`` holds one array as the bytes of a NumPy
``.npy`` file (``np.save``). ``Array.numpy()`` reads them with ``np.load``,
which parses the file's header with ``ast.literal_eval``: for digits' CNN
that is most of the time it takes, several times what the reading below
costs, and a server reads K models every round, a simulation worker
one or two per message. :func:`to_numpy` reads the header that ``np.save``
writes for a plain array (format 1.0, one type, C order) with a regular
expression and gives anything else (another format version, a
Fortran-ordered or a structured array, another serialization type, bytes of
the wrong length) to ``Array.numpy()``. Either way the result is what
``Array.numpy()`` gives: a writable array that owns its data.

**Packed.** Flower 1.41 moves a message as objects, one request each: the
message, its records, every ``Array`` and every ``ArrayChunk`` (a piece of
at most 5 MB of an ``Array``'s bytes). A standard ResNet-20 is 128 arrays,
so 128 ``Array`` s and as many chunks. The packed form is one ``Array``
per model, whatever its number of arrays: an ``ArrayRecord`` whose only
entry (:data:`PACKED_NAME`) has ``stype`` :data:`PACKED_STYPE`, ``dtype``
``"uint8"`` and the shape of its bytes, which are, in order:

* the header's length in bytes, 4 bytes, little-endian;
* the header: JSON, a list of ``[name, dtype, shape]``, one per array in
  the model's order, ``dtype`` as numpy spells it with its byte order
  (``dtype.str``: ``"<f4"``, ``"|b1"``, ``">i8"``);
* each array's bytes in C order. An array that holds bytes starts at the
  first multiple of :data:`ALIGNMENT` at or after the end of what came
  before it, with zeros in between; the bytes end where the last array
  ends. Reading checks all of that before it builds any array: bytes that
  do not hold what the header says (truncated, extended, a size or a dtype
  that does not fit) fail with a reason.

**Replies.** A reply is read against the model it answers
(``expected``: :func:`to_numpy_dict`, :func:`unpack`): a header or a
standard record whose count of arrays, names, dtypes, shapes or sizes
differ from it is refused before any array is built, a packed header
longer than twice that model's before it is parsed, so that a hostile
reply (a million empty arrays, a name of a million characters, a header
that lies) costs the server about what a valid reply of the model costs
(``benchmarks/hostile_replies.py``), and an error message shows at most
one name, cut to :data:`SHOWN_CHARACTERS` characters.

Flower cuts the packed bytes into chunks with a ``memoryview`` (no copy)
and reassembles them into one ``bytes``: the arrays are then read in place
(``np.frombuffer``, aligned for every type) and copied once into arrays of
their own, as :func:`to_numpy` copies. The sender writes the bytes once
(``bytes.join`` of the arrays' buffers). The header rebuilds the state dict
exactly: names and their order, shapes (0-d and empty arrays included),
dtypes, every value; an array written in the other byte order is read in
this machine's (``torch.from_numpy`` takes no other). Object and structured dtypes have
no packed form (:func:`pack` refuses them; a record holding one travels
standard).

Who reads it: a node says so in its answer to the identity query
(:mod:`fedx.strategy_core.client_identity`); fedx's ClientApp does, through
:func:`fedx.client.packing.packed_models`, and replies packed to what came
packed. :func:`to_numpy_dict` reads both forms, so whatever reads a model
(the strategies, the ClientApp, checkpoints) takes either. What the
strategies hold and what is saved on disk is the same either way.

numpy and Flower only, so the strategies and the ClientApp both use it.
"""

import io
import json
import math
import re
import reprlib
from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.common.constant import SType

# What np.save writes before the data: magic string, format version 1.0, header length.
_PREFIX = b"\x93NUMPY\x01\x00"
_HEADER = re.compile(
    rb"\{'descr': '([<>|=]?[a-zA-Z]\d*)', 'fortran_order': False, 'shape': \(([0-9, ]*)\), \} *\n"
)

#: The packed form's version; a node that reads it answers the identity query with it.
PACKED_VERSION = 1
#: The ``stype`` of a packed model's ``Array`` (a later version is another stype).
PACKED_STYPE = f"fedx.packed.v{PACKED_VERSION}"
#: The name of a packed model's ``Array`` in its ``ArrayRecord``.
PACKED_NAME = "fedx.packed"
#: Where the arrays of a packed model start: multiples of this many bytes.
ALIGNMENT = 64
_LENGTH_BYTES = 4
#: Characters of a name (or of anything else a reply holds) that an error message shows.
SHOWN_CHARACTERS = 60
_SHORT = reprlib.Repr()  # Python 3.11's takes no arguments
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxstring = 2, 4, SHOWN_CHARACTERS
_SHORT.maxother = SHOWN_CHARACTERS
#: The longest ``.npy`` header a standard array may have (format 1.0 stores its length in 2 bytes).
_NPY_HEADER_LIMIT = len(_PREFIX) + 2 + 0xFFFF


def _plain_view(array: Array) -> np.ndarray | None:
    """A read-only view of the data of a plain array's ``.npy`` bytes, or None for anything else."""
    data = array.data
    if array.stype != SType.NUMPY or data[: len(_PREFIX)] != _PREFIX:
        return None
    start = len(_PREFIX) + 2 + int.from_bytes(data[len(_PREFIX) : len(_PREFIX) + 2], "little")
    header = _HEADER.fullmatch(data[len(_PREFIX) + 2 : start])
    if header is None:
        return None
    dtype = np.dtype(header.group(1).decode("ascii"))
    shape = tuple(int(side) for side in header.group(2).split(b",") if side.strip())
    count = int(np.prod(shape, dtype=np.int64))
    if dtype.hasobject or len(data) != start + count * dtype.itemsize:
        return None
    return np.frombuffer(data, dtype=dtype, count=count, offset=start).reshape(shape)


def to_numpy(array: Array) -> np.ndarray:
    """``array.numpy()``, read faster where the bytes are a plain array's ``.npy`` file."""
    view = _plain_view(array)
    return view.copy() if view is not None else array.numpy()


# ----------------------------------------------------------------------
# The packed form
# ----------------------------------------------------------------------


def _packable_dtype(dtype: np.dtype) -> str:
    """``dtype.str``, which rebuilds ``dtype`` exactly; ValueError where it does not."""
    if dtype.hasobject or dtype.fields is not None or np.dtype(dtype.str) != dtype:
        raise ValueError(f"dtype {dtype} has no packed form")
    return dtype.str


def _aligned(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


def _header_bytes(model: Mapping[str, np.ndarray], check: bool = True) -> bytes:
    """The packed header of ``model``: JSON, ``[name, dtype, shape]`` per array.

    Raises
    ------
    ValueError
        With ``check``, when an array has an object or a structured dtype.
    """
    entries = [
        [name, _packable_dtype(array.dtype) if check else array.dtype.str, list(array.shape)]
        for name, array in model.items()
    ]
    return json.dumps(entries, separators=(",", ":")).encode("utf-8")


def pack(model: Mapping[str, np.ndarray]) -> Array:
    """The packed ``Array`` of ``model`` (see the module's notes).

    Raises
    ------
    ValueError
        When an array has an object or a structured dtype.
    """
    arrays = {str(name): np.asarray(array) for name, array in model.items()}
    header = _header_bytes(arrays)
    # C order, as bytes; a view where the array already is C-contiguous.
    buffers = [
        np.require(array, requirements="C").reshape(-1).view(np.uint8)
        for array in arrays.values()
        if array.nbytes
    ]
    parts: list[bytes | memoryview] = [len(header).to_bytes(_LENGTH_BYTES, "little"), header]
    end = _LENGTH_BYTES + len(header)
    for buffer in buffers:
        start = _aligned(end)
        parts.extend((bytes(start - end), buffer.data))
        end = start + buffer.nbytes
    data = b"".join(parts)
    return Array(dtype="uint8", shape=(len(data),), stype=PACKED_STYPE, data=data)


def _named(value: object) -> str:
    """``value`` (a name, a header entry) for an error message: its ``repr``, cut short at a cost
    that does not grow with it."""
    return _SHORT.repr(value)


def _native(array: np.ndarray) -> np.ndarray:
    """``array`` in this machine's byte order (a copy where it is not; torch reads no other)."""
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def _entry(entry: object) -> tuple[str, np.dtype, tuple[int, ...]]:
    """One ``[name, dtype, shape]`` of a packed header, checked."""
    if not (isinstance(entry, list) and len(entry) == 3):
        raise ValueError(f"packed model: header entry {_named(entry)} is not [name, dtype, shape]")
    name, dtype_text, shape = entry
    if not isinstance(name, str) or not isinstance(dtype_text, str):
        raise ValueError(f"packed model: header entry {_named(entry)}: name, dtype not strings")
    if not isinstance(shape, list) or not all(
        isinstance(side, int) and not isinstance(side, bool) and side >= 0 for side in shape
    ):
        raise ValueError(
            f"packed model: {_named(name)}: shape {_named(shape)} is not a list of sizes"
        )
    try:
        dtype = np.dtype(dtype_text)
        _packable_dtype(dtype)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"packed model: {_named(name)}: dtype {_named(dtype_text)}: {err}"
        ) from None
    return name, dtype, tuple(shape)


def _differs(
    name: str, dtype: np.dtype, shape: tuple[int, ...], expected: np.ndarray
) -> str | None:
    """How an array of ``dtype`` and ``shape`` differs from ``expected`` (byte order aside), or None."""
    if dtype.newbyteorder("=") != expected.dtype.newbyteorder("="):
        return f"{_named(name)}: dtype {dtype}, expected {expected.dtype}"
    if shape != expected.shape:
        return f"{_named(name)}: shape {shape}, expected {expected.shape}"
    return None


def _header(data: bytes, expected: Mapping[str, np.ndarray] | None) -> tuple[list, int]:
    """The parsed header of packed bytes, and where it ends.

    With ``expected``, a header longer than twice the one of ``expected``
    (and a kilobyte) is refused before it is parsed: parsing costs what the
    header is long, and a valid one is about as long as ``expected``'s.
    """
    if len(data) < _LENGTH_BYTES:
        raise ValueError(f"packed model of {len(data)} bytes has no header")
    length = int.from_bytes(data[:_LENGTH_BYTES], "little")
    if expected is not None:
        limit = 2 * len(_header_bytes(expected, check=False)) + 1024
        if length > limit:
            raise ValueError(
                f"packed model: a header of {length} bytes, at most {limit} for the "
                f"{len(expected)} arrays expected"
            )
    end = _LENGTH_BYTES + length
    if end > len(data):
        raise ValueError(f"packed model: header of {end} bytes in {len(data)}")
    try:
        entries = json.loads(data[_LENGTH_BYTES:end])
    except (ValueError, RecursionError) as err:  # JSON, UTF-8, nesting
        raise ValueError(f"packed model: unreadable header: {err}") from None
    if not isinstance(entries, list):
        raise ValueError("packed model: the header is not a list")
    if expected is not None and len(entries) != len(expected):
        raise ValueError(f"packed model: {len(entries)} arrays, expected {len(expected)}")
    return entries, end


#: Where one array of a packed model lies: name, dtype, shape, first byte, element count.
_Placed = tuple[str, np.dtype, tuple[int, ...], int, int]


def _layout(data: bytes, expected: Mapping[str, np.ndarray] | None) -> list[_Placed]:
    """Where each array of packed bytes lies, every byte accounted for; nothing is allocated."""
    entries, end = _header(data, expected)
    placed: list[_Placed] = []
    names: set[str] = set()
    for entry in entries:
        name, dtype, shape = _entry(entry)
        if name in names:
            raise ValueError(f"packed model: {_named(name)} twice")
        names.add(name)
        if expected is not None:
            if name not in expected:
                raise ValueError(f"packed model: unexpected array {_named(name)}")
            problem = _differs(name, dtype, shape, expected[name])
            if problem is not None:
                raise ValueError(f"packed model: {problem}")
        count = math.prod(shape)
        size = count * dtype.itemsize
        if size == 0:
            placed.append((name, dtype, shape, 0, 0))
            continue
        start = _aligned(end)
        if data[end:start].count(0) != start - end:
            raise ValueError(f"packed model: bytes other than zeros before {_named(name)}")
        end = start + size
        if end > len(data):
            raise ValueError(
                f"packed model: {_named(name)} {dtype.str}{list(shape)} ends at byte {end} of "
                f"{len(data)}"
            )
        placed.append((name, dtype, shape, start, count))
    if end != len(data):
        raise ValueError(f"packed model: its arrays end at byte {end} of {len(data)}")
    return placed


def unpack(array: Array, expected: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The model a packed ``Array`` holds, each array writable, its own and in native byte order.

    Parameters
    ----------
    array : Array
        A packed model (:data:`PACKED_STYPE`).
    expected : mapping of str to np.ndarray, optional
        The model this one must stand in for (a reply's, the model it was
        sent): its header must list the same number of arrays, each with a
        name of ``expected``, its dtype (in either byte order) and its shape,
        or it is refused before anything is built.

    Raises
    ------
    ValueError
        When ``array`` is not a packed model, its bytes do not hold what
        its header says (truncated, extended, a header that lies), or its
        header does not fit ``expected``. The message names at most one
        array, its name cut to :data:`SHOWN_CHARACTERS` characters.
    """
    if array.stype != PACKED_STYPE:
        raise ValueError(f"not a packed model: stype {_named(array.stype)}")
    data = array.data
    model: dict[str, np.ndarray] = {}
    for name, dtype, shape, start, count in _layout(data, expected):
        if count == 0:
            model[name] = np.zeros(shape, dtype=dtype.newbyteorder("="))
            continue
        view = np.frombuffer(data, dtype=dtype, count=count, offset=start).reshape(shape)
        model[name] = view.copy() if dtype.isnative else _native(view)
    return model


def is_packed(record: ArrayRecord | Mapping[str, Array]) -> bool:
    """Whether ``record`` holds a packed model (a single ``Array`` of :data:`PACKED_STYPE`)."""
    if len(record) != 1:
        return False
    (array,) = record.values()
    return array.stype == PACKED_STYPE


def _views(record: ArrayRecord) -> dict[str, np.ndarray]:
    """A standard record's arrays, as read-only views of its bytes where they are plain."""
    views = {}
    for name, array in record.items():
        view = _plain_view(array)
        views[name] = view if view is not None else array.numpy()
    return views


def packed_record(record: ArrayRecord) -> ArrayRecord:
    """``record`` in the packed form (itself when it is packed already).

    Raises
    ------
    ValueError
        When an array has no packed form (see :func:`pack`) or cannot be read.
    TypeError
        When an array has a serialization type numpy cannot read.
    """
    if is_packed(record):
        return record
    return ArrayRecord({PACKED_NAME: pack(_views(record))})


def _standard_array(array: np.ndarray) -> Array:
    """``Array(array)`` (the same ``.npy`` bytes), writing the data once instead of three times."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(array))
    data = b"".join(
        (
            header.getvalue(),
            np.require(array, requirements="C").reshape(-1).view(np.uint8).data,
        )
    )
    return Array(dtype=str(array.dtype), shape=tuple(array.shape), stype=SType.NUMPY, data=data)


def standard_record(record: ArrayRecord) -> ArrayRecord:
    """``record`` as standard ``Array`` s, one per array (itself when it is not packed).

    Raises
    ------
    ValueError
        When the packed model cannot be read (:func:`unpack`).
    """
    if not is_packed(record):
        return record
    (array,) = record.values()
    return ArrayRecord({name: _standard_array(value) for name, value in unpack(array).items()})


def _check_standard(
    record: ArrayRecord | Mapping[str, Array], expected: Mapping[str, np.ndarray]
) -> None:
    """Refuse a standard record that cannot hold ``expected``, from what it says of its arrays.

    Its count, names, serialization types, dtypes (in either byte order),
    shapes and byte sizes (the data and a ``.npy`` header): nothing is read.
    """
    if len(record) != len(expected):
        raise ValueError(f"{len(record)} arrays, expected {len(expected)}")
    for name, array in record.items():
        if name not in expected:
            raise ValueError(f"unexpected array {_named(name)}")
        if array.stype != SType.NUMPY:
            raise ValueError(f"{_named(name)}: serialization type {_named(array.stype)}")
        try:
            dtype = np.dtype(array.dtype)
        except (TypeError, ValueError):
            raise ValueError(f"{_named(name)}: dtype {_named(array.dtype)}") from None
        problem = _differs(name, dtype, tuple(array.shape), expected[name])
        if problem is not None:
            raise ValueError(problem)
        size = expected[name].nbytes
        if not size < len(array.data) <= size + _NPY_HEADER_LIMIT:
            raise ValueError(f"{_named(name)}: {len(array.data)} bytes for {size} bytes of data")


def to_numpy_dict(
    record: ArrayRecord | Mapping[str, Array], expected: Mapping[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """``{name: np.ndarray}`` of a record's model, in its order, from either form.

    Parameters
    ----------
    record : ArrayRecord
        A model, standard or packed.
    expected : mapping of str to np.ndarray, optional
        The model this one must stand in for (a reply's, the model it was
        sent). A record whose count of arrays, names, dtypes, shapes or byte
        sizes differ from it is refused before any array is read, so that
        reading a hostile reply costs no more than reading a valid one; the
        arrays come in this machine's byte order. The values of the arrays
        are not checked (:func:`fedx.ops.find_problem` does).

    Raises
    ------
    ValueError
        When a packed model cannot be read (:func:`unpack`), as
        ``Array.numpy()``, or when the record does not fit ``expected``.
    """
    if is_packed(record):
        (array,) = record.values()
        return unpack(array, expected)
    if expected is None:
        return {name: to_numpy(array) for name, array in record.items()}
    _check_standard(record, expected)
    return {name: _native(to_numpy(array)) for name, array in record.items()}


# ----------------------------------------------------------------------
# Messages
# ----------------------------------------------------------------------


def packs_models(content: RecordDict) -> bool:
    """Whether a message's content holds a packed model."""
    return any(is_packed(record) for record in content.array_records.values())


def pack_models(content: RecordDict, packed: dict[int, ArrayRecord] | None = None) -> RecordDict:
    """``content`` with every model (a non-empty ``ArrayRecord``) packed.

    A new ``RecordDict`` holding the same other records; ``content`` is not
    changed. A record with an array that has no packed form stays standard.
    ``packed`` keeps the packed records by the ``id`` of the original, for
    messages that share one (Flower's strategies send one ``RecordDict`` to
    every node of an evaluation): pass the same dict for messages built
    together, and drop it with them.
    """
    packed = {} if packed is None else packed
    records = {}
    for name, record in content.items():
        if isinstance(record, ArrayRecord) and len(record) > 0:
            if id(record) not in packed:
                try:
                    packed[id(record)] = packed_record(record)
                except (TypeError, ValueError):
                    packed[id(record)] = record  # it travels standard, as it is
            record = packed[id(record)]
        records[name] = record
    return RecordDict(records)


def unpack_models(content: RecordDict) -> RecordDict:
    """``content`` with every packed model as standard ``Array`` s (a new ``RecordDict``).

    Raises
    ------
    ValueError
        When a packed model cannot be read (:func:`unpack`).
    """
    return RecordDict(
        {
            name: standard_record(r) if isinstance(r, ArrayRecord) else r
            for name, r in content.items()
        }
    )
