"""The rebuild, step by step: preflight, prepare the standbys, load, catch up, verify, cut over.

Each step is a function of its own module (named after the step); this one runs them in order
under the filter's lock. The preflight resolves the options once into each step's settings, and
each step gets only its own. A failure at any step leaves the active filter untouched.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from datetime import datetime

from bloomctl.backends import Backend
from bloomctl.defaults import DEFAULT_WARN as WARN_FILL
from bloomctl.errors import MadeMeanwhile, MissingExtra, SourceError, StateConflict, UnsupportedServer, VerifyFailed
from bloomctl.keys import KeyFamily, to_display
from bloomctl.lifecycle import front as lifecycle
from bloomctl.lifecycle.guards import SwapGuards
from bloomctl.lifecycle.lock import FilterLock
from bloomctl.lifecycle.manifest import write_manifest
from bloomctl.lifecycle.metadata import FAILED, INTERRUPTED, LOADED, VERIFIED
from bloomctl.lifecycle.standby import (
    Standbys,
    Targets,
    check_standby_memory,
    is_out_of_memory,
    out_of_memory,
    reserve_standbys,
    stale_standbys,
)
from bloomctl.rebuild.dedupe import Seen
from bloomctl.rebuild.load import Sample, catch_up, client_load, load, new_reservoir
from bloomctl.rebuild.loader import Progress, over_capacity
from bloomctl.rebuild.options import Events, RebuildOptions, RebuildReport
from bloomctl.rebuild.path import choose, describe
from bloomctl.rebuild.preflight import Preflight, preflight
from bloomctl.rebuild.settings import LoadSettings, VerifySettings
from bloomctl.rebuild.verify import verify
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.sizing.cuckoo import CuckooPlan
from bloomctl.sources import IncrementalSource, Source
from bloomctl.sources.base import prefetched

Batches = Iterator[list[bytes]]


def rebuild(
    client: RedisClient,
    server: ServerInfo,
    key: str | bytes,
    source: Source,
    options: RebuildOptions,
    *,
    events: Events | None = None,
    progress: Progress | None = None,
) -> RebuildReport:
    """Rebuild the filter ``key`` from ``source`` into its standby (or its members' standbys),
    verify it, and with ``options.swap`` cut over atomically. A dry run writes nothing, not even
    the function library."""
    if options.dry_run:
        from bloomctl.backends.library import installs_nothing

        with installs_nothing():
            return _rebuild(client, server, key, source, options, events, progress)
    return _rebuild(client, server, key, source, options, events, progress)


def _rebuild(
    client: RedisClient,
    server: ServerInfo,
    key: str | bytes,
    source: Source,
    options: RebuildOptions,
    events: Events | None,
    progress: Progress | None,
) -> RebuildReport:
    started = time.perf_counter()
    log: Events = events or (lambda message, fields: None)
    family = KeyFamily.of(key)
    ready = preflight(client, server, family, source, options, log)
    report = new_report(family, ready)
    log_plan(report, ready.targets, log)
    if ready.run.dry_run:
        for _batch in source.batches(ready.load.batch):
            pass
        report.source = source.stats
    else:
        under_lock(client, server, family, source, ready, options, report, log, progress)
    report.seconds = time.perf_counter() - started
    return report


def under_lock(
    client: RedisClient,
    server: ServerInfo,
    family: KeyFamily,
    source: Source,
    ready: Preflight,
    options: RebuildOptions,
    report: RebuildReport,
    log: Events,
    progress: Progress | None,
) -> None:
    """Steps 2 to 6 under the filter's lock, each given its own settings."""
    backend, run = ready.backend, ready.run
    with FilterLock(
        client, family.active, command=run.lock_command, ttl_ms=run.lock_ttl_ms, wait=run.lock_wait
    ) as lock:
        if run.only_if_missing and client.exists(family.active):  # a sharded filter's manifest is at the key too
            raise MadeMeanwhile("%r was made meanwhile by another run: nothing built", to_display(family.active))
        log(
            f"holding the lock {to_display(lock.lock_key)!r} (renewed, ttl {run.lock_ttl_ms / 1000:g}s)",
            {"phase": "lock", "level": "debug", "lock": to_display(lock.lock_key), "ttl_ms": run.lock_ttl_ms},
        )
        if backend.logs_dual_writes:  # the application's dual writes during the load call its functions
            from bloomctl.backends.library import Library

            Library().ensure(client)
        standbys = _standbys(client, backend, ready.targets, lock, run.force, ready.recipe, report, log)
        # a filter that counts copies gets each distinct item once, and the replay asks which it holds
        seen = Seen(ready.load.client_memory) if backend.counts_copies else None
        try:
            since = source.now() if ready.load.since_column and isinstance(source, IncrementalSource) else None
            reservoir = load_all(
                client, server, backend, source, standbys, since, ready.load, run.force, report, log, progress, seen
            )
            again = functools.partial(all_items, source, since, ready.load)
            verify_all(client, backend, standbys, reservoir, again, ready.verify, report, log, seen)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: say so in the metadata, then stop
            with contextlib.suppress(Exception):
                standbys.mark(INTERRUPTED)
            raise
        except Exception as exc:
            if not is_out_of_memory(exc):
                # never swapped in (a standby of another run keeps its own mark), and a cuckoo
                # standby's log stops growing with the application's writes
                with contextlib.suppress(Exception):
                    standbys.mark(FAILED)
                _explain_by_a_lost_lock(lock, exc)
                raise
            standbys.discard()  # a standby that cannot grow is worthless, and keeps the server over its limit
            raise out_of_memory(exc, family.standby) from None
        # Verified: from here on a failure (memory, a signal) never discards or marks a standby, so
        # that a swap stopped part-way (sharded) is finished by `bloomctl swap`.
        cut_over(client, server, family, backend, ready.targets, lock, ready.guards if run.swap else None, report, log)


def _explain_by_a_lost_lock(lock: FilterLock, exc: Exception) -> None:
    """A write that failed because another run took the lock (and replaced the standby) reports
    the lost lock, not the failed write it caused."""
    if isinstance(exc, StateConflict) and "lost the lock" in str(exc):
        return
    try:
        lock.check_held()
    except StateConflict as lost:
        raise lost from exc
    except Exception:  # the server cannot say: the original error stands
        return


def new_report(family: KeyFamily, ready: Preflight) -> RebuildReport:
    chosen = ready.targets
    sharded = chosen.manifest is not None
    return RebuildReport(
        key=to_display(family.active),
        standby=to_display(family.standby) if not sharded else f"{len(chosen.members)} shard standbys",
        backend=ready.backend.name,
        plan=ready.plan,
        counted=ready.counted,
        dry_run=ready.run.dry_run,
        shards=len(chosen.members),
    )


def _standbys(
    client: RedisClient,
    backend: Backend,
    targets: Targets,
    lock: FilterLock,
    force: bool,
    recipe: str | None,
    report: RebuildReport,
    log: Events,
) -> Standbys:
    """Step 2: what an earlier run left is counted, the memory checked (unless ``force``), and the
    standbys replaced with empty ones marked ``loading``."""
    stale = stale_standbys(client, targets)
    report.replaced_standby = stale.items
    if not force:  # the stale standbys about to be replaced free their memory first
        check_standby_memory(client, backend, targets, stale)
    if stale.items is not None:
        log(
            f"replacing the standby {report.standby!r} left by an earlier run ({stale.items:,} items)",
            {"phase": "standby", "replaced_items": stale.items},
        )
    return reserve_standbys(client, backend, targets, lock, recipe)


def log_plan(report: RebuildReport, chosen: Targets, log: Events) -> None:
    the_plan, shards = report.plan, len(chosen.members)
    log(
        f"plan: capacity {the_plan.capacity:,}, error rate {the_plan.error_rate:g}, "
        f"{'expansion ' + str(the_plan.expansion) if the_plan.scaling else 'nonscaling'}, {report.backend}"
        + (f", {shards} shards of {chosen.plan.capacity:,}" if chosen.manifest is not None else ""),
        {
            "phase": "plan",
            "capacity": the_plan.capacity,
            "error_rate": the_plan.error_rate,
            "expansion": the_plan.expansion,
            "backend": report.backend,
            "shards": shards,
        },
    )


def load_all(
    client: RedisClient,
    server: ServerInfo,
    backend: Backend,
    source: Source,
    standbys: Standbys,
    since: datetime | None,
    settings: LoadSettings,
    force: bool,
    report: RebuildReport,
    log: Events,
    progress: Progress | None,
    seen: Seen | None = None,
) -> Sample | None:
    """Steps 3 and 4: the load (in the client, or on the server), then (SQL with ``since_column``)
    the catch-up from ``since``. Returns the sample to verify. With ``seen`` (a cuckoo filter),
    only the first sight of each item is inserted; ``force`` skips the check of the server's room
    for a client build's upload."""
    keys = standbys.targets.standbys
    try:
        path = choose(client, server, backend, source, standbys.targets, settings, force)
    except (UnsupportedServer, MissingExtra):
        # `build` client refused before any item was loaded: the standby is empty, and on a server
        # short of memory it holds the very memory the refusal was about
        standbys.discard()
        raise
    report.build, report.build_note = path.where, path.reason
    log(describe(path), {"phase": "load", "build": path.where, "reason": path.reason})
    log(f"loading {source.description} into {report.standby!r}", {"phase": "load"})
    if path.where == "client":
        reservoir = build_in_client(client, backend, source, standbys, settings, report, log, progress)
    else:
        reservoir = load_on_server(client, backend, source, standbys, settings, report, progress, seen)
    report.source = source.stats
    if settings.engine is not None and report.counted is not None and report.source.rows != report.counted:
        # the engine counted the same DataFrame its tasks read: a task's share went missing (or came twice)
        standbys.discard()
        raise SourceError(
            "the engine's tasks read %s rows of the %s the DataFrame holds: nothing is swapped",
            report.source.rows,
            report.counted,
        )
    if report.counted is not None and report.source.items > 1.1 * report.counted + 100:
        log(
            f"counted {report.counted:,} rows but read {report.source.items:,} items: the capacity counted "
            "for 'auto' is too small (odd line ends?); give the capacity",
            {"phase": "load", "warning": "capacity"},
        )
    if report.source.items == 0:
        standbys.discard()
        raise SourceError("%s yielded no items: refusing to build an empty filter", source.description)
    standbys.lock.check()
    if since is not None and isinstance(source, IncrementalSource):
        report.catchup, report.catchup_rows = catch_up(
            client, backend, keys, source, since, settings, reservoir, log, standbys.lock.check_writing, seen
        )
        standbys.lock.check()
    if seen is not None:  # the repeats were never sent: they count as already present
        report.load.duplicates += seen.duplicates - (report.catchup.duplicates if report.catchup else 0)
    check_fill(client, backend, standbys, log)
    return reservoir


def growth_limit(backend: Backend, standbys: Standbys) -> int | None:
    """The items a standby may take when its backend would take more (bitmap: its capacity); None
    otherwise (RedisBloom grows, or refuses a NONSCALING filter's item past its capacity itself)."""
    return standbys.targets.plan.capacity if backend.overfills else None


def check_fill(client: RedisClient, backend: Backend, standbys: Standbys, log: Events) -> None:
    """After the load (dual writes and the catch-up included): a filter that never grows and holds
    more than its capacity is refused (marked failed, never swapped); over 80% full is a warning.
    A cuckoo filter is judged by its load: past the measured load where inserts start to fail."""
    capacity = standbys.targets.plan.capacity
    if isinstance(standbys.targets.plan, CuckooPlan):
        check_cuckoo_fill(client, backend, standbys, log)
        return
    for member in standbys.targets.families:
        items = backend.card(client, member.standby)
        if backend.overfills and items > capacity:
            standbys.mark(FAILED)
            raise over_capacity(to_display(member.standby), items, capacity)
        if items > WARN_FILL * capacity and (backend.overfills or not standbys.targets.plan.scaling):
            log(
                f"the new filter {to_display(member.standby)!r} holds {items:,} items, {items / capacity:.0%} of its "
                f"capacity of {capacity:,}: it never grows; plan a larger capacity before it fills",
                {"phase": "load", "warning": "fill", "items": items, "capacity": capacity},
            )


def check_cuckoo_fill(client: RedisClient, backend: Backend, standbys: Standbys, log: Events) -> None:
    the_plan = standbys.targets.plan
    assert isinstance(the_plan, CuckooPlan)
    standby = standbys.targets.families[0].standby
    state = backend.info(client, standby, with_header=False)
    if state.filters > 1:
        log(
            f"the new filter {to_display(standby)!r} grew to {state.filters} sub-filters while loading: every lookup "
            "checks each, and its false-positive rate adds up; plan a larger capacity",
            {"phase": "load", "warning": "grew", "filters": state.filters},
        )
    elif state.fill_ratio > WARN_FILL * the_plan.full_load:
        log(
            f"the new filter {to_display(standby)!r} holds {state.items:,} items, a load of {state.fill_ratio:.0%}; its "
            f"inserts start to fail at about {the_plan.full_load:.0%}: plan a larger capacity before it fills",
            {"phase": "load", "warning": "fill", "items": state.items},
        )


def build_in_client(
    client: RedisClient,
    backend: Backend,
    source: Source,
    standbys: Standbys,
    settings: LoadSettings,
    report: RebuildReport,
    log: Events,
    progress: Progress | None,
) -> Sample | None:
    """The client build; when it cannot finish (the filter would grow a sub-filter, or dual writes
    kept changing the standby) and the source can be read again, the server path instead."""
    from bloomctl import native as kernel
    from bloomctl.rebuild.build.client import Overflow
    from bloomctl.rebuild.build.redisbloom import MergeBusy

    reservoir = new_reservoir(settings)
    report.build_kernel = kernel.name()
    try:
        report.load, report.uploaded_bytes = client_load(
            client, backend, source, standbys, settings, reservoir=reservoir, progress=progress, log=log
        )
        return reservoir
    except (Overflow, MergeBusy) as exc:
        if settings.engine is not None:  # never the whole source through this one process instead
            raise StateConflict(
                "the engine's build cannot finish: %s (raise `capacity`, or rebuild without `engine`)", str(exc)
            ) from None
        if settings.build == "client" or not source.rewindable:
            raise StateConflict("the client build cannot finish: %s (use `build` server)", str(exc)) from None
        report.build, report.build_note, report.build_kernel = "server", str(exc), None
        log(f"{exc}: building on the server instead", {"phase": "load", "build": "server", "reason": str(exc)})
    return load_on_server(client, backend, source, standbys, settings, report, progress)


def load_on_server(
    client: RedisClient,
    backend: Backend,
    source: Source,
    standbys: Standbys,
    settings: LoadSettings,
    report: RebuildReport,
    progress: Progress | None,
    seen: Seen | None = None,
) -> Sample | None:
    """The server path: batches in flight into the standbys, never past a bitmap's capacity, the
    lock checked before each batch (with ``seen``, each item once). Returns the sample to verify."""
    reservoir = new_reservoir(settings)
    batches = prefetched(source.batches(settings.batch))
    report.load = load(
        client,
        backend,
        standbys.targets.standbys,
        seen.batches(batches) if seen is not None else batches,
        settings,
        reservoir=reservoir,
        progress=progress,
        limit=growth_limit(backend, standbys),
        check=standbys.lock.check_writing,
    )
    return reservoir


def verify_all(
    client: RedisClient,
    backend: Backend,
    standbys: Standbys,
    reservoir: Sample | None,
    every_item: Callable[[], Batches],
    settings: VerifySettings,
    report: RebuildReport,
    log: Events,
    seen: Seen | None = None,
) -> None:
    """Step 5: every item (``every_item`` reads the source again) or the sample must be in the
    standbys; then (a cuckoo filter) the application's writes during the load are replayed into it."""
    keys = standbys.targets.standbys
    try:
        if settings.every:
            report.verify_mode = "all"
            log("verifying every item against the standby", {"phase": "verify", "mode": "all"})
            report.verified = verify(client, backend, keys, every_item(), window=settings.window)
        elif reservoir is not None:
            log(f"verifying a sample of {len(reservoir.items):,} items", {"phase": "verify", "mode": "sample"})
            sample = iter([reservoir.items])
            report.verified = verify(client, backend, keys, sample, window=settings.window)
        else:
            report.verify_mode = "none"
    except VerifyFailed:
        standbys.mark(FAILED)
        raise
    if seen is not None:
        from bloomctl.rebuild.replay import replay

        try:
            report.replayed = replay(client, standbys, seen, log, backend.batch_for(standbys.targets.plan))
        except StateConflict:
            with contextlib.suppress(Exception):
                standbys.mark(FAILED)
            raise
    standbys.mark(VERIFIED if report.verify_mode != "none" else LOADED)
    standbys.lock.check()


def all_items(source: Source, since: datetime | None, settings: LoadSettings) -> Batches:
    """Every item the standby must hold: on a live table, the rows from before the load started."""
    if settings.since_column and isinstance(source, IncrementalSource) and since is not None:
        return source.before(settings.since_column, since).batches(settings.batch)
    return source.batches(settings.batch)


def cut_over(
    client: RedisClient,
    server: ServerInfo,
    family: KeyFamily,
    backend: Backend,
    chosen: Targets,
    lock: FilterLock,
    guards: SwapGuards | None,
    report: RebuildReport,
    log: Events,
) -> None:
    """Step 6: a first sharded build writes its manifest (the filter exists once its members are
    ready); with ``guards`` (a rebuild with ``swap``), the verified standbys replace the active
    filter(s) atomically."""
    if chosen.new_manifest and chosen.manifest is not None:
        write_manifest(client, chosen.manifest)
    report.size_bytes = sum(backend.info(client, s, with_header=False).size_bytes for s in chosen.standbys)
    if guards is None:
        return
    result = lifecycle.guarded_swap(client, server, family.active, guards, lock=lock)
    report.replaced_active = any(result.replaced)
    report.swapped = True
    if result.note is not None:
        log(result.note, {"phase": "swap", "warning": "reply lost"})
    log(f"swapped {report.standby!r} into {report.key!r}", {"phase": "swap"})
