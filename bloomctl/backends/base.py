"""The backend seam: what one kind of filter must do on the server, and the state it reports.

``Backend`` is the interface the lifecycle, the rebuild and the transfer talk to: besides the
filter's commands it answers what they would otherwise ask its name for (whether it grows, shards,
deletes, how it is dumped and loaded). ``FilterState`` and ``SubFilterState`` are a filter's
numbers as the server reports them, and what follows from them (fill, estimated FPR).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from bloomctl.defaults import AUTO, DEFAULT_BATCH_SIZE, DEFAULT_EXPANSION
from bloomctl.errors import StateConflict, UsageError
from bloomctl.keys import to_display
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.sizing.bloom import Plan, estimated_fpr, validate_expansion
from bloomctl.sizing.bloom import plan as make_plan
from bloomctl.sizing.cuckoo import REDISBLOOM, CuckooPlan, full_load, lookup_fpr

AnyPlan = Plan | CuckooPlan  # a Bloom filter's plan, or a cuckoo filter's


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

    kind = "bloom"  # the filter type: bloom, or cuckoo (CuckooState)

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
            "type": self.kind,
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


@dataclass(frozen=True)
class CuckooSubState:
    """One sub-filter of a cuckoo filter: its buckets, and (measured) how many slots hold a fingerprint."""

    index: int
    buckets: int
    bucket_size: int
    occupied: int | None = None  # exact, from a scan of the slots; None until measured

    @property
    def slots(self) -> int:
        return self.buckets * self.bucket_size

    def as_dict(self, fingerprint_bits: int) -> dict[str, Any]:
        load = None if self.occupied is None else self.occupied / self.slots
        return {
            "index": self.index,
            "buckets": self.buckets,
            "slots": self.slots,
            "occupied": self.occupied,
            "load_factor": load,
            "estimated_fpr": None if load is None else lookup_fpr(load, self.bucket_size, fingerprint_bits),
        }


@dataclass(frozen=True)
class CuckooState(FilterState):
    """A cuckoo filter's numbers (CF.INFO, or the module-free filter's header). ``capacity`` is every
    sub-filter's slots, ``fill_ratio`` the load factor (items / slots), judged against the load at
    which inserts start to fail (``full_load``, measured per bucket size and MAXITERATIONS)."""

    kind = "cuckoo"

    buckets: int = 0  # of the first sub-filter
    bucket_size: int = 0
    max_iterations: int = 0
    deletes: int = 0
    fingerprint_bits: int = 8
    engine: str = "redisbloom"
    cuckoo_subs: tuple[CuckooSubState, ...] = ()

    @property
    def reserved_capacity(self) -> int:
        return self.buckets * self.bucket_size

    @property
    def load_factor(self) -> float:
        return self.items / self.capacity if self.capacity else 0.0

    @property
    def fill_ratio(self) -> float:
        return self.load_factor

    @property
    def full_load(self) -> float:
        return full_load(self.bucket_size, self.max_iterations, self.engine)

    @property
    def exact(self) -> bool:
        return bool(self.cuckoo_subs) and all(sub.occupied is not None for sub in self.cuckoo_subs)

    @property
    def estimated_fpr(self) -> float | None:
        """1 - prod(1 - fpr_i) over the sub-filters: measured loads with ``exact``, else the items
        spread over every slot."""
        if not self.capacity:
            return None
        if self.exact:
            survive = 1.0
            for sub in self.cuckoo_subs:
                survive *= 1 - lookup_fpr((sub.occupied or 0) / sub.slots, self.bucket_size, self.fingerprint_bits)
            return 1 - survive
        return lookup_fpr(self.load_factor, self.bucket_size, self.fingerprint_bits, max(self.filters, 1))

    def as_dict(self) -> dict[str, Any]:
        data = super().as_dict()
        data.update(
            load_factor=self.load_factor,
            full_load=self.full_load,
            deleted=self.deletes,
            buckets=self.buckets,
            bucket_size=self.bucket_size,
            max_iterations=self.max_iterations,
            fingerprint_bits=self.fingerprint_bits,
            subfilters=[sub.as_dict(self.fingerprint_bits) for sub in self.cuckoo_subs],
        )
        return data


def cuckoo_subs(buckets: int, bucket_size: int, growth: int, filters: int) -> tuple[CuckooSubState, ...]:
    """Sub-filter i has ``buckets * growth^i`` buckets (RedisBloom's CuckooFilter_Grow)."""
    return tuple(CuckooSubState(i, buckets * max(growth, 1) ** i, bucket_size) for i in range(filters))


def in_range(value: Any, low: int, high: int | None = None) -> bool:
    """Whether ``value`` is an int, not a bool, from ``low`` up to ``high``: a number of a dump's header."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)


class DumpMismatch(ValueError):
    """A dumped chunk is not the filter its dump's header describes: the transfer reports it as a
    corrupt dump."""


def changed_while_dumped(key: bytes) -> StateConflict:
    """The error of a dump whose filter was replaced or grew while its chunks were read."""
    return StateConflict(
        "the filter %r changed while it was being dumped (a swap, a rollback, or a new sub-filter): dump it again",
        to_display(key),
    )


class Backend(ABC):
    """One way of keeping a Bloom filter on a Redis server."""

    name: str
    kind = "bloom"  # the filter type it keeps: bloom or cuckoo
    redis_type: bytes  # what TYPE answers for a key of this backend
    magic: bytes = b""  # what the value starts with, where TYPE alone does not tell (checked by SWAP_LUA)
    grows: bool = True  # whether a full filter adds sub-filters (EXPANSION) rather than filling up
    batch_size: int = DEFAULT_BATCH_SIZE  # items per add command: well under 20 ms on the server
    engine = REDISBLOOM  # the cuckoo engine that sizes a cuckoo plan for this backend (sizing.cuckoo)
    shardable = True  # whether one filter may be split over several keys (shards)
    # Whether it keeps taking items past its capacity, its error rate climbing, where the others
    # grow a sub-filter or refuse the item: past its capacity a rebuild and a swap refuse it.
    overfills = False
    removes_items = False  # whether items can be deleted again, so that its item count can drop
    counts_copies = False  # whether an item added twice is held twice: a rebuild adds each distinct item once
    # Whether an application's writes during a rebuild go through the function library into a log
    # that the rebuild replays, rather than straight into the standby.
    logs_dual_writes = False
    # Whether a client can compute the filter's bytes from the items alone: a Bloom filter's bits
    # can, a cuckoo filter's slots depend on the order of its inserts and only the server knows them.
    client_buildable = True
    dump_command: str | None = None  # the command that reads it in chunks (SCANDUMP); None: the string, in slices
    load_command: str | None = None  # the command that loads those chunks; None: the string is written whole
    # Whether a dump is read a second time and compared: where chunks can move without any count
    # changing, nothing else shows that the filter changed during the dump.
    rereads_dump = False
    module_free = False  # whether it runs on any server, without RedisBloom's commands
    needs_library = False  # whether it, or the application's writes to it during a rebuild, call the function library
    made_by_plain_add = False  # whether a plain add on a missing key creates one with the server's defaults
    command_group = ""  # its commands' group in doctor's table of the commands bloomctl sends (bf, cf, bitmap)

    def scannable_on(self, server: ServerInfo) -> bool:
        """Whether SCAN TYPE may ask ``server`` for this backend's keys: Valkey refuses a type that no
        loaded module defines."""
        return True

    def is_requested(self, requested: str) -> bool:
        """Whether the option value ``requested`` asks for this very backend (by its name, or auto)."""
        return requested in (AUTO, self.name)

    def batch_for(self, plan: AnyPlan) -> int:
        """Items per add command for a filter of ``plan``: well under 20 ms on the server."""
        return self.batch_size

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
    def check_plan(self, plan: AnyPlan, line: str | None = None) -> AnyPlan:
        """The plan as this backend builds it on the server ``line`` (``ServerInfo.line``; None: as
        given), or a UsageError when it cannot hold it."""

    @abstractmethod
    def size_bytes(self, plan: AnyPlan) -> int:
        """What ``info`` will report as the size of a new filter with this plan."""

    def bloom_plan(self, plan: AnyPlan) -> Plan:
        """``plan`` when it is a Bloom filter's; a cuckoo plan is refused."""
        if not isinstance(plan, Plan):
            raise UsageError("the %s backend keeps Bloom filters: give a Bloom filter plan (`error_rate`)", self.name)
        return plan

    @abstractmethod
    def owns(self, client: RedisClient, key: bytes, kind: bytes) -> bool:
        """Whether ``key`` (whose TYPE is ``kind``) holds a filter of this backend."""

    def select(self, node: RedisClient, keys: list[bytes]) -> list[bytes]:
        """Of ``keys`` (all of this backend's Redis type), those that hold its filters: one pipeline."""
        return keys

    @abstractmethod
    def reserve(self, client: RedisClient, key: bytes, plan: AnyPlan) -> None: ...

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

    # --- dump and restore, in the formats docs/dump-format.md describes ------------------------

    def dump_chunks(self, client: RedisClient, key: bytes, size_bytes: int) -> Iterator[tuple[int, bytes]]:
        """The filter at ``key`` as its dump's (cursor, data) chunks; ``size_bytes`` is what ``info``
        reported for it."""
        raise NotImplementedError

    def dump_changed(self, key: bytes) -> StateConflict:
        """The error of a dump that found the filter changed after its chunks were read."""
        return changed_while_dumped(key)

    def dump_member_ok(self, member: dict[str, Any]) -> bool:
        """Whether a dump header's member carries the fields this backend's filters need, in range."""
        return True

    def reserved_error_rate(self, member: dict[str, Any]) -> float:
        """The error rate a dumped member was reserved with, from its sub-filters' (its metadata
        holds none)."""
        first: float = member["error_rates"][0]
        return first

    def restore_plan(self, member: dict[str, Any], error_rate: float, expansion: int | None) -> AnyPlan:
        """The plan a dumped member is restored as (for its metadata), with the dump's error rate
        and expansion."""
        return make_plan(member["capacity"], error_rate, expansion)

    def check_first_chunk(self, data: bytes, member: dict[str, Any]) -> int | None:
        """Raise ``DumpMismatch`` unless the first chunk of a dumped member (the filter's header, or
        the first slice of its string) is the filter ``member`` describes. Returns the item count
        that header holds where the restore checks the fingerprints it loads against it, else None."""
        raise NotImplementedError

    def data_sizes(self, member: dict[str, Any]) -> list[int] | None:
        """Each sub-filter's bytes of data in a dumped member whose chunks a restore loads by their
        cursor, where the restore must see each byte arrive once (a Bloom filter's bits are counted
        anyway); None: not checked so."""
        return None

    def fingerprints_in(self, data: bytes, offset: int, member: dict[str, Any]) -> int:
        """The fingerprints a loaded data chunk at ``offset`` holds (a cuckoo filter's taken slots,
        which must add up to its header's item count); 0 for a Bloom filter."""
        return 0

    def load_commands(self, key: bytes, cursor: int, data: bytes) -> list[tuple[Any, ...]]:
        """The commands that load one dumped chunk into ``key``, for a backend with ``load_command``."""
        raise NotImplementedError

    def reserve_like(self, key: bytes, member: dict[str, Any]) -> tuple[Any, ...] | None:
        """The command that reserves an empty filter at ``key`` like a dumped member, where the
        server's dump of an empty filter holds no chunks; None where every dump holds chunks."""
        return None

    def check_loaded(self, client: RedisClient, key: bytes, member: dict[str, Any], name: str) -> None:
        """Raise ``VerifyFailed`` where the restored value at ``key`` is by itself not the filter
        ``member`` describes (a string's header and length); ``info`` checks the rest."""
        return None

    def loads_reach_replicas(self, line: str) -> bool:
        """Whether what ``load_command`` writes reaches the replicas of a server of ``line``."""
        return True

    @staticmethod
    def parse_flags(reply: Sequence[Any]) -> list[bool]:
        """A reply of MADD/MEXISTS form: one 1 or 0 per item."""
        return [flag == 1 for flag in reply]

    def count_added(self, reply: Sequence[Any], expected: int) -> int | str:
        """The items an add command's reply says were new, or what went wrong (text). A Bloom
        filter's add answers 1 (new) or 0 (seen) per item, and stops at the first error."""
        added = reply.count(1)  # list.count runs in C: this path is hot, so no Python loop on success
        if len(reply) == expected and (added == expected or added + reply.count(0) == expected):
            return added
        errors = [flag for flag in reply if isinstance(flag, Exception)]
        return str(errors[0]) if errors else f"{len(reply)} results for a batch of {expected}: {reply[:3]}"
