"""An independent Python model of a RedisBloom scaling chain (MurmurHash64A double hashing).

Used only by tests, to check measured values (bit fill, item counts) against what the module
must hold, computed without asking the module.
"""

from __future__ import annotations

from bloomctl.sizing.bloom import ERROR_TIGHTENING_RATIO, SubFilter

M64 = 0xFFFFFFFFFFFFFFFF
_M = 0xC6A4A7935BD1E995
_R = 47


def murmur64a(data: bytes, seed: int) -> int:
    h = (seed ^ (len(data) * _M)) & M64
    tail_at = len(data) - len(data) % 8
    for i in range(0, tail_at, 8):
        k = int.from_bytes(data[i : i + 8], "little")
        k = (k * _M) & M64
        k ^= k >> _R
        k = (k * _M) & M64
        h ^= k
        h = (h * _M) & M64
    tail = data[tail_at:]
    if tail:
        h ^= int.from_bytes(tail, "little")
        h = (h * _M) & M64
    h ^= h >> _R
    h = (h * _M) & M64
    h ^= h >> _R
    return h


def positions(item: bytes, bits: int, hashes: int) -> list[int]:
    a = murmur64a(item, 0xC6A4A7935BD1E995)
    b = murmur64a(item, a)
    return [((a + i * b) & M64) % bits for i in range(hashes)]


class ModelChain:
    def __init__(self, capacity: int, error_rate: float, expansion: int | None) -> None:
        self.expansion = expansion
        first_error = error_rate * (ERROR_TIGHTENING_RATIO if expansion else 1)
        self.links: list[tuple[SubFilter, bytearray, list[int]]] = []
        self._add_link(SubFilter.sized(0, capacity, first_error))

    def _add_link(self, sub: SubFilter) -> None:
        self.links.append((sub, bytearray(sub.bytes), [0]))

    def _has(self, sub: SubFilter, bits: bytearray, item: bytes) -> bool:
        return all(bits[x >> 3] & (1 << (x & 7)) for x in positions(item, sub.bits, sub.hashes))

    def add(self, item: bytes) -> bool:
        if any(self._has(sub, bits, item) for sub, bits, _ in self.links):
            return False
        sub, bits, count = self.links[-1]
        if count[0] >= sub.capacity:
            if self.expansion is None:
                raise OverflowError("non scaling filter is full")
            self._add_link(SubFilter.sized(sub.index + 1, sub.capacity * self.expansion, sub.error_rate * 0.5))
            sub, bits, count = self.links[-1]
        for x in positions(item, sub.bits, sub.hashes):
            bits[x >> 3] |= 1 << (x & 7)
        count[0] += 1
        return True

    def bits_set(self) -> list[int]:
        return [int.from_bytes(bits, "little").bit_count() for _, bits, _ in self.links]

    def items(self) -> list[int]:
        return [count[0] for _, _, count in self.links]

    def raw(self) -> list[bytes]:
        return [bytes(bits) for _, bits, _ in self.links]
