"""Rebuild step 1, preflight: every check that can fail before anything is written.

The options, the source (its columns against the item recipe), and the plan: options first,
then the active filter's metadata, then counting the source (``capacity`` auto). Also which
filters the rebuild writes: the key itself, or every member of a sharded filter. ``preflight``
runs them in order and resolves the options once into each later step's settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from bloomctl import backends, extras
from bloomctl.backends import AUTO, BLOOM, CUCKOO, Backend, CuckooState, FilterState
from bloomctl.backends.base import AnyPlan
from bloomctl.defaults import MAX_CATCHUP_SKEW, MAX_HEADROOM, MAX_JOBS, MAX_LOCK_WAIT_SECONDS
from bloomctl.errors import StateConflict, UsageError
from bloomctl.keys import KeyFamily, to_display
from bloomctl.lifecycle.guards import SwapGuards
from bloomctl.lifecycle.manifest import new_manifest, read_manifest
from bloomctl.lifecycle.metadata import RECIPE, read_metadata, recipe_field
from bloomctl.lifecycle.single import check_family, check_recipe
from bloomctl.lifecycle.standby import Targets
from bloomctl.native import native
from bloomctl.rebuild.options import Events, RebuildOptions
from bloomctl.rebuild.settings import LoadSettings, PlanRequest, RunControls, VerifySettings, swap_guards
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
from bloomctl.sources.base import recipe_of


@dataclass(frozen=True)
class Preflight:
    """What the preflight hands down: the plan and the filters it goes to, and each later step's settings."""

    plan: AnyPlan  # the whole filter's: one filter's as this server builds it, a sharded one's as planned
    backend: Backend
    targets: Targets
    counted: int | None  # rows counted for ``capacity`` auto
    recipe: str | None  # how the items are built, for the standbys' metadata
    load: LoadSettings
    verify: VerifySettings
    guards: SwapGuards
    run: RunControls


def preflight(
    client: RedisClient, server: ServerInfo, family: KeyFamily, source: Source, options: RebuildOptions, log: Events
) -> Preflight:
    """Step 1 in order: the companion keys, the options and the source, the plan, the filters to
    write and their recipe. Nothing is written."""
    check_family(client, family)  # someone else's data at a companion key: refused, never touched
    check_options(source, options)  # a wrong column, template or URL fails here, before anything is written
    request = PlanRequest.of(options)
    the_plan, backend, counted = resolve_plan(client, server, family, source, request, log)
    batch = options.batch_size or backend.batch_for(the_plan)  # the backend's: no add command over 20 ms
    chosen = targets(client, server, family.active, the_plan, backend, request.shards)
    for member in chosen.families:
        check_family(client, member)
    guards = swap_guards(options)
    recipe = recipe_field(recipe_of(source))
    if not guards.allow_recipe_change:  # refused now, not after the load: the swap would refuse it
        check_recipe(read_metadata(client, chosen.families[0].meta), {RECIPE: recipe})
    return Preflight(
        # one filter: its plan as this server builds it (Redis 8 caps error rates)
        plan=the_plan if chosen.manifest is not None else chosen.plan,
        backend=backend,
        targets=chosen,
        counted=counted,
        recipe=recipe,
        load=LoadSettings.of(options, batch),
        verify=VerifySettings.of(options),
        guards=guards,
        run=RunControls.of(options),
    )


def check_options(source: Source, options: RebuildOptions) -> None:
    """The options on their own and against the source; then the source itself (its header or
    query columns against the column or template)."""
    native()  # a wrong BLOOMCTL_KERNEL is refused here, not once the standby exists
    if options.build == "client" or options.engine is not None or options.jobs > 1:  # numpy: before the standby exists
        extras.require(extras.CLIENT_BUILD)
    if options.batch_size is not None and options.batch_size < 1:
        raise UsageError("`batch_size` must be at least 1, got %s", options.batch_size)
    if options.max_rate is not None and not (options.max_rate > 0 and math.isfinite(options.max_rate)):
        raise UsageError("`max_rate` must be a positive number of items per second, got %s", options.max_rate)
    swap_guards(options).check()
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
    if options.engine is not None:
        check_engine(source, options)
    if options.jobs == 1:
        if options.split_column is not None:
            raise UsageError("`split_column` shares rows out to `jobs`: give `jobs` 2 or more")
        return
    if options.build == "server":
        raise UsageError("`jobs` runs a client build in parallel: leave out `jobs` with `build` server")
    source.part(0, options.jobs, options.split_column).preflight()


