"""Cuckoo filter planning: predict, to the byte, what RedisBloom's CF.RESERVE allocates, and how
full such a filter can get before an insert fails.

RedisBloom (``src/cuckoo.c``, both the 2.8 line and Redis 8) rounds ``capacity / bucket size`` up
to a power of two buckets, keeps one byte per slot (an 8-bit fingerprint, ``hash % 255 + 1``),
rounds the expansion up to a power of two, and gives sub-filter i ``buckets * expansion^i``
buckets. CF.INFO ``Size`` is ``40 + 16 * filters + slots``: the C structs and one byte a slot.

A cuckoo filter fills up long before every slot is taken: an insert that finds no free slot in
its two buckets relocates up to MAXITERATIONS fingerprints, and when that fails the filter grows
(or, with EXPANSION 0, answers "Filter is full"). ``FULL_LOAD`` holds where that first happened on
real servers (docs/cuckoo.md has the measurements); the planner and the fill-ratio thresholds use it.

The module-free backend (``lua-cuckoo``) keeps the same bucket layout in one string, with 8, 16 or
32-bit fingerprints and a 64-byte header, and never grows.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from bloomctl.errors import UsageError

REDISBLOOM, LUA = "redisbloom", "lua"  # the two engines: RedisBloom's CF.*, and bloomctl's function library
DEFAULT_BUCKET_SIZE = 2  # CF.RESERVE's defaults (RedisBloom and Redis 8's cf-* configs)
DEFAULT_MAX_ITERATIONS = 20
DEFAULT_CUCKOO_EXPANSION = 1
MAX_BUCKET_SIZE = 255
MAX_ITERATIONS = 65_535
MAX_CUCKOO_EXPANSION = 32_768
MAX_SUBFILTERS = 32  # cf-max-expansions (Redis 8) / CF_MAX_EXPANSIONS (2.8): inserts then fail
REDIS8_MAX_CAPACITY = 1 << 30  # cf-initial-size's maximum on Redis 8
CF_STRUCT_BYTES = 40  # sizeof(CuckooFilter)
SUBCF_STRUCT_BYTES = 16  # sizeof(SubCF): bucket count and size in one word, the data pointer
LUA_HEADER_BYTES = 64
LUA_MAX_BYTES = 512 * 1024 * 1024  # a Redis string
LUA_MAX_BUCKETS = 1 << 30  # the Lua code XORs bucket numbers as 32-bit integers
FINGERPRINT_BITS = (8, 16, 32)
DEFAULT_LUA_FINGERPRINT_BITS = 16

# The load factor (items / slots) at which the first insert failed on a real server: the lowest of
# several runs with distinct random items (docs/cuckoo.md has every run), rounded down. Keyed by
# bucket size, then by the smallest MAXITERATIONS of the column; a size or count between two
# measured ones takes the lower one's (conservative). RedisBloom (2.8.20 and Redis 8, the same code
# and results), filters of 4k to 6M slots (larger ones fail a little earlier): its relocation
# takes the victim slot in turn (0, 1, 0, 1, ...), so with two slots a bucket the walk soon cycles
# and more iterations barely help. The module-free filter (16k, 128k and 1M slots, 8 and 16-bit
# fingerprints, some 0.03 taken off for larger filters) picks the victim at random.
FULL_LOAD: dict[str, dict[int, dict[int, float]]] = {
    REDISBLOOM: {
        1: {1: 0.18},
        2: {1: 0.40, 50: 0.42},
        3: {1: 0.69, 50: 0.83, 100: 0.89, 200: 0.91, 500: 0.93},
        4: {1: 0.75, 50: 0.87, 100: 0.90, 200: 0.93, 500: 0.95},
        8: {1: 0.83, 50: 0.92, 100: 0.94, 200: 0.97, 500: 0.98},
    },
    LUA: {
        1: {1: 0.28, 100: 0.30},
        2: {1: 0.60, 100: 0.78, 500: 0.84},
        3: {1: 0.68, 100: 0.86, 500: 0.91},
        4: {1: 0.72, 100: 0.89, 500: 0.93},
        8: {1: 0.84, 100: 0.94, 500: 0.96},
    },
}
WARN_SHARE = 0.8  # fill-ratio warns at this share of the full load, and fails at the full load


def full_load(bucket_size: int, max_iterations: int, engine: str = REDISBLOOM) -> float:
    """The load factor at which inserts may start to fail (a scaling filter then grows): the
    measured value for the largest measured bucket size not above ``bucket_size`` and the largest
    measured MAXITERATIONS not above ``max_iterations`` (conservative in between)."""
    table = FULL_LOAD[engine]
    size = max(b for b in table if b <= bucket_size)
    column = table[size]
    return column[max(m for m in column if m <= max_iterations)]


def next_power_of_two(n: int) -> int:
    """RedisBloom's getNextN2: 0 stays 0, a power of two stays itself."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def fingerprint_values(bits: int) -> int:
    """How many fingerprint values there are: RedisBloom's 8-bit ones are 1..255 (0 is an empty slot)."""
    return (1 << bits) - 1


