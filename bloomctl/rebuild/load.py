"""Rebuild steps 3 and 4, load and catch up: stream the source into the standbys.

The load keeps a uniform random sample of the items for step 5 (a reservoir, costing almost
nothing per item). The catch-up re-reads the rows of an incremental (SQL) source changed
since the load started, minus a clock skew, so rows written during the load are not missed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from bloomctl import extras
from bloomctl.backends import Backend
from bloomctl.defaults import CLIENT_BATCH
from bloomctl.lifecycle.standby import Standbys
from bloomctl.rebuild.dedupe import Seen
from bloomctl.rebuild.loader import Loader, LoadStats, Progress
from bloomctl.rebuild.options import Events
from bloomctl.rebuild.sampling import KeyedReservoir, Reservoir, Sample
from bloomctl.rebuild.settings import LoadSettings
from bloomctl.server.client import RedisClient
from bloomctl.sources import IncrementalSource, Source
from bloomctl.sources.base import Batch, prefetched

if TYPE_CHECKING:  # pragma: no cover - numpy is loaded only by a client build
    from bloomctl.rebuild.build.client import ClientBuild


def sampled(batches: Iterator[Batch], reservoir: Sample | None) -> Iterator[list[bytes]]:
    for batch in batches:
        if reservoir is not None:
            reservoir.feed(batch)
        yield batch


def new_reservoir(settings: LoadSettings) -> Sample | None:
    """The sample to verify, or None when every item is verified (a second pass) or none is;
    drawn with numpy where it is installed (ten times cheaper per batch)."""
    if settings.sample <= 0:
        return None
    if extras.available(extras.CLIENT_BUILD):  # (a numpy that does not import: the pure-Python reservoir)
        return KeyedReservoir(settings.sample, settings.seed)
    return Reservoir(settings.sample, random.Random(settings.seed))


def load(
    client: RedisClient,
    backend: Backend,
    standbys: list[bytes],
    batches: Iterator[list[bytes]],
    settings: LoadSettings,
    *,
    reservoir: Sample | None = None,
    progress: Progress | None = None,
    limit: int | None = None,
    check: Callable[[], None] | None = None,
) -> LoadStats:
    loader = Loader(
        client,
        backend,
        standbys,
        window=settings.window,
        batch_size=settings.batch,
        progress=progress,
        max_rate=settings.max_rate,
        limit=limit,
        check=check,
    )
    return loader.load(sampled(batches, reservoir))


def catch_up(
    client: RedisClient,
    backend: Backend,
    standbys: list[bytes],
    source: IncrementalSource,
    since: datetime,
    settings: LoadSettings,
    reservoir: Sample | None,
    log: Events,
    check: Callable[[], None] | None = None,
    seen: Seen | None = None,
) -> tuple[LoadStats, int]:
    """Load the rows changed since ``since`` minus the skew; returns the load and the rows read.
    With ``seen`` (a cuckoo filter), items the load inserted already are not sent again."""
    assert settings.since_column is not None
    moment = since - timedelta(seconds=settings.catchup_skew)
    recent = source.since(settings.since_column, moment)
    log(f"catching up on rows with {settings.since_column} >= {moment}", {"phase": "catchup"})
    batches = recent.batches(settings.batch)
    before = seen.duplicates if seen is not None else 0
    stats = load(
        client,
        backend,
        standbys,
        seen.batches(batches) if seen is not None else batches,
        settings,
        reservoir=reservoir,
        check=check,
    )
    if seen is not None:
        stats.duplicates += seen.duplicates - before
    return stats, recent.stats.items


def client_load(
    client: RedisClient,
    backend: Backend,
    source: Source,
    standbys: Standbys,
    settings: LoadSettings,
    *,
    reservoir: Sample | None = None,
    progress: Progress | None = None,
    log: Events | None = None,
) -> tuple[LoadStats, int]:
    """Build the standbys' bits in the client (in ``settings.jobs`` processes, each on its part of
    the source) and put them in; returns the load and the bytes sent.

    Raises ``Overflow`` (a scaling filter outgrew one link) or ``MergeBusy`` (dual writes kept
    changing a standby) before any standby is changed: the caller takes the server path."""
    from bloomctl.rebuild.build.client import ClientBuild

    started = time.perf_counter()
    build = ClientBuild(client, backend.name, standbys.targets.families)
    stats = LoadStats(per_key=[0] * len(standbys.targets.members))
    warn = log or (lambda message, fields: None)
    if settings.engine is not None:
        stats.sent, stats.batches = _by_engine(build, source, settings, reservoir, warn), 1
        if progress is not None:
            progress(stats.sent)
    elif settings.jobs > 1:
        stats.sent, stats.batches = _in_parts(build, source, settings, reservoir, warn), settings.jobs
        if progress is not None:
            progress(stats.sent)
    else:
        batches = sampled(source.fast_batches(CLIENT_BATCH), reservoir)
        for count, prepared in prefetched((len(batch), build.prepare(batch)) for batch in batches):
            build.apply(prepared)  # the reading thread hashed the batch; this one sets its bits
            stats.sent += count
            stats.batches += 1
            if progress is not None:
                progress(stats.sent)
    standbys.lock.check()
    sent = build.finish(standbys.generation, standbys.lock.check_held)
    stats.added = build.count
    stats.duplicates = stats.sent - stats.added
    stats.per_key = [array.count for array in build.arrays]
    stats.seconds = time.perf_counter() - started
    return stats, sent


def _by_engine(
    build: ClientBuild, source: Source, settings: LoadSettings, reservoir: Sample | None, log: Events
) -> int:
    """The distributed build: the engine's tasks build parts of the bits from its reads of the
    source, merged into one; ORed into ``build``, its sample into ``reservoir``, and its count
    settled against the bits (an item in two tasks' shares was counted by both). Returns the
    items read."""
    from bloomctl.rebuild.build.spec import BuildSpec, check_part
    from bloomctl.sources.base import recipe_of

    keyed = reservoir if isinstance(reservoir, KeyedReservoir) else None
    recipe = recipe_of(source)
    spec = BuildSpec(
        build.backend,
        tuple(build.layouts),
        tuple(build.names),
        column=recipe["column"],  # type: ignore[arg-type]
        template=recipe["template"],  # type: ignore[arg-type]
        prefix=recipe["prefix"],  # type: ignore[arg-type]
        sample_size=keyed.size if keyed is not None else 0,
        seed=settings.seed,
    )
    log(f"building the bits on {settings.engine.description}", {"phase": "load", "engine": settings.engine.name})
    part = check_part(settings.engine.build(spec, source), spec)
    build.merge(part.datas, part.counts)
    if keyed is not None:
        keyed.absorb(part.sample_keys, part.sample)
    build.settle(
        [part.largest], disjoint_items=False, warn=lambda message: log(message, {"phase": "load", "warning": "count"})
    )
    source.stats = part.stats
    return part.stats.items


def _in_parts(build: ClientBuild, source: Source, settings: LoadSettings, reservoir: Sample | None, log: Events) -> int:
    """The parallel build: the parts' bits ORed into ``build``, their samples into ``reservoir``;
    returns the items read."""
    from bloomctl.rebuild.build.parallel import build_parts

    keyed = reservoir if isinstance(reservoir, KeyedReservoir) else None
    parts, merged = build_parts(
        source,
        build.backend,
        build.layouts,
        build.names,
        jobs=settings.jobs,
        split_column=settings.split_column,
        batch=CLIENT_BATCH,
        sample_size=keyed.size if keyed is not None else 0,
        seed=settings.seed,
    )
    for part in parts:
        build.merge(part.datas, part.counts)
        if keyed is not None:
            keyed.absorb(part.sample_keys, part.sample)
    build.settle(
        [part.counts for part in parts],
        disjoint_items=source.shared_parse,
        warn=lambda message: log(message, {"phase": "load", "warning": "count"}),
    )
    source.stats = merged
    return merged.items
