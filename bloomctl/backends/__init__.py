"""Backends: the commands that create, read and fill one Bloom filter on the server.

The lifecycle (reserve, info, fill-ratio, swap, ...) talks only to this seam. A backend is
stateless; every method takes the redis-py client explicitly (standalone, cluster or pipeline).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from bloomctl.planner import estimated_fpr


@dataclass(frozen=True)
class SubFilterState:
    """One sub-filter as the server holds it now."""

    index: int
    capacity: int
    items: int
    error_rate: float
    hashes: int
    bits: int
    bytes: int
    bits_set: int | None = None  # exact, from a full scan; None until measured

    @property
    def fill_ratio(self) -> float:
        return self.items / self.capacity if self.capacity else 0.0

    @property
    def bit_fill(self) -> float:
        """Fraction of bits set: measured when known, else the expectation 1 - e^(-k n / m)."""
        if self.bits_set is not None:
            return self.bits_set / self.bits if self.bits else 0.0
        return 1 - math.exp(-self.hashes * self.items / self.bits) if self.bits else 0.0

    @property
    def estimated_fpr(self) -> float:
        if self.bits_set is not None:
            return self.bit_fill**self.hashes
        return estimated_fpr(self.items, self.bits, self.hashes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "capacity": self.capacity,
            "items": self.items,
            "error_rate": self.error_rate,
            "hashes": self.hashes,
            "bits": self.bits,
            "bytes": self.bytes,
            "bits_set": self.bits_set,
            "bit_fill": self.bit_fill,
            "estimated_fpr": self.estimated_fpr,
        }


@dataclass(frozen=True)
class FilterState:
    """A filter's numbers as reported by the server, plus what follows from them."""

    backend: str
    capacity: int
    size_bytes: int
    filters: int
    items: int
    expansion: int | None  # None: NONSCALING
    subfilters: tuple[SubFilterState, ...] = field(default=())

    @property
    def nonscaling(self) -> bool:
        return self.expansion is None

    @property
    def reserved_capacity(self) -> int:
        """The capacity given to BF.RESERVE: the first sub-filter's, not the grown total."""
        if self.subfilters:
            return self.subfilters[0].capacity
        if self.expansion is None or self.filters <= 1:
            return self.capacity
        return round(self.capacity / sum(self.expansion**i for i in range(self.filters)))

    @property
    def fill_ratio(self) -> float:
        """Items per reserved capacity: above 1.0 a scaling filter has grown (more memory, slower
        lookups, compounding error) and a NONSCALING one refuses new items."""
        return self.items / self.reserved_capacity if self.reserved_capacity else 0.0

    @property
    def estimated_fpr(self) -> float | None:
        """1 - prod(1 - fpr_i) over the sub-filters; None when the sub-filters are unknown."""
        if not self.subfilters:
            return None
        survive = 1.0
        for sub in self.subfilters:
            survive *= 1 - sub.estimated_fpr
        return 1 - survive

    @property
    def exact(self) -> bool:
        return bool(self.subfilters) and all(sub.bits_set is not None for sub in self.subfilters)

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "capacity": self.capacity,
            "reserved_capacity": self.reserved_capacity,
            "size_bytes": self.size_bytes,
            "filters": self.filters,
            "items": self.items,
            "expansion": self.expansion,
            "nonscaling": self.nonscaling,
            "fill_ratio": self.fill_ratio,
            "estimated_fpr": self.estimated_fpr,
            "exact": self.exact,
            "subfilters": [sub.as_dict() for sub in self.subfilters],
        }
