"""Describing a window: each bucket of it (looked up, current, made ahead) and the window's numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bloomctl import backends
from bloomctl.keys import to_display
from bloomctl.server.client import RedisClient
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

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "label": self.label,
            "key": to_display(self.key),
            "role": self.role,
            "start": iso(self.start),
            "end": iso(self.end),
            "exists": self.state is not None,
            "ttl_seconds": self.ttl_seconds,
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

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.spec.as_dict(),
            "now": iso(self.now),
            "current": self.spec.label(self.current),
            "current_missing": self.current_missing,
            "items": sum(b.state.items for b in self.lookup_buckets if b.state is not None),
            "combined_fpr": self.combined_fpr,
            "buckets": [b.as_dict() for b in self.buckets],
        }


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
