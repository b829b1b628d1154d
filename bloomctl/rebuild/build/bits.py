"""A filter's bit array, built in the client, with the item count the server would keep.

The server counts an add when it sets at least one bit that was not set before (BF.CARD, and the
bitmap backend's items field). Adding a whole batch at once must count exactly that, in the
source's order: item j of a batch is new when one of its positions was unset before the batch
and no earlier item of the batch has that position. Sorting (position, item) pairs puts every
position's first item first, and turns the bit reads and writes into near-sequential sweeps:
one vectorised sort per batch, no Python loop per item.
"""

from __future__ import annotations

from typing import Any

import numpy as np

ITEM_BITS = 24  # a step holds fewer than 2**24 items: the item's index sits below the position
MAX_BATCH = 1 << ITEM_BITS
_ITEM_BITS = np.uint64(ITEM_BITS)
_ITEM_MASK = np.uint64(MAX_BATCH - 1)
_THREE, _SEVEN = np.uint64(3), np.uint64(7)
STEP = 1 << 14  # items per step (see add)


class BitArray:
    """``nbytes`` of filter bits; bit ``p`` is in byte ``p >> 3``, least significant bit first
    (RedisBloom) or most significant first (Redis's own bit order: the bitmap backend)."""

    def __init__(self, nbytes: int, *, msb_first: bool) -> None:
        if nbytes * 8 >= 1 << (64 - ITEM_BITS):
            raise ValueError(f"a filter of {nbytes:,} bytes is too large to build in the client")
        self.data = np.zeros(nbytes, dtype=np.uint8)
        self.msb_first = msb_first
        self.count = 0  # items that set a new bit, as the server counts them
        bits = range(7, -1, -1) if msb_first else range(8)
        self._mask_table = np.array([1 << bit for bit in bits], dtype=np.uint8)  # position & 7 -> mask

    def add(self, positions: np.ndarray[Any, Any]) -> int:
        """Set the bits of a batch (``positions``: one row of k positions per item, in source order).
        Returns how many items were new, as the server would have counted them one by one.

        Works through the batch in steps of ``STEP`` items: the sort keys of a step stay in the
        processor's cache (twice as fast as one step of 65,536). Splitting a step over threads,
        each taking a range of positions, was measured no faster on 2 cores."""
        new = 0
        for start in range(0, positions.shape[0], STEP):
            new += self._add(positions[start : start + STEP])
        self.count += new
        return new

    def _add(self, positions: np.ndarray[Any, Any]) -> int:
        """How many items of one step own a position no earlier item set."""
        n = positions.shape[0]
        if n == 0:
            return 0
        keys = positions << _ITEM_BITS
        keys |= np.arange(n, dtype=np.uint64)[:, None]
        keys = keys.reshape(-1)
        keys.sort()
        where = keys >> _ITEM_BITS
        byte = (where >> _THREE).view(np.int64)  # positions are far below 2**63: a view, not a copy
        masks = self._mask_table[(where & _SEVEN).view(np.int64)]
        take = (self.data[byte] & masks) == 0  # unset before this step ...
        take[1:] &= where[1:] != where[:-1]  # ... and this entry is its position's first item
        chosen = np.flatnonzero(take)
        if chosen.size == 0:
            return 0
        new = np.zeros(n, dtype=bool)
        new[(keys[chosen] & _ITEM_MASK).view(np.int64)] = True
        byte, masks = byte[chosen], masks[chosen]  # distinct positions, sorted: group them by byte
        starts = np.flatnonzero(np.concatenate(([True], byte[1:] != byte[:-1])))
        self.data[byte[starts]] |= np.bitwise_or.reduceat(masks, starts)
        return int(np.count_nonzero(new))

    def merge(self, other: np.ndarray[Any, Any]) -> None:
        """OR another array of the same size into this one (bits read back, or a partial build)."""
        np.bitwise_or(self.data, other, out=self.data)
