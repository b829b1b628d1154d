"""fill-ratio: measure how full filters are and judge them against thresholds.

Patterns are expanded with SCAN ... TYPE on every master, so a cron job can watch all filters
of a naming scheme without listing them. Companion keys (standby, old) are skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bloomctl import backends
from bloomctl.backends import CuckooState, FilterState
from bloomctl.defaults import DEFAULT_MAX_FILL, DEFAULT_WARN
from bloomctl.errors import StateConflict, UsageError
from bloomctl.keys import hash_tag, to_bytes, to_display
from bloomctl.lifecycle.manifest import is_member_name, read_manifest, select_manifests
from bloomctl.lifecycle.sharded import ShardedState
from bloomctl.server.client import RedisClient
from bloomctl.server.topology import primaries, scan_type
from bloomctl.sizing.bloom import format_rate
from bloomctl.sizing.cuckoo import WARN_SHARE

GLOB_CHARS = frozenset(b"*?[")
COMPANION_SUFFIXES = (b":standby", b":old")

OK, WARN, OVER, MISSING = "ok", "warn", "over", "missing"


def is_pattern(key: str | bytes) -> bool:
    return any(ch in GLOB_CHARS for ch in to_bytes(key))


def is_companion(key: bytes) -> bool:
    """Keys reported through another: standby and old keys (they end in a role and always carry a
    hash tag), and the members of sharded filters (reported through their manifest)."""
    return (key.endswith(COMPANION_SUFFIXES) and hash_tag(key) is not None) or is_member_name(key)


def scan_filters(client: RedisClient, pattern: bytes, count: int = 1000) -> Iterator[bytes]:
    """Keys matching ``pattern`` that hold a filter of any backend, on every master of a cluster.

    SCAN ... TYPE narrows the keyspace per backend; strings are then checked for the bitmap
    backend's header in one pipeline per SCAN page.
    """
    seen: set[bytes] = set()
    selectors = [(b.redis_type, b.select) for b in map(backends.get, backends.names())]
    selectors.append((b"hash", select_manifests))
    for node in primaries(client):
        for redis_type, select in selectors:
            page: list[bytes] = []
            for key in scan_type(node, redis_type, match=pattern, count=count):
                page.append(key)
                if len(page) >= count:
                    yield from _keep(select(node, page), seen)
                    page = []
            yield from _keep(select(node, page), seen)


def _keep(keys: list[bytes], seen: set[bytes]) -> Iterator[bytes]:
    for key in keys:
        if key not in seen and not is_companion(key):
            seen.add(key)
            yield key


def resolve_keys(client: RedisClient, keys: list[str | bytes]) -> list[bytes]:
    """Expand patterns (a key with glob characters that exists as written is taken literally).

    A plain key is kept even when missing, and so is a pattern that matches nothing: each gets a
    "missing" line rather than hiding the other filters' results.
    """
    resolved: dict[bytes, None] = {}  # ordered and de-duplicated
    for key in keys:
        raw = to_bytes(key)
        if is_pattern(raw) and not client.exists(raw):
            matches = sorted(scan_filters(client, raw)) or [raw]
        else:
            matches = [raw]
        resolved.update(dict.fromkeys(matches))
    return list(resolved)


@dataclass(frozen=True)
class Thresholds:
    """The fill-ratio limits. Left out (None), each filter type has its own: a Bloom filter warns at
    0.8 and fails above 1.0 (items / reserved capacity); a cuckoo filter fails at the load where its
    inserts start to fail (measured per bucket size and MAXITERATIONS) and warns at 80% of that."""

    warn: float | None = None
    max: float | None = None
    max_fpr: float | None = None

    def __post_init__(self) -> None:
        if self.max is not None and not self.max > 0:  # (first: the default warn follows max)
            raise UsageError("`max` must be positive, got %s", self.max)
        if self.warn is not None and not self.warn > 0:
            raise UsageError("`warn` must be positive, got %s", self.warn)
        if self.warn is not None and self.warn > (self.max if self.max is not None else DEFAULT_MAX_FILL):
            raise UsageError(
                "`warn` (%s) must not be above `max` (%s)",
                self.warn,
                self.max if self.max is not None else DEFAULT_MAX_FILL,
            )
        if self.max_fpr is not None and not 0 < self.max_fpr < 1:
            raise UsageError("`max_fpr` must be strictly between 0 and 1, got %s", self.max_fpr)

    @property
    def warn_at(self) -> float:
        """The warn threshold in effect for a Bloom filter (``warn``, or its default once resolved)."""
        return self.for_state(None)[0]

    @property
    def max_at(self) -> float:
        """The max threshold in effect for a Bloom filter."""
        return self.for_state(None)[1]

    def for_state(self, state: FilterState | None) -> tuple[float, float]:
        """(warn, max) for a filter like ``state`` (None: a Bloom filter)."""
        if state is not None and isinstance(state, CuckooState):
            limit = self.max if self.max is not None else state.full_load
            return (min(self.warn, limit) if self.warn is not None else WARN_SHARE * limit), limit
        limit = self.max if self.max is not None else DEFAULT_MAX_FILL
        return (self.warn if self.warn is not None else min(DEFAULT_WARN, limit)), limit


@dataclass(frozen=True)
class FillReport:
    key: bytes
    state: FilterState | None  # None: the key is missing or not a filter
    status: str
    reasons: tuple[str, ...]
    limits: tuple[float, float] | None = None  # the (warn, max) this filter was judged by

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"key": to_display(self.key), "status": self.status, "reasons": list(self.reasons)}
        if self.state is not None:
            data.update(self.state.as_dict())
        if self.limits is not None:
            data["thresholds"] = {"warn": self.limits[0], "max": self.limits[1]}
        return data


def judge(key: bytes, state: FilterState, limits: Thresholds) -> FillReport:
    reasons = []
    status = OK
    warn_at, max_at = limits.for_state(state)
    what = "load" if isinstance(state, CuckooState) else "fill"
    if state.fill_ratio > max_at or (
        isinstance(state, CuckooState) and limits.max is None and state.fill_ratio >= max_at
    ):
        status = OVER
        reasons.append(f"{what} {state.fill_ratio:.1%} > max {max_at:.1%}")
    fpr = state.estimated_fpr
    if limits.max_fpr is not None and fpr is not None and fpr > limits.max_fpr:
        status = OVER
        reasons.append(f"estimated FPR {format_rate(fpr)} > max {format_rate(limits.max_fpr)}")
    if status == OK and state.fill_ratio > warn_at:
        status = WARN
        reasons.append(f"{what} {state.fill_ratio:.1%} > warn {warn_at:.1%}")
    if status == OK and isinstance(state, CuckooState) and state.filters > 1:
        status = WARN
        reasons.append(f"grew to {state.filters} sub-filters")
    return FillReport(key, state, status, tuple(reasons), (warn_at, max_at))


def measure(client: RedisClient, key: bytes, *, exact: bool = False) -> FilterState:
    manifest = read_manifest(client, key)
    if manifest is not None:
        return ShardedState.of([measure(client, member, exact=exact) for member in manifest.members])
    backend = backends.for_key(client, key)
    return backend.bit_fill(client, key) if exact else backend.info(client, key)


def fill_ratio(
    client: RedisClient, keys: list[str | bytes], limits: Thresholds, *, exact: bool = False
) -> list[FillReport]:
    reports = []
    for key in resolve_keys(client, keys):
        try:
            reports.append(judge(key, measure(client, key, exact=exact), limits))
        except StateConflict as exc:  # missing, or not a filter: one line for it, the others still checked
            reason = "no Bloom filter matches this pattern" if is_pattern(key) else str(exc)
            reports.append(FillReport(key, None, MISSING, (reason,)))
    return reports


# The gauges of one filter, in fill-ratio's Prometheus output and the exporter's: (name, help, value of it)
Getter = Callable[["FillReport", FilterState], "float | None"]
PROMETHEUS_METRICS: tuple[tuple[str, str, Getter], ...] = (
    ("bloomctl_fill_ratio", "Items inserted divided by the reserved capacity.", lambda r, s: s.fill_ratio),
    ("bloomctl_items", "Items inserted (BF.INFO).", lambda r, s: s.items),
    ("bloomctl_capacity", "Capacity of all sub-filters (BF.INFO).", lambda r, s: s.capacity),
    (
        "bloomctl_reserved_capacity",
        "Capacity given to BF.RESERVE (first sub-filter).",
        lambda r, s: s.reserved_capacity,
    ),
    ("bloomctl_size_bytes", "Memory of the filter (BF.INFO Size).", lambda r, s: s.size_bytes),
    ("bloomctl_subfilters", "Number of sub-filters.", lambda r, s: s.filters),
    (
        "bloomctl_estimated_false_positive_ratio",
        "Estimated false-positive rate now (a fraction).",
        lambda r, s: s.estimated_fpr,
    ),
    ("bloomctl_over_max", "1 when the filter is over the --max thresholds.", lambda r, s: int(r.status == OVER)),
    (
        "bloomctl_deleted_items",
        "Cuckoo filters: items deleted (since the last compaction).",
        lambda r, s: getattr(s, "deletes", None),
    ),
    (
        "bloomctl_full_load_ratio",
        "Cuckoo filters: the load (items / slots) at which inserts start to fail, measured for its bucket size.",
        lambda r, s: getattr(s, "full_load", None) if s.kind == "cuckoo" else None,
    ),
)
