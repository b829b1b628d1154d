"""Backends: the commands that create, read and fill one Bloom filter on the server.

The lifecycle (reserve, info, fill-ratio, swap, ...) talks only to this seam. Two backends
implement it: ``redisbloom`` (the BF.* commands) and ``bitmap`` (a plain string hashed by
server-side Lua, for servers without modules). Every method takes the redis-py client
explicitly (standalone or cluster). An existing key's backend is recognised from the key.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bloomctl.errors import KeyMissing, UsageError, WrongType
from bloomctl.keys import to_display
from bloomctl.planner import Plan, estimated_fpr

if TYPE_CHECKING:  # pragma: no cover
    from bloomctl.server import ServerInfo

AUTO = "auto"


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

    @abstractmethod
    def check_plan(self, plan: Plan) -> Plan:
        """The plan, or a UsageError when this backend cannot hold it."""

    @abstractmethod
    def size_bytes(self, plan: Plan) -> int:
        """What ``info`` will report as the size of a new filter with this plan."""

    @abstractmethod
    def owns(self, client: Any, key: bytes, kind: bytes) -> bool:
        """Whether ``key`` (whose TYPE is ``kind``) holds a filter of this backend."""

    def select(self, node: Any, keys: list[bytes]) -> list[bytes]:
        """Of ``keys`` (all of this backend's Redis type), those that hold its filters: one pipeline."""
        return keys

    @abstractmethod
    def reserve(self, client: Any, key: bytes, plan: Plan) -> None: ...

    @abstractmethod
    def info(self, client: Any, key: bytes, *, with_header: bool = True) -> FilterState: ...

    @abstractmethod
    def bit_fill(self, client: Any, key: bytes) -> FilterState:
        """``info`` with the exact number of set bits of every sub-filter."""

    @abstractmethod
    def card(self, client: Any, key: bytes) -> int:
        """Items added (each add that set at least one new bit), 0 for a missing key."""

    @abstractmethod
    def madd(self, client: Any, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        """Add items; True for each one that was new."""

    @abstractmethod
    def mexists(self, client: Any, key: bytes, items: Sequence[bytes | str]) -> list[bool]: ...

    @abstractmethod
    def madd_command(self, client: Any, key: bytes, items: Sequence[bytes | str]) -> tuple[Any, ...]:
        """The command that adds ``items``, for a pipeline; its reply goes through ``parse_flags``."""

    @abstractmethod
    def mexists_command(self, client: Any, key: bytes, items: Sequence[bytes | str]) -> tuple[Any, ...]:
        """The command that checks ``items``, for a pipeline; its reply goes through ``parse_flags``."""

    @staticmethod
    def parse_flags(reply: Sequence[Any]) -> list[bool]:
        """A reply of MADD/MEXISTS form: one 1 or 0 per item."""
        return [flag == 1 for flag in reply]


_BACKENDS: dict[str, Backend] = {}


def get(name: str) -> Backend:
    """The backend called ``name`` (``redisbloom`` or ``bitmap``)."""
    if not _BACKENDS:
        from bloomctl.backends.bitmap import Bitmap
        from bloomctl.backends.redisbloom import RedisBloom

        _BACKENDS.update({"redisbloom": RedisBloom(), "bitmap": Bitmap()})
    try:
        return _BACKENDS[name]
    except KeyError:
        raise UsageError(f"unknown backend {name!r}: choose auto, redisbloom or bitmap") from None


def names() -> list[str]:
    return ["redisbloom", "bitmap"]


def choose(server: ServerInfo, requested: str = AUTO) -> Backend:
    """The backend for a new filter: RedisBloom where the server has BF.*, else the bitmap one."""
    if requested == AUTO:
        return get("redisbloom" if server.has_bloom else "bitmap")
    if requested == "redisbloom":
        server.require_bloom()
    return get(requested)


TYPE_NAMES = {
    b"string": "a string",
    b"hash": "a hash",
    b"list": "a list",
    b"set": "a set",
    b"zset": "a sorted set",
    b"stream": "a stream",
    b"MBbloomCF": "a cuckoo filter",
    b"ReJSON-RL": "a JSON document",
}


def key_type(client: Any, key: bytes) -> bytes:
    kind = client.type(key)
    return kind if isinstance(kind, bytes) else str(kind).encode()


def describe_type(kind: bytes) -> str:
    return TYPE_NAMES.get(kind, kind.decode(errors="replace"))


def for_key(client: Any, key: bytes, role: str = "filter") -> Backend:
    """The backend of the filter at ``key``, recognised from the key itself."""
    kind = key_type(client, key)
    if kind == b"none":
        raise KeyMissing(f"{role} {to_display(key)!r} does not exist")
    for name in names():
        backend = get(name)
        if backend.owns(client, key, kind):
            return backend
    detail = (
        "a string that is not a bloomctl filter" if kind == b"string" else f"{describe_type(kind)}, not a Bloom filter"
    )
    raise WrongType(f"{role} {to_display(key)!r} holds {detail}")
