"""What a rebuild is asked to do (``RebuildOptions``) and what it did (``RebuildReport``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from bloomctl.defaults import (
    AUTO,
    DEFAULT_BATCH_SIZE,
    DEFAULT_CATCHUP_SKEW,
    DEFAULT_CLIENT_MEMORY,
    DEFAULT_HEADROOM,
    DEFAULT_KEEP_OLD_SECONDS,
    DEFAULT_LOCK_TTL_MS,
    DEFAULT_MIN_RATIO,
    DEFAULT_VERIFY_SAMPLE,
    DEFAULT_WINDOW,
)
from bloomctl.rebuild.loader import LoadStats
from bloomctl.sizing.bloom import Plan
from bloomctl.sizing.cuckoo import CuckooPlan
from bloomctl.sources import SourceStats

Events = Callable[[str, dict[str, Any]], None]  # (message, fields) for the log


@dataclass
class RebuildOptions:
    capacity: int | str | None = None  # a number, "auto", or None: the active filter's, else auto
    headroom: float = DEFAULT_HEADROOM
    error_rate: float | None = None
    expansion: int | None = None
    nonscaling: bool = False
    filter_type: str | None = None  # bloom or cuckoo; None: the active filter's, else bloom
    bucket_size: int | None = None  # a cuckoo filter's (None: the active filter's, else 2)
    max_iterations: int | None = None  # a cuckoo filter's (None: the active filter's, else 20)
    fingerprint_bits: int | None = (
        None  # the module-free cuckoo filter's (None: the active filter's, else from the error rate)
    )
    backend: str = AUTO
    batch_size: int | None = None  # items per add command; None: the backend's (5000 RedisBloom, 1000 bitmap)
    max_rate: float | None = None  # items per second, at most, on the server path
    window: int = DEFAULT_WINDOW
    verify_sample: int = DEFAULT_VERIFY_SAMPLE
    verify_all: bool = False
    since_column: str | None = None
    catchup_skew: float = DEFAULT_CATCHUP_SKEW
    swap: bool = False
    keep_old: float = DEFAULT_KEEP_OLD_SECONDS
    lock_wait: float = 0.0
    # a first build (apply's): under the lock, a filter made meanwhile by another run is left
    # alone (MadeMeanwhile) rather than built a second time
    only_if_missing: bool = False
    lock_command: str = "bloomctl rebuild"  # who holds the lock, as another run's refusal names it
    min_ratio: float = DEFAULT_MIN_RATIO
    allow_shrink: bool = False
    allow_recipe_change: bool = False  # swap in items built otherwise than the active filter's
    dry_run: bool = False
    force: bool = False  # skip the free-memory check
    shards: int | None = None  # a new sharded filter with this many members (an existing one keeps its count)
    lock_ttl_ms: int = DEFAULT_LOCK_TTL_MS
    seed: int | None = None  # for the verification sample; tests fix it
    build: str = AUTO  # where the bits are computed: auto, client or server
    client_memory: int = DEFAULT_CLIENT_MEMORY
    jobs: int = 1  # processes of a client build, each on its part of the source
    split_column: str | None = None  # SQL: the integer column that shares the rows out to the jobs
    engine: Any = None  # a distributed engine that builds the bits (``bloomctl.distributed``): Dask, Spark

    @property
    def batch(self) -> int:
        """Items per add command (the rebuild sets ``batch_size`` from the backend when None)."""
        return self.batch_size or DEFAULT_BATCH_SIZE

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> RebuildOptions:
        """The options named in ``values``, the defaults for the rest; an unknown name is a bug in the
        caller (a renamed option must not fall back to its default silently)."""
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"unknown rebuild options: {', '.join(unknown)}")
        return cls(**values)


@dataclass
class RebuildReport:
    key: str
    standby: str
    backend: str
    plan: Plan | CuckooPlan
    counted: int | None = None  # rows counted for capacity auto
    source: SourceStats = field(default_factory=SourceStats)
    load: LoadStats = field(default_factory=LoadStats)
    catchup: LoadStats | None = None
    catchup_rows: int = 0
    replaced_standby: int | None = None  # items of a stale standby that was replaced
    verified: int = 0
    verify_mode: str = "sample"
    swapped: bool = False
    replaced_active: bool = False
    size_bytes: int | None = None
    seconds: float = 0.0
    dry_run: bool = False
    shards: int = 1
    build: str = "server"  # where the bits were computed: client or server
    build_note: str | None = None  # why not in the client (when auto chose the server)
    build_kernel: str | None = None  # what set a client build's bits: native (the C kernel) or numpy
    uploaded_bytes: int = 0  # bytes of bits a client build sent
    replayed: int | None = None  # a cuckoo filter: the writes made during the rebuild, replayed into the standby

    def plan_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "capacity": self.plan.capacity,
            "error_rate": self.plan.error_rate,
            "expansion": self.plan.expansion,
        }
        if isinstance(self.plan, CuckooPlan):
            data.update(
                bucket_size=self.plan.bucket_size,
                max_iterations=self.plan.max_iterations,
                fingerprint_bits=self.plan.fingerprint_bits,
                buckets=self.plan.buckets,
                usable_capacity=self.plan.usable_capacity,
            )
        else:
            data["hashes"] = self.plan.first.hashes
        return data

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "standby": self.standby,
            "shards": self.shards,
            "backend": self.backend,
            "dry_run": self.dry_run,
            "type": self.plan.kind,
            "plan": self.plan_dict(),
            "counted": self.counted,
            "items_read": self.source.items,
            "rows": self.source.rows,
            "blank": self.source.blank,
            "bad_rows": self.source.bad_rows,
            "bad_row_examples": self.source.examples,
            "added": self.load.added + (self.catchup.added if self.catchup else 0),
            "duplicates": self.load.duplicates + (self.catchup.duplicates if self.catchup else 0),
            "catchup_rows": self.catchup_rows,
            "replaced_standby_items": self.replaced_standby,
            "verified": self.verified,
            "verify_mode": self.verify_mode,
            "swapped": self.swapped,
            "size_bytes": self.size_bytes,
            "build": self.build,
            "build_note": self.build_note,
            "build_kernel": self.build_kernel,
            "uploaded_bytes": self.uploaded_bytes,
            "replayed": self.replayed,
            "seconds": round(self.seconds, 3),
            "items_per_second": round(self.load.rate),
        }
