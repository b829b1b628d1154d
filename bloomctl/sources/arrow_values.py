"""Small Arrow values made from their buffers.

``pa.array()`` and ``pa.scalar()`` first ask whether their input is a pandas object, and to ask,
pyarrow imports pandas wherever it is installed: 0.24 s of a rebuild's start that reads no
DataFrame (the dask extra brings pandas along). Made from buffers, these values never ask.
"""

from __future__ import annotations

import struct
from array import array
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - annotations only: pyarrow loads when a batch is read
    import pyarrow as pa


def binary_scalar(value: bytes) -> pa.Scalar:
    """``value`` as an Arrow binary scalar."""
    import pyarrow as pa

    offsets = pa.py_buffer(struct.pack("<ii", 0, len(value)))
    return pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(value)])[0]


def int64_array(values: list[int]) -> pa.Array:
    """``values`` as an Arrow int64 array (indexes for ``take``)."""
    import pyarrow as pa

    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(array("q", values))])


def bool_array(mask: Any) -> pa.Array:
    """A numpy bool array as an Arrow one (a mask for ``filter``)."""
    import numpy as np
    import pyarrow as pa

    bits = np.packbits(np.asarray(mask, dtype=bool), bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(mask), [None, pa.py_buffer(bits)])


def zero_of(kind: pa.DataType) -> pa.Scalar:
    """0 as an Arrow scalar of the integer type ``kind``."""
    import numpy as np
    import pyarrow as pa

    zero = np.zeros(1, dtype=np.dtype(f"int{kind.bit_width}"))
    return pa.Array.from_buffers(kind, 1, [None, pa.py_buffer(zero)])[0]


def false_scalar() -> pa.Scalar:
    """False as an Arrow scalar."""
    import pyarrow as pa

    return pa.Array.from_buffers(pa.bool_(), 1, [None, pa.py_buffer(b"\x00")])[0]
