"""A model's arrays as Flower's messages carry them, read without ``np.load``'s header parsing.

A Flower ``Array`` holds one array as the bytes of a NumPy ``.npy`` file
(``np.save``). ``Array.numpy()`` reads them with ``np.load``, which parses
the file's header with ``ast.literal_eval``: for digits' CNN that is most of
the time it takes (0.21 ms for its 8 arrays, against 0.05 ms here), and a
server reads K models every round, a simulation worker one or two per
message. :func:`to_numpy` reads the header that ``np.save`` writes for a
plain array (format 1.0, one type, C order) with a regular expression and
gives anything else (another format version, a Fortran-ordered or a
structured array, another serialization type, bytes of the wrong length) to
``Array.numpy()``. Either way the result is what ``Array.numpy()`` gives: a
writable array that owns its data.

numpy and Flower only, so the strategies and the ClientApp both use it.
"""

import re
from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.common.constant import SType

# What np.save writes before the data: magic string, format version 1.0, header length.
_PREFIX = b"\x93NUMPY\x01\x00"
_HEADER = re.compile(
    rb"\{'descr': '([<>|=]?[a-zA-Z]\d*)', 'fortran_order': False, 'shape': \(([0-9, ]*)\), \} *\n"
)


def to_numpy(array: Array) -> np.ndarray:
    """``array.numpy()``, read faster where the bytes are a plain array's ``.npy`` file."""
    data = array.data
    if array.stype == SType.NUMPY and data[: len(_PREFIX)] == _PREFIX:
        start = len(_PREFIX) + 2 + int.from_bytes(data[len(_PREFIX) : len(_PREFIX) + 2], "little")
        header = _HEADER.fullmatch(data[len(_PREFIX) + 2 : start])
        if header is not None:
            dtype = np.dtype(header.group(1).decode("ascii"))
            shape = tuple(int(side) for side in header.group(2).split(b",") if side.strip())
            count = int(np.prod(shape, dtype=np.int64))
            if not dtype.hasobject and len(data) == start + count * dtype.itemsize:
                flat = np.frombuffer(data, dtype=dtype, count=count, offset=start)
                return flat.reshape(shape).copy()
    return array.numpy()


def to_numpy_dict(record: ArrayRecord | Mapping[str, Array]) -> dict[str, np.ndarray]:
    """``{name: np.ndarray}`` of a record's arrays, in the record's order."""
    return {name: to_numpy(array) for name, array in record.items()}
