"""Capacity planning: predict, to the byte, what RedisBloom allocates for a Bloom filter.

The arithmetic mirrors RedisBloom's ``deps/bloom/bloom.c`` (``bloom_init`` with FORCE64|NOROUND)
and ``src/sb.c`` (scaling chains): a scaling filter's first sub-filter is built with half the
requested error rate, and every later sub-filter halves it again while its capacity grows by the
expansion factor. BF.INFO ``Size`` is the sum of the sub-filters' bit arrays plus the C structs
that hold them; the two constants below were measured on RedisBloom 2.8 (Redis 7.0) and are
checked against a real server by the test suite.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bloomctl.defaults import DEFAULT_EXPANSION, MAX_SHARDS
from bloomctl.errors import UsageError

# RedisBloom's own truncated constants (bloom.c), not math.log(2): for error rates that are powers
# of two the hash count (a ceil of a product that lands near a whole number) depends on them.
LN2 = 0.693147180559945
LN2_SQUARED = 0.480453013918201
ERROR_TIGHTENING_RATIO = 0.5  # RedisBloom sb.c: every sub-filter of a scaling chain halves the error
CHAIN_OVERHEAD_BYTES = 32  # sizeof(SBChain): filters pointer, size, nfilters, options, growth
LINK_OVERHEAD_BYTES = 64  # sizeof(SBLink): struct bloom (56) + the link's item count (8)
MAX_SUBFILTERS_BEFORE_WARNING = 4
MAX_CHAIN = 64  # the planner stops projecting growth here (the warning says so)
NONSCALING_WARN_FILL = 0.8
MAX_EXPANSION = 32_768  # RedisBloom on Redis 8: bf-expansion-factor's maximum

_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9, "t": 10**12}
_NUMBER_RE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9_]*)?(?:e[+-]?[0-9]+)?)\s*([kmgbt]?)\s*$", re.I)


def parse_count(text: str | int, what: str = "capacity") -> int:
    """Parse ``1000000``, ``1_000_000``, ``1e6``, ``1M`` or ``2.5k`` into a whole number."""
    if isinstance(text, int):
        value: float = text
    else:
        match = _NUMBER_RE.match(str(text))
        if not match:
            raise UsageError("%s %r is not a number (examples: 1000000, 1_000_000, 1e6, 1M, 2.5k)", what, text)
        value = float(match.group(1).replace("_", "")) * _SUFFIXES[match.group(2).lower()]
    if not math.isfinite(value) or value >= 2**63:
        raise UsageError("%s %r is too large", what, text)
    if value != int(value):
        raise UsageError("%s %r is not a whole number", what, text)
    if value < 1:
        raise UsageError("%s must be at least 1, got %r", what, text)
    return int(value)


# Byte sizes mean what redis.conf means (memtoull in Redis's util.c, case-insensitive): k, m and g
# are powers of 1000, kb, mb and gb powers of 1024, and b is a byte. A count's b is a billion, so the
# two parsers must never share a table. t and tb extend Redis's list in its own pattern, and the IEC
# names are what bloomctl itself prints (human_bytes).
SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 2**10,
    "m": 10**6,
    "mb": 2**20,
    "g": 10**9,
    "gb": 2**30,
    "t": 10**12,
    "tb": 2**40,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9_]*)?(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.I)
SIZE_EXAMPLES = "1073741824, 512mb, 1gb, 1GiB, 500M"


def parse_size(text: str | int, what: str = "size") -> int:
    """Parse a byte size as redis.conf spells it: ``1gb`` is 2**30 bytes and ``1g`` is 10**9;
    also ``1GiB``, ``1_000_000`` and ``1e9``."""
    if isinstance(text, int):
        value: float = text
    else:
        match = _SIZE_RE.match(str(text))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in SIZE_UNITS:
            raise UsageError("%s %r is not a size in bytes (examples: %s)", what, text, SIZE_EXAMPLES)
        value = float(match.group(1).replace("_", "")) * SIZE_UNITS[unit]
    if not math.isfinite(value) or value >= 2**63:
        raise UsageError("%s %r is too large", what, text)
    if value != int(value):
        raise UsageError("%s %r is not a whole number of bytes", what, text)
    if value < 1:
        raise UsageError("%s must be at least 1 byte, got %r", what, text)
    return int(value)


# The server lines bloomctl plans for: Redis 8 (Bloom filters built in, RedisBloom 8), RedisBloom
# 2.x as a module (Redis 6/7, Redis Stack), and the module-free bitmap backend.
SERVER_LINES = ("redis8", "redisbloom2", "bitmap")
DEFAULT_LINE = "redis8"  # what most new deployments run
REDIS8_ERROR_RATE_CAP = 0.25  # BF_ERROR_RATE_CAP in RedisBloom 8 (src/config.h): a larger rate is taken as it
REDIS8_MAX_CAPACITY = 1 << 30  # bf-initial-size's maximum in RedisBloom 8 (src/config.c)


def for_line(p: Plan, line: str) -> Plan:
    """The plan as ``line`` builds it: Redis 8 takes an error rate above 0.25 as 0.25 (BF.RESERVE
    logs "Error rate is capped") and refuses a capacity above 2**30; RedisBloom 2.x and the bitmap
    backend take the plan as it is."""
    if line not in SERVER_LINES:
        raise UsageError("unknown server line %r (one of %s)", line, ", ".join(SERVER_LINES))
    if line != "redis8":
        return p
    if p.capacity > REDIS8_MAX_CAPACITY:
        raise UsageError(
            "Redis 8 takes a capacity of at most %s per filter: split it over shards (`shards`)",
            f"{REDIS8_MAX_CAPACITY:,}",
        )
    if p.error_rate > REDIS8_ERROR_RATE_CAP:
        return replace(p, error_rate=REDIS8_ERROR_RATE_CAP, capped_from=p.error_rate)
    return p


MIN_ERROR_RATE = 1e-100  # beyond any use (330 bits an item), and the arithmetic stays finite


def parse_error_rate(text: str | float) -> float:
    """Parse ``0.01`` or ``1%`` into a probability strictly between 0 and 1."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError("error rate %r is not a number (examples: 0.01, 1%%)", text) from None
    if not 0 < value < 1:
        raise UsageError("error rate must be strictly between 0 and 1 (0%% and 100%%), got %r", text)
    if value < MIN_ERROR_RATE:
        raise UsageError(
            "error rate %r is below %s: no filter is that exact (over 300 bits an item)", text, MIN_ERROR_RATE
        )
    return value


