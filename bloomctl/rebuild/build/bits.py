"""A filter's bit array, built in the client, with the item count the server would keep.

The server counts an add when it sets at least one bit that was not set before (BF.CARD, and the
bitmap backend's items field). Adding a whole batch at once must count exactly that, in the
source's order: item j of a batch is new when one of its positions was unset before the batch
and no earlier item of the batch has that position. Sorting (position, item) pairs puts every
position's first item first, and turns the bit reads and writes into near-sequential sweeps:
one vectorised sort per batch, no Python loop per item.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from bloomctl.defaults import COUNT_TOLERANCE

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


POPCOUNT_CHUNK = 1 << 20  # bytes counted at a time: no temporary the size of the filter


def counted_by_the_server(distinct: float, bits: int, hashes: int) -> float:
    """What a server counts adding ``distinct`` distinct items one by one: each item but those
    whose bits were all set already (a false positive, with probability (1 - e^(-kx/m))^k after
    x items), integrated by Simpson's rule."""
    if math.isinf(distinct) or distinct <= 0:
        return distinct
    steps = 1000  # even

    def false_positive(x: float) -> float:
        return float((1 - math.exp(-hashes * x / bits)) ** hashes)

    width = distinct / steps
    inner = sum((4 if i % 2 else 2) * false_positive(i * width) for i in range(1, steps))
    return distinct - (false_positive(0) + inner + false_positive(distinct)) * width / 3


@functools.cache
def _popcounts() -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The set bits of every byte value."""
    import numpy as np

    return np.array([bin(value).count("1") for value in range(256)], dtype=np.uint8)


def estimated_items(data: Any, bits: int, hashes: int) -> tuple[float, float]:
    """Distinct items a Bloom filter of ``bits`` and ``hashes`` holds, from its X set bits, and the
    estimate's standard error: n = -(m/k) ln(1 - X/m) (Swamidass and Baldi), and from the variance
    of X for kn throws into m bits, m p (1 - (1 + kn/m) p) with p = e^(-kn/m) the unset share, the
    error sd(X) / (k p). Infinite when every bit is set."""
    import numpy as np

    table = _popcounts()
    set_bits = sum(
        int(table[data[start : start + POPCOUNT_CHUNK]].sum(dtype=np.int64))
        for start in range(0, len(data), POPCOUNT_CHUNK)
    )
    if set_bits >= bits:
        return math.inf, math.inf
    unset = 1 - set_bits / bits
    estimate = -(bits / hashes) * math.log(unset)
    variance = bits * unset * max(1 - (1 - math.log(unset)) * unset, 0.0)
    return estimate, math.sqrt(variance) / (hashes * unset)


def with_dual_writes(ours: int, theirs: int, union: Any, bits: int, hashes: int, capacity: int) -> int:
    """The count a client build records where the application's dual writes had counted
    ``theirs`` in the standby and the build ``ours``, its bits and theirs merged into ``union``:
    the sum, unless it passes the estimate from the union's bits by more than the estimate's
    noise (4 standard errors, and at least ``COUNT_TOLERANCE``), or passes ``capacity`` where the
    estimate does not. An item both in the source and written by the application is counted by
    both; the filter then records what a server counts adding that many distinct items, never
    less than either count. (An inflated count makes the filter look fuller than it is, and its
    dump is refused: its bits do not hold its count. Past its capacity a NONSCALING RedisBloom
    filter refuses every new item: the application's adds after the swap would all be lost.)"""
    total = ours + theirs
    if not theirs:
        return total
    estimate, error = estimated_items(union, bits, hashes)
    over = total > estimate + max(COUNT_TOLERANCE * estimate, 4 * error)
    full = total > capacity >= estimate  # repeats, within the estimate's noise, must not fill it
    if over or full:
        return max(round(counted_by_the_server(estimate, bits, hashes)), ours, theirs)
    return total
