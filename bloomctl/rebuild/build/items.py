"""A batch of items as one byte buffer and offsets (Arrow's layout), whatever the source gave.

Sources yield lists of bytes (the server path sends those as they are) or, reading through
Arrow, binary arrays whose buffers numpy can read without copying. The client build hashes the
buffer; only the bitmap backend's SHA-1 needs the items one by one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bloomctl.sources.base import is_arrow


def buffers(batch: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``(data, offsets)``: item i is ``data[offsets[i]:offsets[i + 1]]``; offsets start at 0."""
    if is_arrow(batch):
        return _arrow_buffers(batch)
    lengths = np.fromiter(map(len, batch), dtype=np.int64, count=len(batch))
    offsets = np.zeros(len(batch) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.frombuffer(b"".join(batch), dtype=np.uint8), offsets


def _arrow_buffers(array: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    import pyarrow as pa

    if array.null_count:
        raise ValueError("a batch of items must not hold nulls")
    large = pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type)
    _validity, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if large else np.int32)
    offsets = offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, dtype=np.uint8)
    start = int(offsets[0]) if len(offsets) else 0
    return data[start : int(offsets[-1])], offsets - start