def lookup_fpr(load: float, bucket_size: int, fingerprint_bits: int, filters: int = 1) -> float:
    """The false-positive rate of a lookup: each of the ``2 * bucket_size`` slots of its two buckets
    (in every sub-filter) holds a fingerprint with probability ``load``, equal to the item's with
    probability 1 / (2^f - 1)."""
    miss = 1 - 1 / fingerprint_values(fingerprint_bits)
    return 1 - miss ** (2 * bucket_size * max(load, 0.0) * filters)


@dataclass(frozen=True)
class CuckooSubFilter:
    index: int
    buckets: int
    bucket_size: int

    @property
    def slots(self) -> int:
        return self.buckets * self.bucket_size


@dataclass(frozen=True)
class CuckooPlan:
    """A cuckoo filter as CF.RESERVE (``engine`` redisbloom) or bloomctl's module-free backend
    (``lua``) builds it. ``expansion`` None: never grows (EXPANSION 0)."""

    capacity: int
    bucket_size: int = DEFAULT_BUCKET_SIZE
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    expansion: int | None = DEFAULT_CUCKOO_EXPANSION
    fingerprint_bits: int = 8
    engine: str = REDISBLOOM
    items: int | None = None
    target_error_rate: float | None = None  # what was asked for (None: not given)
    chain: tuple[CuckooSubFilter, ...] = field(init=False)

    kind = "cuckoo"

    def __post_init__(self) -> None:
        first = CuckooSubFilter(0, self.buckets, self.bucket_size)
        object.__setattr__(self, "chain", self._grow(first))

    # --- what the module computes -------------------------------------------------------------

    @property
    def buckets(self) -> int:
        """Buckets of the first sub-filter: ``capacity / bucket size`` (integer division) rounded up
        to a power of two, at least 1."""
        return max(next_power_of_two(self.capacity // self.bucket_size), 1)

    @property
    def slots(self) -> int:
        return self.buckets * self.bucket_size

    @property
    def scaling(self) -> bool:
        return self.expansion is not None

    @property
    def growth(self) -> int:
        """The expansion as the module keeps it: rounded up to a power of two (0: never grows)."""
        return next_power_of_two(self.expansion) if self.expansion is not None else 0

    @property
    def error_rate(self) -> float:
        """The false-positive rate once the filter is as full as it gets before inserts fail (the
        number recorded as the filter's error rate)."""
        return lookup_fpr(self.full_load, self.bucket_size, self.fingerprint_bits)

    @property
    def worst_error_rate(self) -> float:
        """With every slot taken: ``2 * bucket size / (2^f - 1)`` at most."""
        return lookup_fpr(1.0, self.bucket_size, self.fingerprint_bits)

    @property
    def full_load(self) -> float:
        return full_load(self.bucket_size, self.max_iterations, self.engine)

    @property
    def usable_capacity(self) -> int:
        """Items the first sub-filter takes before inserts may start to fail (or the filter grows)."""
        return math.floor(self.slots * self.full_load)

    @property
    def size_bytes(self) -> int:
        """What CF.INFO Size (or the module-free string's STRLEN) reports right after the reserve."""
        return memory_bytes(self.chain[:1], self.engine, self.fingerprint_bits)

    @property
    def total_memory_bytes(self) -> int:
        return memory_bytes(self.chain, self.engine, self.fingerprint_bits)

    def _grow(self, first: CuckooSubFilter) -> tuple[CuckooSubFilter, ...]:
        """The sub-filters a scaling filter will have once ``items`` are in, taking each as full at
        the measured full load (the module adds one whenever an insert fails in the newest)."""
        chain = [first]
        if self.items is None or not self.scaling:
            return tuple(chain)
        growth = self.growth
        while self.full_load * sum(s.slots for s in chain) < self.items and len(chain) < MAX_SUBFILTERS:
            chain.append(CuckooSubFilter(len(chain), first.buckets * growth ** len(chain), self.bucket_size))
        return tuple(chain)

    @property
    def total_slots(self) -> int:
        return sum(sub.slots for sub in self.chain)

    @property
    def load_at_items(self) -> float | None:
        return None if self.items is None else self.items / self.total_slots

    @property
    def error_rate_at_items(self) -> float | None:
        """The false-positive rate with ``items`` spread over the projected sub-filters."""
        load = self.load_at_items
        if load is None:
            return None
        return lookup_fpr(min(load, 1.0), self.bucket_size, self.fingerprint_bits, len(self.chain))

    # --- advice -----------------------------------------------------------------------------------

    def warnings(self) -> list[str]:
        notes = []
        target = self.target_error_rate
        if target is not None and self.error_rate > target:
            notes.append(self._error_rate_advice(target))
        if self.items is not None:
            notes += self._items_advice(self.items)
        return notes

    def _error_rate_advice(self, target: float) -> str:
        from bloomctl.sizing.bloom import format_rate

        have = (
            f"bucket size {self.bucket_size} with {self.fingerprint_bits}-bit fingerprints gives up to "
            f"{format_rate(self.error_rate)} false positives (at the {self.full_load:.0%} load it fills to)"
        )
        fits = [b for b in range(self.bucket_size - 1, 0, -1) if self.with_bucket_size(b).error_rate <= target]
        if self.engine == LUA:
            wider = [f for f in FINGERPRINT_BITS if self._with(fingerprint_bits=f).error_rate <= target]
            if wider:
                return f"{have}, above the target {format_rate(target)}: use `fingerprint_bits` {wider[0]}"
        if fits:
            return (
                f"{have}, above the target {format_rate(target)}: use `bucket_size` {fits[0]} (fuller buckets "
                "mean more fingerprints to compare), or a Bloom filter"
            )
        return (
            f"{have}, above the target {format_rate(target)}, and no smaller bucket size reaches it with "
            f"{self.fingerprint_bits}-bit fingerprints: use a Bloom filter"
            + (", or the module-free backend's 16-bit fingerprints" if self.engine == REDISBLOOM else "")
        )

    def _items_advice(self, items: int) -> list[str]:
        usable = self.usable_capacity
        if items <= usable:
            return []
        needed = math.ceil(items / self.full_load)
        if not self.scaling:
            return [
                f"{items:,} items overfill this filter: inserts may fail from about {usable:,} items "
                f"({self.full_load:.0%} of its {self.slots:,} slots); reserve a capacity of at least {needed:,}"
            ]
        if len(self.chain) >= MAX_SUBFILTERS and self.full_load * self.total_slots < items:
            return [
                f"{items:,} items need more than {MAX_SUBFILTERS} sub-filters, after which inserts fail "
                f"('Maximum expansions reached'): reserve a capacity of at least {needed:,}"
            ]
        return [
            f"{items:,} items grow this filter to {len(self.chain)} sub-filters (inserts start failing in "
            f"the first at about {usable:,} items, {self.full_load:.0%} of its slots): every lookup checks "
            f"each one, so the false-positive rate multiplies; reserve a capacity of at least {needed:,}"
        ]

    def for_engine(self, engine: str) -> CuckooPlan:
        """The same filter on the other engine: the module-free one never grows and picks its own
        fingerprint size (from the target error rate); RedisBloom's fingerprints are 8 bits."""
        if engine == self.engine:
            return self
        if engine == LUA:
            return cuckoo_plan(
                self.capacity,
                bucket_size=self.bucket_size,
                max_iterations=self.max_iterations,
                expansion=None,
                engine=LUA,
                error_rate=self.target_error_rate,
                items=self.items,
            )
        return self._with(engine=REDISBLOOM, fingerprint_bits=8)

    def with_bucket_size(self, bucket_size: int) -> CuckooPlan:
        return self._with(bucket_size=bucket_size)

    def _with(self, **changes: Any) -> CuckooPlan:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "type": "cuckoo",
            "capacity": self.capacity,
            "bucket_size": self.bucket_size,
            "max_iterations": self.max_iterations,
            "expansion": self.expansion,
            "nonscaling": not self.scaling,
            "growth": self.growth,
            "fingerprint_bits": self.fingerprint_bits,
            "buckets": self.buckets,
            "slots": self.slots,
            "full_load": self.full_load,
            "usable_capacity": self.usable_capacity,
            "error_rate": self.error_rate,
            "worst_error_rate": self.worst_error_rate,
            "target_error_rate": self.target_error_rate,
            "size_bytes": self.size_bytes,
        }
        if self.items is not None:
            data.update(
                items=self.items,
                filters=len(self.chain),
                total_slots=self.total_slots,
                total_memory_bytes=self.total_memory_bytes,
                load=self.load_at_items,
                error_rate_at_items=self.error_rate_at_items,
                chain=[{"index": s.index, "buckets": s.buckets, "slots": s.slots} for s in self.chain],
            )
        data["warnings"] = self.warnings()
        return data


def memory_bytes(chain: tuple[CuckooSubFilter, ...], engine: str, fingerprint_bits: int = 8) -> int:
    if engine == LUA:
        return LUA_HEADER_BYTES + sum(sub.slots for sub in chain) * fingerprint_bits // 8
    return CF_STRUCT_BYTES + sum(SUBCF_STRUCT_BYTES + sub.slots for sub in chain)


def _whole(value: object, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError("`%s` must be a whole number from %s to %s, got %r", what, f"{low:,}", f"{high:,}", value)
    return value


def fingerprint_bits_for(error_rate: float | None, bucket_size: int, max_iterations: int) -> int:
    """The module-free backend's fingerprint size: the smallest that meets ``error_rate`` at the
    filter's full load (16 bits when no rate is given)."""
    if error_rate is None:
        return DEFAULT_LUA_FINGERPRINT_BITS
    load = full_load(bucket_size, max_iterations, LUA)
    for bits in FINGERPRINT_BITS:
        if lookup_fpr(load, bucket_size, bits) <= error_rate:
            return bits
    return FINGERPRINT_BITS[-1]


def cuckoo_plan(
    capacity: int,
    *,
    bucket_size: int = DEFAULT_BUCKET_SIZE,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    expansion: int | None = DEFAULT_CUCKOO_EXPANSION,
    engine: str = REDISBLOOM,
    error_rate: float | None = None,
    fingerprint_bits: int | None = None,
    items: int | None = None,
) -> CuckooPlan:
    """Validate the inputs (RedisBloom's own limits) and size the filter. ``expansion`` None: never
    grows; the module-free engine never grows."""
    _whole(capacity, 1, 2**62, "capacity")
    _whole(bucket_size, 1, MAX_BUCKET_SIZE, "bucket_size")
    _whole(max_iterations, 1, MAX_ITERATIONS, "max_iterations")
    if capacity < 2 * bucket_size:
        raise UsageError(
            "a cuckoo filter's `capacity` must be at least twice its `bucket_size` (%s), got %s",
            2 * bucket_size,
            capacity,
        )
    if expansion is not None:
        _whole(expansion, 1, MAX_CUCKOO_EXPANSION, "expansion")
    if error_rate is not None and not 0 < error_rate < 1:
        raise UsageError("`error_rate` must be strictly between 0 and 1, got %r", error_rate)
    if items is not None:
        _whole(items, 0, 2**62, "items")
    if engine == LUA:
        if expansion is not None:
            raise UsageError("the module-free cuckoo filter never grows: use `nonscaling` (or leave `expansion` out)")
        bits = (
            fingerprint_bits
            if fingerprint_bits is not None
            else fingerprint_bits_for(error_rate, bucket_size, max_iterations)
        )
        if bits not in FINGERPRINT_BITS:
            raise UsageError("`fingerprint_bits` must be 8, 16 or 32, got %r", bits)
    else:
        if fingerprint_bits not in (None, 8):
            raise UsageError("RedisBloom's cuckoo filters have 8-bit fingerprints: leave out `fingerprint_bits`")
        bits = 8
    p = CuckooPlan(capacity, bucket_size, max_iterations, expansion, bits, engine, items, error_rate)
    if engine == LUA and (p.buckets > LUA_MAX_BUCKETS or p.size_bytes > LUA_MAX_BYTES):
        raise UsageError(
            "%s bytes exceed Redis's 512 MB string limit: lower `capacity` or `fingerprint_bits`", f"{p.size_bytes:,}"
        )
    return p


def for_cuckoo_line(p: CuckooPlan, line: str | None) -> CuckooPlan:
    """Redis 8 refuses a cuckoo capacity above 2^30 (cf-initial-size's maximum); 2.8 does not."""
    if line == "redis8" and p.engine == REDISBLOOM and p.capacity > REDIS8_MAX_CAPACITY:
        raise UsageError(
            "Redis 8 takes a cuckoo filter capacity of at most %s: lower `capacity`", f"{REDIS8_MAX_CAPACITY:,}"
        )
    return p
