"""A uniform random sample of a stream of batches, kept while the stream goes by.

The rebuild verifies a sample of the items it loaded; the sample is drawn during the load, so
the source is read once. Two ways, the same distribution: Vitter's algorithm L with Python's
random numbers (no numpy needed), and random keys with numpy (the smallest keys win), which costs
one vector of random numbers a batch and lets the samples of parts read in parallel be merged.
"""

from __future__ import annotations

import math
import random
from typing import Any

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

    def absorb(self, keys: Any, pool: list[bytes]) -> None:
        """Take in another part's sample (its keys and items): the union's smallest keys are a
        uniform sample of both parts together, as if one reservoir had seen them all."""
        self.keys = self.np.concatenate([self.keys, keys])
        self.pool = self.pool + pool
        self._cut()


Sample = Reservoir | KeyedReservoir  # either keeps .items, the sample
