"""Rebuild steps 3 and 4, load and catch up: stream the source into the standbys.

The load keeps a uniform random sample of the items for step 5 (Vitter's reservoir, costing
almost nothing per item). The catch-up re-reads the rows of an incremental (SQL) source changed
since the load started, minus a clock skew, so rows written during the load are not missed.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

from bloomctl.backends import Backend
from bloomctl.client import RedisClient
from bloomctl.loader import Loader, LoadStats, Progress
from bloomctl.rebuild.options import Events, RebuildOptions
from bloomctl.rebuild.standby import Standbys
from bloomctl.sources import IncrementalSource
from bloomctl.sources.base import Batch, item_take


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

    def feed(self, batch: Batch) -> None:
        """Sample from one batch (a list of bytes, or an Arrow array: only the picked items are
        turned into bytes)."""
        if self.size <= 0:
            return
        start = 0
        if len(self.items) < self.size:
            start = min(self.size - len(self.items), len(batch))
            self.items.extend(item_take(batch, list(range(start))))
            self.seen += start
            if len(self.items) == self.size:
                self.next_index = self.seen - 1
                self._skip()
        end = self.seen + len(batch) - start
        picks: dict[int, int] = {}  # slot -> index in the batch; a later pick of a slot wins
        while len(self.items) == self.size and self.next_index < end:
            picks[self.rng.randrange(self.size)] = start + self.next_index - self.seen
            self._skip()
        for slot, item in zip(picks, item_take(batch, list(picks.values())), strict=True):
            self.items[slot] = item
        self.seen = end


def sampled(batches: Iterator[list[bytes]], reservoir: Reservoir | None) -> Iterator[list[bytes]]:
    for batch in batches:
        if reservoir is not None:
            reservoir.feed(batch)
        yield batch


def new_reservoir(options: RebuildOptions) -> Reservoir | None:
    """The sample to verify, or None when every item is verified (a second pass) or none is."""
    if options.verify_all or options.verify_sample <= 0:
        return None
    return Reservoir(options.verify_sample, random.Random(options.seed))


def load(
    client: RedisClient,
    backend: Backend,
    standbys: list[bytes],
    batches: Iterator[list[bytes]],
    options: RebuildOptions,
    *,
    reservoir: Reservoir | None = None,
    progress: Progress | None = None,
) -> LoadStats:
    loader = Loader(client, backend, standbys, window=options.window, batch_size=options.batch_size, progress=progress)
    return loader.load(sampled(batches, reservoir))


def catch_up(
    client: RedisClient,
    backend: Backend,
    standbys: list[bytes],
    source: IncrementalSource,
    since: datetime,
    options: RebuildOptions,
    reservoir: Reservoir | None,
    log: Events,
) -> tuple[LoadStats, int]:
    """Load the rows changed since ``since`` minus the skew; returns the load and the rows read."""
    assert options.since_column is not None
    moment = since - timedelta(seconds=options.catchup_skew)
    recent = source.since(options.since_column, moment)
    log(f"catching up on rows with {options.since_column} >= {moment}", {"phase": "catchup"})
    stats = load(client, backend, standbys, recent.batches(options.batch_size), options, reservoir=reservoir)
    return stats, recent.stats.items


def client_load(
    client: RedisClient,
    backend: Backend,
    batches: Iterator[Batch],
    standbys: Standbys,
    *,
    reservoir: Reservoir | None = None,
    progress: Progress | None = None,
) -> tuple[LoadStats, int]:
    """Build the standbys' bits in the client and put them in; returns the load and the bytes sent.

    Raises ``Overflow`` (a scaling filter outgrew one link) or ``MergeBusy`` (dual writes kept
    changing a standby) before any standby is changed: the caller takes the server path."""
    from bloomctl.build.client import ClientBuild

    started = time.perf_counter()
    build = ClientBuild(client, backend.name, standbys.targets.families)
    stats = LoadStats(per_key=[0] * len(standbys.targets.members))
    for batch in sampled(batches, reservoir):
        build.add(batch)
        stats.sent += len(batch)
        stats.batches += 1
        if progress is not None:
            progress(stats.sent)
    standbys.lock.check()
    sent = build.finish(standbys.generation, standbys.lock.check_held)
    stats.added = build.count
    stats.duplicates = stats.sent - stats.added
    stats.per_key = [member.array.count for member in build.members]
    stats.seconds = time.perf_counter() - started
    return stats, sent
