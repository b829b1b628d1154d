"""MurmurHash64A, vectorised with numpy: the hash RedisBloom uses for 64-bit filters.

The items arrive as one byte buffer and offsets (Arrow's layout), so no Python object is made
per item. Each 8-byte block is read as a little-endian word through a one-byte-stride uint64
view of the buffer (x86 and ARM64 read unaligned words), and the tail is the same kind of word
masked to its length, which is exactly the C code's byte-by-byte XOR of the tail.
"""

from __future__ import annotations

from typing import Any

import numpy as np

M = np.uint64(0xC6A4A7935BD1E995)
R = np.uint64(47)
SEED = 0xC6A4A7935BD1E995  # RedisBloom's first seed (bloom_calc_hash64); the second is the first hash
_TAIL_MASKS = np.array([(1 << (8 * t)) - 1 for t in range(8)], dtype=np.uint64)


def words_view(data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Every 8-byte little-endian word of ``data`` (padded by 8 zero bytes), one per byte offset."""
    padded = np.concatenate([data, np.zeros(8, dtype=np.uint8)])
    return np.ndarray(shape=(len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))


class Blocks:
    """The mixed 8-byte blocks and the tails of a batch of items, shared by both hashes.

    Items keep their order (sorting by length would scatter the reads): block j is read for every
    item and kept only where the item is long enough.
    """

    def __init__(self, data: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]) -> None:
        starts = offsets[:-1].astype(np.int64)
        lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
        self.lengths = lengths.astype(np.uint64)
        words = words_view(data)
        nblocks = lengths // 8
        fewest = int(nblocks.min()) if len(nblocks) else 0
        most = int(nblocks.max()) if len(nblocks) else 0
        # (k mixed, None when every item has block j, else the mask of the items that have it)
        self.mixed: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]] = []
        last = len(words) - 1
        for j in range(most):
            at = starts + 8 * j
            if j >= fewest:  # shorter items have no block j: read anywhere, the mask drops it
                np.minimum(at, last, out=at)
            k = words[at]
            k *= M
            k ^= k >> R
            k *= M
            self.mixed.append((k, None if j < fewest else nblocks > j))
        tails = lengths & 7
        self.has_tail = tails > 0
        self.tails = words[starts + 8 * nblocks] & _TAIL_MASKS[tails]

    def hash(self, seeds: np.ndarray[Any, Any] | int) -> np.ndarray[Any, Any]:
        """MurmurHash64A of every item with ``seeds`` (one per item, or one for all)."""
        h = np.asarray(seeds, dtype=np.uint64) ^ (self.lengths * M)
        if h.shape != self.lengths.shape:
            h = np.broadcast_to(h, self.lengths.shape).copy()
        for k, active in self.mixed:
            if active is None:
                h ^= k
                h *= M
            else:
                h = np.where(active, (h ^ k) * M, h)
        h = np.where(self.has_tail, (h ^ self.tails) * M, h)
        h ^= h >> R
        h *= M
        h ^= h >> R
        return h


def hash_pair(
    data: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """RedisBloom's two hashes of every item (a with the fixed seed, b seeded with a)."""
    blocks = Blocks(data, offsets)
    a = blocks.hash(SEED)
    return a, blocks.hash(a)