def validate_expansion(expansion: int) -> int:
    """1 to 32,768: RedisBloom on Redis 8 refuses more, and 2.8 keeps the factor in 32 bits (an
    expansion of 2**40 was stored as 0)."""
    if not _whole(expansion) or not 1 <= expansion <= MAX_EXPANSION:
        raise UsageError("`expansion` must be a whole number from 1 to %s, got %r", f"{MAX_EXPANSION:,}", expansion)
    return int(expansion)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def bits_per_item(error_rate: float) -> float:
    return -(math.log(error_rate) / LN2_SQUARED)


@dataclass(frozen=True)
class SubFilter:
    """One link of a RedisBloom scaling chain, as ``bloom_init`` sizes it."""

    index: int
    capacity: int
    error_rate: float
    bits_per_item: float
    hashes: int
    bits: int
    bytes: int

    @classmethod
    def sized(cls, index: int, capacity: int, error_rate: float) -> SubFilter:
        bpe = bits_per_item(error_rate)
        # C truncates the double when assigning to uint64_t, and keeps at least one bit
        raw_bits = max(int(capacity * bpe), 1)
        # FORCE64|NOROUND: round up to whole 64-bit words, no power-of-two rounding
        nbytes = (raw_bits // 64 + (1 if raw_bits % 64 else 0)) * 8
        return cls(
            index=index,
            capacity=capacity,
            error_rate=error_rate,
            bits_per_item=bpe,
            hashes=math.ceil(LN2 * bpe),
            bits=nbytes * 8,
            bytes=nbytes,
        )


@dataclass(frozen=True)
class Plan:
    kind = "bloom"  # the filter type (a CuckooPlan's is "cuckoo")

    capacity: int
    error_rate: float
    expansion: int | None  # None: NONSCALING
    items: int | None = None
    capped_from: float | None = None  # the error rate asked for, when the server line capped it
    first: SubFilter = field(init=False)
    chain: tuple[SubFilter, ...] = field(init=False)

    def __post_init__(self) -> None:
        first_error = self.error_rate * (ERROR_TIGHTENING_RATIO if self.scaling else 1.0)
        first = SubFilter.sized(0, self.capacity, first_error)
        object.__setattr__(self, "first", first)
        object.__setattr__(self, "chain", self._grow(first))

    @property
    def scaling(self) -> bool:
        return self.expansion is not None

    def _grow(self, first: SubFilter) -> tuple[SubFilter, ...]:
        """Sub-filters RedisBloom will have created once ``items`` distinct items are added."""
        chain = [first]
        if self.items is None or self.expansion is None:
            return tuple(chain)
        total = first.capacity
        while total < self.items and len(chain) < MAX_CHAIN:
            last = chain[-1]
            nxt = SubFilter.sized(
                last.index + 1, last.capacity * self.expansion, last.error_rate * ERROR_TIGHTENING_RATIO
            )
            chain.append(nxt)
            total += nxt.capacity
        return tuple(chain)

    @property
    def size_bytes(self) -> int:
        """What BF.INFO Size reports right after BF.RESERVE with these arguments."""
        return memory_bytes((self.first,))

    @property
    def total_memory_bytes(self) -> int:
        """BF.INFO Size once ``items`` items have been added (the whole growth chain)."""
        return memory_bytes(self.chain)

    @property
    def total_capacity(self) -> int:
        return sum(sub.capacity for sub in self.chain)

    @property
    def naive_bytes(self) -> int:
        """The textbook estimate -n ln p / ln2^2 bits, which the seed articles quote."""
        return math.ceil(self.capacity * bits_per_item(self.error_rate) / 8)

    @property
    def compound_error_rate(self) -> float:
        """False-positive rate once ``items`` are added: 1 - prod(1 - fpr_i) over the chain."""
        if self.items is None:
            return self.first.error_rate
        remaining = self.items
        survive = 1.0
        for sub in self.chain:
            in_sub = remaining if sub is self.chain[-1] else min(remaining, sub.capacity)
            remaining -= in_sub
            survive *= 1 - estimated_fpr(in_sub, sub.bits, sub.hashes)
        return 1 - survive

    def warnings(self, when_full: str = "BF.ADD fails once it is full") -> list[str]:
        """Advice on a poor plan; ``when_full`` says what a full NONSCALING filter does on this backend."""
        notes: list[str] = []
        if self.capped_from is not None:
            notes.append(
                f"Redis 8 treats an error rate above {REDIS8_ERROR_RATE_CAP} as {REDIS8_ERROR_RATE_CAP}: "
                f"planned with {self.error_rate} (asked for {self.capped_from}); RedisBloom 2.x keeps it"
            )
        if self.items is None:
            return notes
        if not self.scaling and self.items > NONSCALING_WARN_FILL * self.capacity:
            verb = "overfills" if self.items > self.capacity else "fills"
            notes.append(
                f"{self.items:,} items {verb} this NONSCALING filter to {self.items / self.capacity:.0%} of "
                f"capacity: raise `capacity` to at least {math.ceil(self.items / NONSCALING_WARN_FILL):,}"
                + (f"; {when_full}" if self.items > self.capacity else "")
            )
        if self.scaling and self.total_capacity < self.items:
            notes.append(
                f"{self.items:,} items would need more than {MAX_CHAIN} sub-filters: the projection stops there; "
                f"reserve a capacity of at least {self.items:,}"
            )
        elif self.scaling and len(self.chain) > MAX_SUBFILTERS_BEFORE_WARNING:
            notes.append(
                f"{self.items:,} items grow this filter to {len(self.chain)} sub-filters; every lookup checks "
                f"each one: reserve a capacity of at least {self.items:,} instead"
            )
        elif self.scaling and len(self.chain) > 1:
            notes.append(
                f"{self.items:,} items exceed the capacity: the filter will grow to {len(self.chain)} "
                "sub-filters (more memory, slower lookups than one right-sized filter)"
            )
        return notes

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "capacity": self.capacity,
            "error_rate": self.error_rate,
            "expansion": self.expansion,
            "nonscaling": not self.scaling,
            "bits_per_item": self.first.bits_per_item,
            "hashes": self.first.hashes,
            "first_filter_error_rate": self.first.error_rate,
            "first_filter_bits": self.first.bits,
            "first_filter_bytes": self.first.bytes,
            "size_bytes": self.size_bytes,
            "naive_bytes": self.naive_bytes,
        }
        if self.capped_from is not None:
            data["requested_error_rate"] = self.capped_from
        if self.items is not None:
            data.update(
                items=self.items,
                filters=len(self.chain),
                total_capacity=self.total_capacity,
                total_memory_bytes=self.total_memory_bytes,
                compound_error_rate=self.compound_error_rate,
                chain=[asdict(sub) for sub in self.chain],
            )
        data["warnings"] = self.warnings()
        return data


