"""Rebuild steps 3 and 4, load and catch up: stream the source into the standbys.

The load keeps a uniform random sample of the items for step 5 (a reservoir, costing almost
nothing per item). The catch-up re-reads the rows of an incremental (SQL) source changed
since the load started, minus a clock skew, so rows written during the load are not missed.
"""

from __future__ import annotations

import importlib.util
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


class KeyedReservoir:
    """The same uniform sample, drawn with numpy: every item gets a uniform random key and the
    ``size`` smallest keys win (a uniform sample without replacement). A batch costs one vector of
    random numbers; only the items that enter the sample are turned into bytes, and the pool is
    cut back to ``size`` only when it has doubled."""

    def __init__(self, size: int, seed: int | None) -> None:
        import numpy as np

        self.np = np
        self.size = size
        self.rng = np.random.default_rng(seed)
        self.keys = np.empty(0, dtype=np.float64)
        self.pool: list[bytes] = []

    def feed(self, batch: Batch) -> None:
        np = self.np
        if self.size <= 0 or len(batch) == 0:
            return
        keys = self.rng.random(len(batch))
        if len(self.pool) >= self.size:
            entering = np.flatnonzero(keys < np.partition(self.keys, self.size - 1)[self.size - 1])
        else:
            entering = np.arange(len(batch))
        if entering.size == 0:
            return
        self.keys = np.concatenate([self.keys, keys[entering]])
        self.pool += item_take(batch, entering.tolist())
        if len(self.pool) > 2 * self.size:
            self._cut()

    def _cut(self) -> None:
        """Keep the ``size`` items with the smallest keys."""
        if len(self.pool) > self.size:
            keep = self.np.argpartition(self.keys, self.size - 1)[: self.size]
            self.keys = self.keys[keep]
            self.pool = [self.pool[i] for i in keep.tolist()]

    @property
    def items(self) -> list[bytes]:
        self._cut()
        return self.pool


Sample = Reservoir | KeyedReservoir  # either keeps .items, the sample


def sampled(batches: Iterator[Batch], reservoir: Sample | None) -> Iterator[list[bytes]]:
    for batch in batches:
        if reservoir is not None:
            reservoir.feed(batch)
        yield batch


def new_reservoir(options: RebuildOptions) -> Sample | None:
    """The sample to verify, or None when every item is verified (a second pass) or none is;
    drawn with numpy where it is installed (ten times cheaper per batch)."""
    if options.verify_all or options.verify_sample <= 0:
        return None
    if importlib.util.find_spec("numpy") is not None:
        return KeyedReservoir(options.verify_sample, options.seed)
    return Reservoir(options.verify_sample, random.Random(options.seed))


def load(
    client: RedisClient,
    backend: Backend,
    standbys: list[bytes],
    batches: Iterator[list[bytes]],
    options: RebuildOptions,
    *,
    reservoir: Sample | None = None,
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
    reservoir: Sample | None,
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
    reservoir: Sample | None = None,
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
