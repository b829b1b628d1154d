"""Describing a window: each bucket of it (looked up, current, made ahead) and the window's numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bloomctl import backends
from bloomctl.keys import to_display
from bloomctl.server.client import RedisClient
from bloomctl.sizing.bloom import format_rate
from bloomctl.window.buckets import holds
from bloomctl.window.periods import iso, server_time
from bloomctl.window.settings import WindowSpec, read_window


@dataclass
class BucketInfo:
    index: int
    key: bytes
    label: str
    role: str  # past (looked up), current, ahead (made in advance)
    start: int
    end: int
    state: Any = None  # FilterState, None: missing
    ttl_seconds: float | None = None

    @property
    def over_capacity(self) -> bool:
        """Holds more items than its capacity. A bitmap bucket keeps taking items and a scaling
        RedisBloom one grows, so past it the bucket's false-positive rate climbs above the window's."""
        return self.state is not None and self.state.items > self.state.reserved_capacity

    def describe_fill(self) -> str:
        """``'{w}:2026-12-03' holds 1,928 items, 192.8% of its capacity 1,000 (est. FPR 13.96%)``:
        the share of the capacity it was made with (a grown filter's total capacity is larger)."""
        state = self.state
        share = state.items / state.reserved_capacity if state.reserved_capacity else 0.0
        return (
            f"{to_display(self.key)!r} holds {state.items:,} items, {share:.1%} of its capacity "
            f"{state.reserved_capacity:,} (est. FPR {format_rate(state.estimated_fpr)})"
        )

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "label": self.label,
            "key": to_display(self.key),
            "role": self.role,
            "start": iso(self.start),
            "end": iso(self.end),
            "exists": self.state is not None,
            "ttl_seconds": self.ttl_seconds,
            "over_capacity": self.over_capacity,
        }
        if self.state is not None:
            data.update(
                items=self.state.items,
                capacity=self.state.reserved_capacity,
                fill_ratio=self.state.fill_ratio,
                estimated_fpr=self.state.estimated_fpr,
                size_bytes=self.state.size_bytes,
            )
        return data


@dataclass
class WindowInfo:
    spec: WindowSpec
    now: float
    current: int
    buckets: list[BucketInfo]

    @property
    def lookup_buckets(self) -> list[BucketInfo]:
        return [b for b in self.buckets if b.role != "ahead"]

    @property
    def combined_fpr(self) -> float:
        """A lookup asks every bucket of the window: 1 - prod(1 - fpr_i) over those that exist."""
        survive = 1.0
        for bucket in self.lookup_buckets:
            if bucket.state is not None and bucket.state.estimated_fpr is not None:
                survive *= 1 - bucket.state.estimated_fpr
        return 1 - survive

    @property
    def current_missing(self) -> bool:
        return any(b.role == "current" and b.state is None for b in self.buckets)

    @property
    def warnings(self) -> list[str]:
        """One line per bucket past its capacity, with what to do about it."""
        return [overfill_warning(self, bucket) for bucket in overfilled(self)]

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.spec.as_dict(),
            "now": iso(self.now),
            "current": self.spec.label(self.current),
            "current_missing": self.current_missing,
            "items": sum(b.state.items for b in self.lookup_buckets if b.state is not None),
            "combined_fpr": self.combined_fpr,
            "buckets": [b.as_dict() for b in self.buckets],
            "warnings": self.warnings,
        }


def overfilled(info: WindowInfo) -> list[BucketInfo]:
    """The buckets of a window that hold more items than the capacity they were made with: a
    bitmap bucket's lookups are then above the planned rate until it leaves the window
    (``above_plan``); a scaling bucket grew a sub-filter, the day busier than planned."""
    return [bucket for bucket in info.buckets if bucket.over_capacity]


def above_plan(info: WindowInfo, bucket: BucketInfo) -> bool:
    """A bucket whose estimated false-positive rate is above the rate the window was planned for:
    a bitmap bucket past its capacity. A scaling bucket that grew a sub-filter may still be within
    it (its rate then only tends toward the compound bound)."""
    planned = info.spec.error_rate
    state = bucket.state
    return state is not None and bucket.over_capacity and (planned is None or state.estimated_fpr > planned)


def overfill_warning(info: WindowInfo, bucket: BucketInfo) -> str:
    """What a bucket past its capacity means for lookups, and what sizes the coming buckets right."""
    if info.spec.capacity is None:
        remedy = "rotations size new buckets from its count; the buckets already made ahead keep theirs"
    else:
        remedy = "the window's capacity is fixed: make a window with a larger capacity, or capacity auto"
    if above_plan(info, bucket):
        meaning = "a lookup's false-positive rate is above plan until it leaves the window"
    else:
        meaning = (
            f"it grew past the capacity it was planned for (its rate stays within the planned "
            f"{format_rate(info.spec.error_rate or 0)} so far)"
        )
    return f"{bucket.describe_fill()}: {meaning}; {remedy}"


def describe(client: RedisClient, name: str | bytes, *, now: float | None = None) -> WindowInfo:
    """Every bucket of the window, and the window's numbers (reads only: no function library is loaded)."""
    from bloomctl.backends.library import installs_nothing

    with installs_nothing():
        return _describe(client, name, now)


def _describe(client: RedisClient, name: str | bytes, now: float | None) -> WindowInfo:
    spec = read_window(client, name)
    backend = backends.get(spec.backend)
    moment = now if now is not None else server_time(client, spec.name)
    current = spec.index(moment)
    buckets = []
    for index in range(current - spec.keep + 1, current + spec.ahead + 1):
        key = spec.key(index)
        role = "current" if index == current else "past" if index < current else "ahead"
        bucket = BucketInfo(index, key, spec.label(index), role, spec.start(index), spec.start(index + 1))
        if backends.key_type(client, key) != b"none" and holds(client, key, backend):
            bucket.state = backend.info(client, key)
            ttl = client.pttl(key)
            bucket.ttl_seconds = ttl / 1000 if ttl is not None and ttl >= 0 else None
        buckets.append(bucket)
    return WindowInfo(spec, moment, current, buckets)