def memory_bytes(chain: tuple[SubFilter, ...] | list[SubFilter]) -> int:
    return CHAIN_OVERHEAD_BYTES + sum(LINK_OVERHEAD_BYTES + sub.bytes for sub in chain)


def estimated_fpr(items: int, bits: int, hashes: int) -> float:
    """Expected false-positive rate of one filter holding ``items``: (1 - e^(-k n / m))^k."""
    if items <= 0 or bits <= 0:
        return 0.0
    return (1 - math.exp(-hashes * items / bits)) ** hashes


def plan(capacity: int, error_rate: float, expansion: int | None = DEFAULT_EXPANSION, items: int | None = None) -> Plan:
    """Validate the inputs and size the filter. ``expansion=None`` means NONSCALING."""
    if not _whole(capacity) or capacity < 1:
        raise UsageError("`capacity` must be a whole number of at least 1, got %r", capacity)
    if isinstance(error_rate, bool) or not isinstance(error_rate, int | float) or not 0 < error_rate < 1:
        raise UsageError("`error_rate` must be strictly between 0 and 1, got %r", error_rate)
    if error_rate < MIN_ERROR_RATE:  # (halved for the first sub-filter, 5e-324 became 0: log(0))
        raise UsageError("`error_rate` must be at least %s, got %r", MIN_ERROR_RATE, error_rate)
    if expansion is not None:
        validate_expansion(expansion)
    if items is not None and (not _whole(items) or items < 0):
        raise UsageError("`items` must be a whole number, not negative, got %r", items)
    return Plan(capacity=capacity, error_rate=error_rate, expansion=expansion, items=items)


