"""Plaintext format of one exchanged layer: a JSON header and raw array bytes.

A layer is one or more named tensors (one per state-dict entry, or a whole
module's with ``grouping="module"``). The header records the layer index and
each tensor's name, dtype and shape; the tensors' C-order bytes follow. No
pickle: decoding accepts plain numeric dtypes only, and checks that the sizes
add up exactly.
"""

import json
import struct

import numpy as np

from fedx.ops import Model

_HEADER_LENGTH = struct.Struct("<I")
#: numpy dtype kinds a layer may hold: bool, signed and unsigned integers,
#: floating point and complex numbers (never objects).
_NUMERIC_KINDS = frozenset("biufc")


def encode_layer(layer: int, tensors: Model) -> bytes:
    """Serialize layer ``layer`` (its tensors, in order) to bytes."""
    # np.asarray, not np.ascontiguousarray: the latter turns 0-d arrays
    # (BatchNorm's num_batches_tracked) into 1-d ones.
    arrays = {name: np.asarray(array, order="C") for name, array in tensors.items()}
    header = {
        "layer": layer,
        "tensors": [[name, a.dtype.str, list(a.shape)] for name, a in arrays.items()],
    }
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return b"".join(
        [_HEADER_LENGTH.pack(len(encoded)), encoded, *(a.tobytes() for a in arrays.values())]
    )


def decode_layer(data: bytes) -> tuple[int, Model]:
    """Read a layer written by :func:`encode_layer`.

    Returns
    -------
    tuple[int, Model]
        The layer index and its tensors (fresh arrays, in the sender's order).

    Raises
    ------
    ValueError
        When the bytes are not a well-formed layer.
    """
    if len(data) < _HEADER_LENGTH.size:
        raise ValueError("layer data is shorter than its header length")
    (length,) = _HEADER_LENGTH.unpack_from(data)
    body_start = _HEADER_LENGTH.size + length
    try:
        header = json.loads(data[_HEADER_LENGTH.size : body_start].decode("utf-8"))
        layer, entries = int(header["layer"]), header["tensors"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"layer header cannot be read: {err}") from None
    tensors: Model = {}
    offset = body_start
    for name, dtype_text, shape in entries:
        dtype = np.dtype(dtype_text)
        if dtype.kind not in _NUMERIC_KINDS:
            raise ValueError(f"{name}: dtype {dtype} is not numeric")
        shape = tuple(int(n) for n in shape)
        size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        if offset + size > len(data):
            raise ValueError(f"{name}: layer data ends early")
        flat = np.frombuffer(data, dtype, count=size // dtype.itemsize, offset=offset)
        tensors[name] = flat.reshape(shape).copy()
        offset += size
    if offset != len(data):
        raise ValueError(f"layer data has {len(data) - offset} trailing bytes")
    return layer, tensors