def check_engine(source: Source, options: RebuildOptions) -> None:
    """A distributed build: the engine computes the bits, so the build is in the client, in one
    share per task (not ``jobs``), from a source the engine reads itself."""
    if options.build == "server":
        raise UsageError("`engine` computes the bits off the server: leave out `build` server")
    if options.jobs > 1:
        raise UsageError("`engine` shares the build out to its workers: leave out `jobs`")
    if not getattr(source, "engine_readable", False):
        raise UsageError("an engine reads Parquet files or a DataFrame, not %s", source.description)


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
    client: RedisClient, server: ServerInfo, family: KeyFamily, source: Source, request: PlanRequest, events: Events
) -> tuple[AnyPlan, Backend, int | None]:
    """The plan (whole filter), its backend, and the rows counted for ``capacity`` auto (or None)."""
    backend, found = recorded_parameters(client, server, family, request.backend, request.filter_type)
    if backend.kind == CUCKOO:
        return resolve_cuckoo_plan(backend, found or Recorded(), source, request, events)
    if request.bucket_size is not None or request.max_iterations is not None or request.fingerprint_bits is not None:
        raise UsageError(
            "`bucket_size`, `max_iterations` and `fingerprint_bits` are a cuckoo filter's: give `filter_type` cuckoo"
        )
    recorded = found or Recorded()
    error_rate = request.error_rate if request.error_rate is not None else recorded.error_rate
    if error_rate is None:
        if found is None:
            raise UsageError("a first build needs `error_rate` (later rebuilds take it from the filter's metadata)")
        raise UsageError("give `error_rate` (the active filter has no bloomctl metadata to take it from)")
    expansion = backend.expansion_for(request.expansion, request.nonscaling, recorded.expansion)
    capacity = request.capacity
    if capacity is None:
        capacity = recorded.capacity if recorded.capacity is not None else AUTO
    counted = None
    if capacity == AUTO:
        counted = count_rows(source, events)
        capacity = max(math.ceil(counted * request.headroom), 1)
        events(
            f"counted {counted:,} rows: capacity {capacity:,} (headroom x{request.headroom:g})",
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
    backend: Backend, recorded: Recorded, source: Source, request: PlanRequest, events: Events
) -> tuple[AnyPlan, Backend, int | None]:
    """A cuckoo filter's plan: each parameter from the request, else the active filter's, else
    CF.RESERVE's defaults. ``capacity`` auto sizes the filter so that the counted rows x headroom
    fit below the load at which its inserts start to fail (not merely into its slots)."""
    if request.shards is not None:
        raise UsageError("cuckoo filters are not sharded: leave out `shards`")
    if request.client_build:  # where an item lands depends on the items before it
        raise UsageError("cuckoo filters are built on the server: leave out `build` client and `jobs`")
    bucket_size = request.bucket_size or recorded.bucket_size or DEFAULT_BUCKET_SIZE
    max_iterations = request.max_iterations or recorded.max_iterations or DEFAULT_MAX_ITERATIONS
    expansion = backend.expansion_for(request.expansion, request.nonscaling, recorded.expansion)
    fingerprint_bits = request.fingerprint_bits or (recorded.fingerprint_bits if request.error_rate is None else None)
    engine = backend.engine
    capacity = request.capacity if request.capacity is not None else (recorded.capacity or AUTO)
    counted = None
    if capacity == AUTO:
        counted = count_rows(source, events)
        load = full_load(bucket_size, max_iterations, engine)
        capacity = max(math.ceil(counted * request.headroom / load), 2 * bucket_size)
        events(
            f"counted {counted:,} rows: capacity {capacity:,} (headroom x{request.headroom:g}; inserts start to "
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
        error_rate=request.error_rate,
        fingerprint_bits=fingerprint_bits,
        items=counted,
    )
    for warning in the_plan.warnings():
        events(warning, {"phase": "plan", "warning": "plan"})
    return backend.check_plan(the_plan), backend, counted


def targets(
    client: RedisClient, server: ServerInfo, key: str | bytes, total: AnyPlan, backend: Backend, shards: int | None
) -> Targets:
    """The filters the rebuild writes, each with its plan as ``server`` builds it (``shards``: the
    members a first sharded build asks for)."""
    family = KeyFamily.of(key)
    if not isinstance(total, Plan):  # a cuckoo filter: never sharded
        return Targets([family.active], backends.plan_reserve(server, backend, total)[1])
    manifest = read_manifest(client, family.active)
    if manifest is not None:
        if shards not in (None, manifest.shards):
            raise UsageError(
                "%r has %s shards; the count never changes (build a new sharded filter under another key)",
                to_display(family.active),
                manifest.shards,
            )
        members = backends.plan_reserve(server, backend, shard_plan(total, manifest.shards))[1]
        return Targets(list(manifest.members), backend.bloom_plan(members), manifest)
    if shards is None:
        return Targets([family.active], backends.plan_reserve(server, backend, total)[1])
    if backends.key_type(client, family.active) != b"none":
        raise StateConflict("%r is a single filter: a sharded filter needs a new key", to_display(family.active))
    per_shard = backend.bloom_plan(backends.plan_reserve(server, backend, shard_plan(total, shards))[1])
    manifest = new_manifest(client, family.active, shards, per_shard, backend)
    return Targets(list(manifest.members), per_shard, manifest, new_manifest=True)
