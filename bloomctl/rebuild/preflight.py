"""Rebuild step 1, preflight: every check that can fail before anything is written.

The options, the source (its columns against the item recipe), and the plan: options first,
then the active filter's metadata, then counting the source (``capacity`` auto). Also which
filters the rebuild writes: the key itself, or every member of a sharded filter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from bloomctl import backends
from bloomctl.backends import AUTO, BLOOM, CUCKOO, Backend, CuckooState, FilterState
from bloomctl.backends.base import AnyPlan
from bloomctl.defaults import MAX_CATCHUP_SKEW, MAX_HEADROOM, MAX_JOBS, MAX_LOCK_WAIT_SECONDS
from bloomctl.errors import StateConflict, UsageError
from bloomctl.keys import KeyFamily, to_display
from bloomctl.lifecycle.manifest import Manifest, new_manifest, read_manifest
from bloomctl.lifecycle.metadata import read_metadata
from bloomctl.lifecycle.single import check_min_ratio, to_keep_ms
from bloomctl.rebuild.options import Events, RebuildOptions
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.sizing.bloom import Plan, plan, shard_plan
from bloomctl.sizing.cuckoo import (
    DEFAULT_BUCKET_SIZE,
    DEFAULT_MAX_ITERATIONS,
    cuckoo_plan,
    full_load,
)
from bloomctl.sources import IncrementalSource, Source


def check_options(source: Source, options: RebuildOptions) -> None:
    """The options on their own and against the source; then the source itself (its header or
    query columns against the column or template)."""
    if options.batch_size is not None and options.batch_size < 1:
        raise UsageError("`batch_size` must be at least 1, got %s", options.batch_size)
    if options.max_rate is not None and not (options.max_rate > 0 and math.isfinite(options.max_rate)):
        raise UsageError("`max_rate` must be a positive number of items per second, got %s", options.max_rate)
    to_keep_ms(options.keep_old)
    check_min_ratio(options.min_ratio)
    if not 0 <= options.lock_wait <= MAX_LOCK_WAIT_SECONDS:  # NaN too
        raise UsageError("`lock_wait` must be 0 to %s seconds, got %r", MAX_LOCK_WAIT_SECONDS, options.lock_wait)
    if options.since_column:
        if not isinstance(source, IncrementalSource):
            raise UsageError("`since_column` needs a SQL source")
        source.check_column_name(options.since_column)
    if not 0 <= options.catchup_skew <= MAX_CATCHUP_SKEW or not 1 <= options.headroom <= MAX_HEADROOM:
        raise UsageError(
            "`catchup_skew` must be 0-%s s and `headroom` 1-%s", f"{MAX_CATCHUP_SKEW:.0f}", f"{MAX_HEADROOM:.0f}"
        )
    if options.verify_all and not source.rewindable:
        raise UsageError("`verify_all` reads the source twice: give a file, not stdin")
    source.preflight()
    if options.since_column and isinstance(source, IncrementalSource):
        source.check_selected(options.since_column, "since_column")
    check_jobs(source, options)


def check_jobs(source: Source, options: RebuildOptions) -> None:
    """A parallel client build: its parts can be cut from this source (and a SQL part's query runs)."""
    if not 1 <= options.jobs <= MAX_JOBS:
        raise UsageError("`jobs` must be between 1 and %s, got %s", MAX_JOBS, options.jobs)
    if options.jobs == 1:
        if options.split_column is not None:
            raise UsageError("`split_column` shares rows out to `jobs`: give `jobs` 2 or more")
        return
    if options.build == "server":
        raise UsageError("`jobs` runs a client build in parallel: leave out `jobs` with `build` server")
    source.part(0, options.jobs, options.split_column).preflight()


@dataclass(frozen=True)
class Recorded:
    """The parameters the metadata of the filter being rebuilt records (None: not recorded); a
    cuckoo filter's from the filter itself where its metadata does not say."""

    error_rate: float | None = None
    capacity: int | None = None
    expansion: str | None = None  # "nonscaling" or a number
    bucket_size: int | None = None
    max_iterations: int | None = None
    fingerprint_bits: int | None = None

    def with_cuckoo(self, meta: dict[str, str], state: FilterState | None) -> Recorded:
        """A cuckoo filter's bucket size, MAXITERATIONS and fingerprint size: the metadata's, else
        the filter's own (a filter made by CF.RESERVE records none); its capacity, else its slots."""

        def number(name: str, fallback: int | None) -> int | None:
            text = meta.get(name)
            return int(text) if text is not None and text.isdigit() else fallback

        cuckoo = state if isinstance(state, CuckooState) else None
        expansion = self.expansion
        if expansion is None and cuckoo is not None:
            expansion = "nonscaling" if cuckoo.expansion is None else str(cuckoo.expansion)
        return replace(
            self,
            capacity=self.capacity if self.capacity is not None else (cuckoo.reserved_capacity if cuckoo else None),
            expansion=expansion,
            bucket_size=number("bucket_size", cuckoo.bucket_size if cuckoo else None),
            max_iterations=number("max_iterations", cuckoo.max_iterations if cuckoo else None),
            fingerprint_bits=number("fingerprint_bits", cuckoo.fingerprint_bits if cuckoo else None),
        )

    @classmethod
    def parse(cls, meta: dict[str, str], where: bytes) -> Recorded:
        """Checked values: a damaged metadata hash is the filter's state, not the caller's usage."""

        def bad(field: str) -> StateConflict:
            # the field is one of three names of ours, so it may sit in the template
            return StateConflict(
                "the metadata %r records " + field + " %r, which is not valid: pass `" + field + "` (or correct it)",
                to_display(where),
                meta[field],
            )

        error_rate = capacity = None
        try:
            if "error_rate" in meta:
                error_rate = float(meta["error_rate"])
                if not 0 < error_rate < 1:
                    raise ValueError
        except ValueError:
            raise bad("error_rate") from None
        try:
            if "capacity" in meta:
                capacity = int(meta["capacity"])
                if capacity < 1:
                    raise ValueError
        except ValueError:
            raise bad("capacity") from None
        expansion = meta.get("expansion")
        if expansion is not None and expansion != "nonscaling" and not (expansion.isdigit() and int(expansion) >= 1):
            raise bad("expansion")
        return cls(error_rate, capacity, expansion)


def recorded_parameters(
    client: RedisClient, server: ServerInfo, family: KeyFamily, requested: str, kind: str | None = None
) -> tuple[Backend, Recorded | None]:
    """The backend of the filter being rebuilt and the parameters its metadata records (for a
    sharded one, its members' current ones); None for a new filter, whose backend is chosen from
    the server (for the filter type ``kind``, bloom by default)."""
    manifest = read_manifest(client, family.active)
    if manifest is not None:
        backend = backends.get(manifest.backend)
        if not backend.is_requested(requested):
            raise StateConflict("%r is a sharded %s filter", to_display(family.active), backend.name)
        # The members' own metadata hold the current parameters (a rebuild may have changed them);
        # the manifest's are the ones the filter was created with.
        where = KeyFamily.of(manifest.members[0]).meta
        member = Recorded.parse(read_metadata(client, where), where)
        return backend, Recorded(
            member.error_rate if member.error_rate is not None else manifest.error_rate,
            (member.capacity if member.capacity is not None else manifest.capacity) * manifest.shards,
            member.expansion or ("nonscaling" if manifest.expansion is None else str(manifest.expansion)),
        )
    if backends.key_type(client, family.active) != b"none":
        backend = backends.for_key(client, family.active, "active filter")
        if kind is not None and kind != backend.kind:
            raise StateConflict(
                "the active filter is a %s filter: a %s filter could not be swapped in (rebuild under another key)",
                backend.kind,
                kind,
            )
        if not backend.is_requested(requested) and backends.choose(server, requested, backend.kind) is not backend:
            raise StateConflict(
                "the active filter is a %s filter: a %s standby could not be swapped in", backend.name, requested
            )
        meta = read_metadata(client, family.meta)
        recorded = Recorded.parse(meta, family.meta)
        if backend.kind == CUCKOO:
            recorded = recorded.with_cuckoo(meta, backend.info(client, family.active, with_header=False))
        return backend, recorded
    return backends.choose(server, requested, kind or BLOOM), None


def resolve_plan(
    client: RedisClient, server: ServerInfo, key: str | bytes, source: Source, options: RebuildOptions, events: Events
) -> tuple[AnyPlan, Backend, int | None]:
    """The plan (whole filter), its backend, and the rows counted for ``capacity`` auto (or None)."""
    backend, found = recorded_parameters(client, server, KeyFamily.of(key), options.backend, options.filter_type)
    if backend.kind == CUCKOO:
        return resolve_cuckoo_plan(backend, found or Recorded(), source, options, events)
    if options.bucket_size is not None or options.max_iterations is not None or options.fingerprint_bits is not None:
        raise UsageError(
            "`bucket_size`, `max_iterations` and `fingerprint_bits` are a cuckoo filter's: give `filter_type` cuckoo"
        )
    recorded = found or Recorded()
    error_rate = options.error_rate if options.error_rate is not None else recorded.error_rate
    if error_rate is None:
        if found is None:
            raise UsageError("a first build needs `error_rate` (later rebuilds take it from the filter's metadata)")
        raise UsageError("give `error_rate` (the active filter has no bloomctl metadata to take it from)")
    expansion = backend.expansion_for(options.expansion, options.nonscaling, recorded.expansion)
    capacity = options.capacity
    if capacity is None:
        capacity = recorded.capacity if recorded.capacity is not None else AUTO
    counted = None
    if capacity == AUTO:
        counted = count_rows(source, events)
        capacity = max(math.ceil(counted * options.headroom), 1)
        events(
            f"counted {counted:,} rows: capacity {capacity:,} (headroom x{options.headroom:g})",
            {"phase": "count", "rows": counted, "capacity": capacity},
        )
    if isinstance(capacity, str):
        raise UsageError("`capacity` must be a number or auto, got %r", capacity)
    return backend.check_plan(plan(capacity, error_rate, expansion)), backend, counted


def count_rows(source: Source, events: Events) -> int:
    if not source.rewindable:
        raise UsageError("a source read once (stdin) cannot be counted first: pass `capacity` N")
    events("counting the source (capacity auto)", {"phase": "count"})
    return source.count()


def resolve_cuckoo_plan(
    backend: Backend, recorded: Recorded, source: Source, options: RebuildOptions, events: Events
) -> tuple[AnyPlan, Backend, int | None]:
    """A cuckoo filter's plan: each parameter from the options, else the active filter's, else
    CF.RESERVE's defaults. ``capacity`` auto sizes the filter so that the counted rows x headroom
    fit below the load at which its inserts start to fail (not merely into its slots)."""
    if options.shards is not None:
        raise UsageError("cuckoo filters are not sharded: leave out `shards`")
    if options.build == "client" or options.jobs > 1:  # where an item lands depends on the items before it
        raise UsageError("cuckoo filters are built on the server: leave out `build` client and `jobs`")
    bucket_size = options.bucket_size or recorded.bucket_size or DEFAULT_BUCKET_SIZE
    max_iterations = options.max_iterations or recorded.max_iterations or DEFAULT_MAX_ITERATIONS
    expansion = backend.expansion_for(options.expansion, options.nonscaling, recorded.expansion)
    fingerprint_bits = options.fingerprint_bits or (recorded.fingerprint_bits if options.error_rate is None else None)
    engine = backend.engine
    capacity = options.capacity if options.capacity is not None else (recorded.capacity or AUTO)
    counted = None
    if capacity == AUTO:
        counted = count_rows(source, events)
        load = full_load(bucket_size, max_iterations, engine)
        capacity = max(math.ceil(counted * options.headroom / load), 2 * bucket_size)
        events(
            f"counted {counted:,} rows: capacity {capacity:,} (headroom x{options.headroom:g}; inserts start to "
            f"fail at {load:.0%} of the slots with bucket size {bucket_size})",
            {"phase": "count", "rows": counted, "capacity": capacity},
        )
    if isinstance(capacity, str):
        raise UsageError("`capacity` must be a number or auto, got %r", capacity)
    the_plan = cuckoo_plan(
        capacity,
        bucket_size=bucket_size,
        max_iterations=max_iterations,
        expansion=expansion,
        engine=engine,
        error_rate=options.error_rate,
        fingerprint_bits=fingerprint_bits,
        items=counted,
    )
    for warning in the_plan.warnings():
        events(warning, {"phase": "plan", "warning": "plan"})
    return backend.check_plan(the_plan), backend, counted


@dataclass(frozen=True)
class Targets:
    """The filters a rebuild writes: the key itself, or every member of a sharded filter."""

    members: list[bytes]
    plan: AnyPlan  # of each member
    manifest: Manifest | None = None
    new_manifest: bool = False  # a first sharded build: write the manifest once the members are ready

    @property
    def families(self) -> list[KeyFamily]:
        return [KeyFamily.of(member) for member in self.members]

    @property
    def standbys(self) -> list[bytes]:
        return [family.standby for family in self.families]


def targets(
    client: RedisClient, key: str | bytes, total: AnyPlan, backend: Backend, options: RebuildOptions, line: str
) -> Targets:
    """The filters the rebuild writes, each with its plan as the server ``line`` builds it."""
    family = KeyFamily.of(key)
    if not isinstance(total, Plan):  # a cuckoo filter: never sharded
        return Targets([family.active], backend.check_plan(total, line))
    manifest = read_manifest(client, family.active)
    if manifest is not None:
        if options.shards not in (None, manifest.shards):
            raise UsageError(
                "%r has %s shards; the count never changes (build a new sharded filter under another key)",
                to_display(family.active),
                manifest.shards,
            )
        members = backend.bloom_plan(backend.check_plan(shard_plan(total, manifest.shards), line))
        return Targets(list(manifest.members), members, manifest)
    if options.shards is None:
        return Targets([family.active], backend.check_plan(total, line))
    if backends.key_type(client, family.active) != b"none":
        raise StateConflict("%r is a single filter: a sharded filter needs a new key", to_display(family.active))
    per_shard = backend.bloom_plan(backend.check_plan(shard_plan(total, options.shards), line))
    manifest = new_manifest(client, family.active, options.shards, per_shard, backend)
    return Targets(list(manifest.members), per_shard, manifest, new_manifest=True)
