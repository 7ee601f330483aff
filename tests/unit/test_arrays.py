"""fedx.arrays: a Flower Array read as Array.numpy() reads it, for every array np.save writes."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from fedx.arrays import to_numpy, to_numpy_dict

ARRAYS = {
    "float32": np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7,
    "float64 column": np.linspace(0, 1, 5)[:, None],
    "float16": np.array([1.5, -2.25], dtype=np.float16),
    "int64 scalar": np.array(42, dtype=np.int64),
    "uint8": np.arange(10, dtype=np.uint8),
    "bool": np.array([True, False]),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "big-endian": np.arange(4, dtype=">i4"),
    "complex": np.array([1 + 2j], dtype=np.complex64),
    "fortran order": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
    "structured": np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
    "long header": np.zeros((1,) * 20, dtype=np.float32),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_an_array_reads_as_flower_reads_it(name):
    array = Array(ARRAYS[name])
    expected, got = array.numpy(), to_numpy(array)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()
    assert got.flags.writeable  # the reader's own array, as np.load gives
    assert (got.flags.c_contiguous, got.flags.f_contiguous) == (
        expected.flags.c_contiguous,
        expected.flags.f_contiguous,
    )
    if got.dtype.names is None:
        got[...] = 0  # writing it leaves the message alone
    assert array.numpy().tobytes() == expected.tobytes()


def test_damaged_bytes_fail_as_flower_fails():
    array = Array(ARRAYS["float32"])
    short = Array(dtype=array.dtype, shape=array.shape, stype=array.stype, data=array.data[:-4])
    with pytest.raises(ValueError):
        short.numpy()
    with pytest.raises(ValueError):
        to_numpy(short)


def test_a_record_keeps_its_order():
    record = ArrayRecord({name: Array(ARRAYS[name]) for name in ("uint8", "float32", "bool")})
    assert list(to_numpy_dict(record)) == ["uint8", "float32", "bool"]
