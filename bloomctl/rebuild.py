"""Rebuild: stream a source of truth into the standby, verify it, and (optionally) swap it in.

Steps, in order: resolve the plan (options > the active filter's metadata > counting the
source), take the filter's lock, replace any standby a crashed run left, reserve the standby,
load it, catch up on rows changed during the load (SQL), verify a sample (or everything)
against the standby, and swap. A failure at any step leaves the active filter untouched.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from bloomctl import backends, lifecycle, sharding
from bloomctl.backends import AUTO, Backend
from bloomctl.defaults import DEFAULT_MIN_RATIO
from bloomctl.errors import SourceError, StateConflict, UsageError, VerifyFailed
from bloomctl.keys import KeyFamily, to_display
from bloomctl.loader import DEFAULT_BATCH_SIZE, DEFAULT_WINDOW, Loader, LoadStats, Progress
from bloomctl.lock import DEFAULT_TTL_MS, FilterLock
from bloomctl.planner import DEFAULT_EXPANSION, Plan, plan
from bloomctl.server import ServerInfo
from bloomctl.sources import CsvSource, SourceStats, SqlSource

# Set a standby's state only if its metadata still carries this run's generation.
MARK_LUA = """
if redis.call('HGET', KEYS[1], 'generation') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
return 1
"""

DEFAULT_HEADROOM = 2.0
DEFAULT_VERIFY_SAMPLE = 10_000
DEFAULT_CATCHUP_SKEW = 60.0
MAX_CATCHUP_SKEW = 7 * 24 * 3600.0
MAX_HEADROOM = 1000.0
VERIFY_BATCH = 1000
MAX_MISS_EXAMPLES = 5

Events = Callable[[str, dict[str, Any]], None]  # (message, fields) for the log


@dataclass
class RebuildOptions:
    capacity: int | str | None = None  # a number, "auto", or None: the active filter's, else auto
    headroom: float = DEFAULT_HEADROOM
    error_rate: float | None = None
    expansion: int | None = None
    nonscaling: bool = False
    backend: str = AUTO
    batch_size: int = DEFAULT_BATCH_SIZE
    window: int = DEFAULT_WINDOW
    verify_sample: int = DEFAULT_VERIFY_SAMPLE
    verify_all: bool = False
    since_column: str | None = None
    catchup_skew: float = DEFAULT_CATCHUP_SKEW
    swap: bool = False
    keep_old: float = 0.0
    min_ratio: float = DEFAULT_MIN_RATIO
    allow_shrink: bool = False
    dry_run: bool = False
    force: bool = False  # skip the free-memory check
    shards: int | None = None  # a new sharded filter with this many members (an existing one keeps its count)
    lock_ttl_ms: int = DEFAULT_TTL_MS
    seed: int | None = None  # for the verification sample; tests fix it


@dataclass
class RebuildReport:
    key: str
    standby: str
    backend: str
    plan: Plan
    counted: int | None = None  # rows counted for --capacity auto
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

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "standby": self.standby,
            "shards": self.shards,
            "backend": self.backend,
            "dry_run": self.dry_run,
            "plan": {
                "capacity": self.plan.capacity,
                "error_rate": self.plan.error_rate,
                "expansion": self.plan.expansion,
                "hashes": self.plan.first.hashes,
            },
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
            "seconds": round(self.seconds, 3),
            "items_per_second": round(self.load.rate),
        }


class Reservoir:
    """A uniform random sample of ``size`` items from a stream of batches (Vitter's algorithm L).

    Draws random numbers only when an item enters the sample, so it costs almost nothing per item.
    """

    def __init__(self, size: int, rng: random.Random) -> None:
        self.size, self.rng = size, rng
        self.items: list[bytes] = []
        self.seen = 0
        self.weight = 1.0
        self.next_index = 0

    def _skip(self) -> None:
        self.weight *= math.exp(math.log(self.rng.random() or 1e-300) / self.size)
        gap = math.floor(math.log(self.rng.random() or 1e-300) / math.log1p(-self.weight)) if self.weight < 1 else 0
        self.next_index += gap + 1

    def feed(self, batch: list[bytes]) -> None:
        if self.size <= 0:
            return
        start = 0
        if len(self.items) < self.size:
            start = min(self.size - len(self.items), len(batch))
            self.items.extend(batch[:start])
            self.seen += start
            if len(self.items) == self.size:
                self.next_index = self.seen - 1
                self._skip()
        end = self.seen + len(batch) - start
        while len(self.items) == self.size and self.next_index < end:
            self.items[self.rng.randrange(self.size)] = batch[start + self.next_index - self.seen]
            self._skip()
        self.seen = end


def _sampled(batches: Iterator[list[bytes]], reservoir: Reservoir | None) -> Iterator[list[bytes]]:
    for batch in batches:
        if reservoir is not None:
            reservoir.feed(batch)
        yield batch


def resolve_plan(
    client: Any,
    server: ServerInfo,
    key: str | bytes,
    source: CsvSource | SqlSource,
    options: RebuildOptions,
    events: Events,
) -> tuple[Plan, Backend, int | None]:
    family = KeyFamily.of(key)
    meta: dict[str, str] = {}
    manifest = sharding.read_manifest(client, family.active)
    if manifest is not None:
        backend = backends.get(manifest.backend)
        if options.backend not in (AUTO, backend.name):
            raise StateConflict(f"{to_display(family.active)!r} is a sharded {backend.name} filter")
        # The members' own metadata hold the current parameters (a rebuild may have changed them);
        # the manifest's are the ones the filter was created with.
        member = lifecycle.read_metadata(client, KeyFamily.of(manifest.members[0]).meta)
        meta = {
            "error_rate": member.get("error_rate", repr(manifest.error_rate)),
            "capacity": str(int(member.get("capacity", manifest.capacity)) * manifest.shards),
            "expansion": member.get(
                "expansion", "nonscaling" if manifest.expansion is None else str(manifest.expansion)
            ),
        }
    elif backends.key_type(client, family.active) != b"none":
        backend = backends.for_key(client, family.active, "active filter")
        if options.backend not in (AUTO, backend.name):
            raise StateConflict(
                f"the active filter is a {backend.name} filter: a {options.backend} standby could not be swapped in"
            )
        meta = lifecycle.read_metadata(client, family.meta)
    else:
        backend = backends.choose(server, options.backend)

    error_rate = options.error_rate
    if error_rate is None:
        if "error_rate" not in meta:
            raise UsageError("give --error-rate (the active filter has no bloomctl metadata to take it from)")
        error_rate = float(meta["error_rate"])

    if options.nonscaling and options.expansion is not None:
        raise UsageError("--expansion and --nonscaling exclude each other")
    if backend.name == "bitmap":
        if options.expansion is not None:
            raise UsageError("bitmap filters do not grow: leave out --expansion")
        expansion = None
    elif options.nonscaling:
        expansion = None
    elif options.expansion is not None:
        expansion = options.expansion
    elif meta.get("expansion") == "nonscaling":
        expansion = None
    else:
        expansion = int(meta.get("expansion", DEFAULT_EXPANSION))

    counted = None
    capacity = options.capacity
    if capacity is None:
        capacity = int(meta["capacity"]) if "capacity" in meta else "auto"
    if capacity == "auto":
        events("counting the source for --capacity auto", {"phase": "count"})
        counted = source.count()
        capacity = max(math.ceil(counted * options.headroom), 1)
        events(
            f"counted {counted:,} rows: capacity {capacity:,} (headroom x{options.headroom:g})",
            {"phase": "count", "rows": counted, "capacity": capacity},
        )
    if isinstance(capacity, str):
        raise UsageError(f"--capacity must be a number or auto, got {capacity!r}")
    the_plan = backend.check_plan(plan(capacity, error_rate, expansion))
    return the_plan, backend, counted


def verify(
    client: Any,
    backend: Backend,
    keys: bytes | list[bytes],
    items: Iterator[list[bytes]],
    *,
    window: int = DEFAULT_WINDOW,
) -> int:
    """Check that every item is in its filter (pipelined MEXISTS; with several keys, each item in
    its shard's). Returns the number checked; raises VerifyFailed on any miss."""
    targets = [keys] if isinstance(keys, bytes) else keys
    checked, misses, examples = 0, 0, []
    pipe = client.pipeline(transaction=False)
    queued: list[list[bytes]] = []

    def flush() -> None:
        nonlocal checked, misses
        for batch, reply in zip(queued, pipe.execute(), strict=True):
            checked += len(batch)
            for item, present in zip(batch, backend.parse_flags(reply), strict=True):
                if not present:
                    misses += 1
                    if len(examples) < MAX_MISS_EXAMPLES:
                        examples.append(to_display(item))
        queued.clear()

    for batch in items:
        groups = [batch] if len(targets) == 1 else sharding.route(batch, len(targets))
        for key, group in zip(targets, groups, strict=True):
            for start in range(0, len(group), VERIFY_BATCH):
                chunk = group[start : start + VERIFY_BATCH]
                pipe.execute_command(*backend.mexists_command(client, key, chunk))
                queued.append(chunk)
                if len(queued) >= window:
                    flush()
    if queued:
        flush()
    if misses:
        where = to_display(targets[0]) if len(targets) == 1 else f"the {len(targets)} shard standbys"
        raise VerifyFailed(
            f"{misses:,} of {checked:,} checked items are missing from {where!r} "
            f"(e.g. {', '.join(repr(e) for e in examples)}): nothing swapped"
        )
    return checked


@dataclass(frozen=True)
class Targets:
    """The filters a rebuild writes: the key itself, or every member of a sharded filter."""

    members: list[bytes]
    plan: Plan  # of each member
    manifest: sharding.Manifest | None = None
    new_manifest: bool = False  # a first sharded build: write the manifest once the lock is held

    @property
    def families(self) -> list[KeyFamily]:
        return [KeyFamily.of(member) for member in self.members]


def _targets(client: Any, family: KeyFamily, total: Plan, backend: Backend, options: RebuildOptions) -> Targets:
    manifest = sharding.read_manifest(client, family.active)
    if manifest is not None:
        if options.shards not in (None, manifest.shards):
            raise UsageError(
                f"{to_display(family.active)!r} has {manifest.shards} shards; the count never changes "
                "(build a new sharded filter under another key)"
            )
        return Targets(
            list(manifest.members), backend.check_plan(sharding.shard_plan(total, manifest.shards)), manifest
        )
    if options.shards is None:
        return Targets([family.active], total)
    if backends.key_type(client, family.active) != b"none":
        raise StateConflict(f"{to_display(family.active)!r} is a single filter: a sharded filter needs a new key")
    per_shard = backend.check_plan(sharding.shard_plan(total, options.shards))
    manifest = sharding.new_manifest(client, family.active, options.shards, per_shard, backend)
    return Targets(list(manifest.members), per_shard, manifest, new_manifest=True)


def rebuild(
    client: Any,
    server: ServerInfo,
    key: str | bytes,
    source: CsvSource | SqlSource,
    options: RebuildOptions,
    *,
    events: Events | None = None,
    progress: Progress | None = None,
) -> RebuildReport:
    started = time.perf_counter()
    log = events or (lambda message, fields: None)
    family = KeyFamily.of(key)
    if options.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {options.batch_size}")
    lifecycle.to_keep_ms(options.keep_old)  # validated before anything is written
    if options.since_column:
        if not isinstance(source, SqlSource):
            raise UsageError("--since-column needs a SQL source")
        SqlSource.check_column_name(options.since_column)
    if not 0 <= options.catchup_skew <= MAX_CATCHUP_SKEW or not 1 <= options.headroom <= MAX_HEADROOM:
        raise UsageError(f"--catchup-skew must be 0-{MAX_CATCHUP_SKEW:.0f} s and --headroom 1-{MAX_HEADROOM:.0f}")
    if options.verify_all and not source.rewindable:
        raise UsageError("--verify all reads the source twice: give a file, not stdin")
    source.preflight()  # a wrong column, template or URL fails here, before anything is written
    the_plan, backend, counted = resolve_plan(client, server, key, source, options, log)
    targets = _targets(client, family, the_plan, backend, options)
    sharded = targets.manifest is not None
    standbys = [f.standby for f in targets.families]
    report = RebuildReport(
        key=to_display(family.active),
        standby=to_display(family.standby) if not sharded else f"{len(standbys)} shard standbys",
        backend=backend.name,
        plan=the_plan,
        counted=counted,
        dry_run=options.dry_run,
        shards=len(standbys),
    )
    member_plan = targets.plan
    log(
        f"plan: capacity {the_plan.capacity:,}, error rate {the_plan.error_rate:g}, "
        f"{'expansion ' + str(the_plan.expansion) if the_plan.scaling else 'nonscaling'}, {backend.name}"
        + (f", {len(standbys)} shards of {member_plan.capacity:,}" if sharded else ""),
        {
            "phase": "plan",
            "capacity": the_plan.capacity,
            "error_rate": the_plan.error_rate,
            "expansion": the_plan.expansion,
            "backend": backend.name,
            "shards": len(standbys),
        },
    )

    if options.dry_run:
        for _batch in source.batches(options.batch_size):
            pass
        report.source = source.stats
        report.seconds = time.perf_counter() - started
        return report

    generation = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{random.getrandbits(32):08x}"
    with FilterLock(client, family.active, command="bloomctl rebuild", ttl_ms=options.lock_ttl_ms) as lock:
        replaced, freed = 0, {}
        for member in targets.families:
            if backends.key_type(client, member.standby) != b"none":
                stale = backends.for_key(client, member.standby, "standby")
                replaced += stale.card(client, member.standby)
                freed[member.standby] = stale.info(client, member.standby, with_header=False).size_bytes
                report.replaced_standby = replaced
        if not options.force:  # the stale standbys about to be replaced free their memory first
            lifecycle.check_memory_many(
                client,
                [
                    (f.standby, max(backend.size_bytes(member_plan) - freed.get(f.standby, 0), 0))
                    for f in targets.families
                ],
            )
        if report.replaced_standby is not None:
            log(
                f"replacing the standby {report.standby!r} left by an earlier run ({replaced:,} items)",
                {"phase": "standby", "replaced_items": replaced},
            )
        meta = {**lifecycle.metadata_for(member_plan, backend.name), "state": "loading", "generation": generation}
        for member in targets.families:
            client.unlink(member.standby, member.standby_meta)
            client.hset(member.standby_meta, mapping=meta)  # marked before it exists: no unmarked window
            backend.reserve(client, member.standby, member_plan)

        def mark(state: str) -> None:
            """Set the standbys' state, only while the lock and the standbys are still this run's."""
            lock.check_held()
            for member in targets.families:
                if not client.register_script(MARK_LUA)(keys=[member.standby_meta], args=[generation, state]):
                    raise StateConflict(f"the standby {to_display(member.standby)!r} was replaced by another run")

        since = source.now() if options.since_column else None
        reservoir = (
            None
            if options.verify_all or options.verify_sample <= 0
            else Reservoir(options.verify_sample, random.Random(options.seed))
        )
        log(f"loading {source.description} into {report.standby!r}", {"phase": "load"})

        def load(batches: Iterator[list[bytes]], progress_: Progress | None) -> LoadStats:
            loader = Loader(
                client, backend, standbys, window=options.window, batch_size=options.batch_size, progress=progress_
            )
            return loader.load(_sampled(batches, reservoir))

        report.load = load(source.batches(options.batch_size), progress)
        report.source = source.stats
        if counted is not None and report.source.items > 1.1 * counted + 100:
            log(
                f"counted {counted:,} rows but read {report.source.items:,} items: the capacity from --capacity auto "
                "is too small (odd line ends?); give --capacity",
                {"phase": "load", "warning": "capacity"},
            )
        if report.source.items == 0:
            for member in targets.families:
                client.unlink(member.standby, member.standby_meta)
            raise SourceError(f"{source.description} yielded no items: refusing to build an empty filter")
        lock.check()

        if options.since_column:
            assert isinstance(source, SqlSource)
            moment = since - timedelta(seconds=options.catchup_skew)
            recent = source.since(options.since_column, moment)
            log(f"catching up on rows with {options.since_column} >= {moment}", {"phase": "catchup"})
            report.catchup = load(recent.batches(options.batch_size), None)
            report.catchup_rows = recent.stats.items
            lock.check()

        try:
            if options.verify_all:
                report.verify_mode = "all"
                log("verifying every item against the standby", {"phase": "verify", "mode": "all"})
                everything = source.before(options.since_column, since) if options.since_column else source
                report.verified = verify(
                    client, backend, standbys, everything.batches(options.batch_size), window=options.window
                )
            elif reservoir is not None:
                log(f"verifying a sample of {len(reservoir.items):,} items", {"phase": "verify", "mode": "sample"})
                report.verified = verify(client, backend, standbys, iter([reservoir.items]), window=options.window)
            else:
                report.verify_mode = "none"
        except VerifyFailed:
            mark("failed")
            raise
        mark("verified" if report.verify_mode != "none" else "loaded")
        lock.check()
        if targets.new_manifest:  # a first sharded build: the filter exists once its members are ready
            sharding.write_manifest(client, targets.manifest)

        report.size_bytes = sum(backend.info(client, standby, with_header=False).size_bytes for standby in standbys)
        if options.swap:
            if targets.manifest is not None:
                replaced_active = sharding.swap_sharded(
                    client,
                    server,
                    targets.manifest,
                    keep_old_seconds=options.keep_old,
                    min_ratio=options.min_ratio,
                    allow_shrink=options.allow_shrink,
                    lock=lock,
                )
            else:
                prepared = lifecycle.prepare_swap(
                    client, server, family.active, min_ratio=options.min_ratio, allow_shrink=options.allow_shrink
                )
                replaced_active = [
                    lifecycle.swap(client, prepared, keep_old_seconds=options.keep_old, lock_token=lock.token)
                ]
            report.replaced_active = any(replaced_active)
            report.swapped = True
            log(f"swapped {report.standby!r} into {report.key!r}", {"phase": "swap"})
    report.seconds = time.perf_counter() - started
    return report
