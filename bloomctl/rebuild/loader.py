"""Loader: stream batches of items into one filter, or into the shards of a sharded filter.

For each target key the loader uses one connection to the node that owns it (on a cluster a
standby shares its active key's slot). It packs each batch with hiredis and sends the next ones
while the server works on the first, up to ``window`` batches ahead per connection, then reads
each reply and counts per-item results. With several keys (shards), items are routed by
``crc32 mod N`` and every shard's node is kept busy at once from this single thread.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from bloomctl.backends import Backend
from bloomctl.defaults import DEFAULT_BATCH_SIZE, DEFAULT_WINDOW
from bloomctl.errors import StateConflict
from bloomctl.keys import to_display
from bloomctl.lifecycle.routing import route
from bloomctl.server.client import RedisClient
from bloomctl.server.topology import node_client
from bloomctl.sources.base import item_list

Progress = Callable[[int], None]  # called with the number of items written so far


@dataclass
class LoadStats:
    sent: int = 0  # items sent to the server
    added: int = 0  # items that were new to the filter
    duplicates: int = 0  # items the filter already had (repeats, and rare false positives)
    batches: int = 0
    seconds: float = 0.0
    per_key: list[int] = field(default_factory=list)  # items sent to each target key

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "added": self.added,
            "duplicates": self.duplicates,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            "items_per_second": round(self.rate),
        }


def _packer() -> Callable[[tuple[Any, ...]], bytes] | None:
    try:
        from hiredis import pack_command
    except ImportError:  # pragma: no cover - hiredis is a dependency; redis-py's packer is the fallback
        return None
    return pack_command


def over_capacity(key: bytes | str, items: int, capacity: int) -> StateConflict:
    """A filter that never grows (the bitmap backend) would take more items than its capacity."""
    return StateConflict(
        "the filter %r would hold %s items, over its capacity of %s: it never grows, and past its capacity "
        "it answers 'maybe' for ever more absent items; raise `capacity` (or `headroom`)",
        to_display(key),
        f"{items:,}+" if isinstance(key, bytes) else f"{items:,}",
        f"{capacity:,}",
    )


class _Target:
    """One key, its connection and the sizes of its unanswered batches."""

    def __init__(self, loader: Loader, key: bytes) -> None:
        self.loader, self.key = loader, key
        self.pool = node_client(loader.client, key).connection_pool
        self.conn = self.pool.get_connection()
        self.pending: deque[int] = deque()
        self.buffer: list[bytes] = []
        self.added = 0  # new items in this key, counted from the replies

    def send(self, batch: list[bytes]) -> None:
        loader = self.loader
        if loader.check is not None:
            loader.check()
        loader.throttle()
        command = loader.backend.madd_command(loader.client, self.key, batch)
        if loader.pack is not None:
            self.conn.send_packed_command([loader.pack(command)], check_health=False)
        else:
            self.conn.send_command(*command, check_health=False)
        self.pending.append(len(batch))
        loader.stats.sent += len(batch)
        loader.stats.batches += 1
        if len(self.pending) >= loader.window:
            loader.read(self, self.pending.popleft())

    def drain(self) -> None:
        while self.pending:
            self.loader.read(self, self.pending.popleft())

    def close(self, broken: bool) -> None:
        if broken:
            self.conn.disconnect()  # unread replies would desynchronise the connection
        self.pool.release(self.conn)


class Loader:
    def __init__(
        self,
        client: RedisClient,
        backend: Backend,
        keys: bytes | Sequence[bytes],
        *,
        window: int = DEFAULT_WINDOW,
        batch_size: int = DEFAULT_BATCH_SIZE,
        progress: Progress | None = None,
        max_rate: float | None = None,
        limit: int | None = None,
        check: Callable[[], None] | None = None,
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.client, self.backend = client, backend
        self.keys = [keys] if isinstance(keys, bytes) else list(keys)
        self.window, self.batch_size = window, batch_size
        self.progress = progress
        self.max_rate = max_rate  # items per second at most (a shared production server)
        self.limit = limit  # new items a key may take (a filter that never grows), or None
        self.check = check  # raises when the writer must stop (its lock is lost): called before every batch
        self.started = 0.0
        self.pack = _packer()
        self.stats = LoadStats(per_key=[0] * len(self.keys))

    def load(self, batches: Iterable[list[bytes]]) -> LoadStats:
        targets: list[_Target] = []
        started = self.started = time.perf_counter()
        broken = True
        try:
            targets = [_Target(self, key) for key in self.keys]
            shards = len(targets)
            for batch in map(item_list, batches):
                if not batch:
                    continue
                if shards == 1:
                    targets[0].send(batch)
                    self.stats.per_key[0] += len(batch)
                    continue
                for index, group in enumerate(route(batch, shards)):
                    if not group:
                        continue
                    target = targets[index]
                    self.stats.per_key[index] += len(group)
                    target.buffer.extend(group)
                    if len(target.buffer) >= self.batch_size:
                        target.send(target.buffer)
                        target.buffer = []
            for target in targets:
                if target.buffer:
                    target.send(target.buffer)
                    target.buffer = []
            for target in targets:
                target.drain()
            broken = False
        finally:
            for target in targets:
                target.close(broken)
            self.stats.seconds += time.perf_counter() - started
        return self.stats

    def throttle(self) -> None:
        """With ``max_rate``, wait until the items sent so far are within the rate since the start."""
        if self.max_rate is None:
            return
        ahead = self.stats.sent / self.max_rate - (time.perf_counter() - self.started)
        if ahead > 0:
            time.sleep(ahead)

    def read(self, target: _Target, expected: int) -> None:
        try:
            reply = target.conn.read_response()
        except ResponseError as exc:
            # RedisBloom's CF.INSERT answers a cuckoo filter that may grow no more with one error
            # for the whole command, not per item: the same full filter, not a server fault.
            if _reached_capacity(str(exc)):
                raise _full(target.key, str(exc)) from exc
            raise
        if isinstance(reply, Exception):
            raise reply
        added = self.backend.count_added(reply, expected)
        if isinstance(added, str):  # BF.INSERT stops at its first error; CF.INSERT answers -1 where it found no slot
            if _reached_capacity(added):
                raise _full(target.key, added)
            raise StateConflict("writing to %r failed: %s", to_display(target.key), added)
        self.stats.added += added
        self.stats.duplicates += expected - added
        target.added += added
        if self.limit is not None and target.added > self.limit:
            raise over_capacity(target.key, target.added, self.limit)
        if self.progress is not None:
            self.progress(self.stats.added + self.stats.duplicates)


def _reached_capacity(error: str) -> bool:
    """Whether a write's error is a filter that takes no more items: a NONSCALING RedisBloom filter
    ("non scaling filter is full", "Filter is full"), a cuckoo filter without a free slot (CF.INSERT's
    -1, read as "the filter is full: no room for ...") or one at its most sub-filters ("Maximum
    expansions reached"). Narrow on purpose: any other error, "full" in it or not, is not this."""
    text = error.lower()
    return "filter is full" in text or "no room" in text or "maximum expansions" in text


def _full(key: bytes, error: str) -> StateConflict:
    return StateConflict(
        "writing to %r failed: %s: the filter reached its capacity (raise `capacity` or `headroom`)",
        to_display(key),
        error,
    )
