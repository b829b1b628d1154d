"""The backend seam: what one kind of filter must do on the server, and the state it reports.

``Backend`` is the interface the lifecycle talks to; ``FilterState`` and ``SubFilterState`` are a
filter's numbers as the server reports them, and what follows from them (fill, estimated FPR).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bloomctl.client import RedisClient
from bloomctl.defaults import DEFAULT_BATCH_SIZE, DEFAULT_EXPANSION
from bloomctl.errors import UsageError
from bloomctl.planner import Plan, estimated_fpr, validate_expansion


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


class Backend(ABC):
    """One way of keeping a Bloom filter on a Redis server."""

    name: str
    redis_type: bytes  # what TYPE answers for a key of this backend
    magic: bytes = b""  # what the value starts with, where TYPE alone does not tell (checked by SWAP_LUA)
    grows: bool = True  # whether a full filter adds sub-filters (EXPANSION) rather than filling up
    batch_size: int = DEFAULT_BATCH_SIZE  # items per add command: well under 20 ms on the server

    def expansion_for(self, expansion: int | None, nonscaling: bool, recorded: str | None = None) -> int | None:
        """The planner's expansion (None: NONSCALING) from the options, else from the ``recorded``
        metadata value (``"nonscaling"`` or a number), else the default."""
        if nonscaling and expansion is not None:
            raise UsageError("`expansion` and `nonscaling` exclude each other")
        if not self.grows:
            if expansion is not None:
                raise UsageError("%s filters do not grow: leave out `expansion`", self.name)
            return None
        if nonscaling:
            return None
        if expansion is not None:
            return validate_expansion(expansion)
        if recorded == "nonscaling":
            return None
        return int(recorded) if recorded else DEFAULT_EXPANSION

    @abstractmethod
    def check_plan(self, plan: Plan, line: str | None = None) -> Plan:
        """The plan as this backend builds it on the server ``line`` (``ServerInfo.line``; None: as
        given), or a UsageError when it cannot hold it."""

    @abstractmethod
    def size_bytes(self, plan: Plan) -> int:
        """What ``info`` will report as the size of a new filter with this plan."""

    @abstractmethod
    def owns(self, client: RedisClient, key: bytes, kind: bytes) -> bool:
        """Whether ``key`` (whose TYPE is ``kind``) holds a filter of this backend."""

    def select(self, node: Any, keys: list[bytes]) -> list[bytes]:
        """Of ``keys`` (all of this backend's Redis type), those that hold its filters: one pipeline."""
        return keys

    @abstractmethod
    def reserve(self, client: RedisClient, key: bytes, plan: Plan) -> None: ...

    @abstractmethod
    def info(self, client: RedisClient, key: bytes, *, with_header: bool = True) -> FilterState: ...

    @abstractmethod
    def bit_fill(self, client: RedisClient, key: bytes) -> FilterState:
        """``info`` with the exact number of set bits of every sub-filter."""

    @abstractmethod
    def card(self, client: RedisClient, key: bytes) -> int:
        """Items added (each add that set at least one new bit), 0 for a missing key."""

    @abstractmethod
    def madd(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        """Add items; True for each one that was new."""

    @abstractmethod
    def mexists(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]: ...

    @abstractmethod
    def madd_command(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> tuple[Any, ...]:
        """The command that adds ``items``, for a pipeline; its reply goes through ``parse_flags``."""

    @abstractmethod
    def mexists_command(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> tuple[Any, ...]:
        """The command that checks ``items``, for a pipeline; its reply goes through ``parse_flags``."""

    @staticmethod
    def parse_flags(reply: Sequence[Any]) -> list[bool]:
        """A reply of MADD/MEXISTS form: one 1 or 0 per item."""
        return [flag == 1 for flag in reply]