# --- sharded filters ----------------------------------------------------------------------------


def validate_shards(shards: int) -> int:
    if not 1 <= shards <= MAX_SHARDS:
        raise UsageError("`shards` must be between 1 and %s, got %s", MAX_SHARDS, shards)
    return shards


def shard_plan(total: Plan, shards: int) -> Plan:
    """The plan of one member: the total capacity split evenly (rounded up), the same error rate."""
    validate_shards(shards)
    per_shard = max(math.ceil(total.capacity / shards), 1)
    items = None if total.items is None else math.ceil(total.items / shards)
    return plan(per_shard, total.error_rate, total.expansion, items)


def suggest_shards(total: Plan, max_shard_bytes: int, size_of: Callable[[Plan], int]) -> int:
    """The fewest shards whose members each need at most ``max_shard_bytes`` (as ``size_of`` sizes
    them), up to the shard limit."""
    if max_shard_bytes <= 0:
        raise UsageError("`max_shard_memory` must be positive")
    shards = min(max(math.ceil(size_of(total) / max_shard_bytes), 1), MAX_SHARDS)
    while shards < MAX_SHARDS and size_of(shard_plan(total, shards)) > max_shard_bytes:
        shards += 1  # per-shard overhead and rounding can need one more
    return shards


def format_rate(value: float | None) -> str:
    """One notation for every rate bloomctl prints: a percentage with 4 significant digits, never
    an exponent (0.007301%); ``-`` for none."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    percent = value * 100
    digits = max(0, 3 - math.floor(math.log10(abs(percent))))
    text = f"{percent:.{digits}f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + "%"
