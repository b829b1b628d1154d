"""The application API: add items to a filter and look them up, one filter or a sharded one.

``Filter`` works on any backend (recognised from the key); ``ShardedFilter`` routes each item to
its member (``crc32 mod N``) and sends one pipeline (per node, on a cluster); ``open_filter``
picks the right one for a key.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from bloomctl import backends
from bloomctl.backends import Backend
from bloomctl.backends.cuckoo_base import CuckooBackend
from bloomctl.backends.cuckoo_redisbloom import translate_cuckoo_error
from bloomctl.errors import KeyMissing, StateConflict
from bloomctl.keys import KeyFamily, to_bytes, to_display
from bloomctl.lifecycle.manifest import read_manifest
from bloomctl.lifecycle.routing import route_positions
from bloomctl.server.client import RedisClient

Command = Callable[[RedisClient, bytes, Sequence[bytes | str]], tuple[Any, ...]]


class Filter:
    """One filter, whichever backend: ``add``, ``madd``, ``exists``, ``mexists``; a cuckoo filter's
    ``delete``, ``mdelete`` and ``count`` too.

    >>> users = Filter(client, "users")
    >>> users.madd(["user:1", "user:2"]); users.exists("user:1")
    """

    def __init__(self, client: RedisClient, key: str | bytes) -> None:
        self.client, self.key = client, to_bytes(key)
        self._backend: Backend | None = None
        self._library: Any = None

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = backends.for_key(self.client, self.key)
        return self._backend

    def add(self, item: bytes | str, *, dual_write: bool = False) -> bool:
        return self.madd([item], dual_write=dual_write)[0]

    def exists(self, item: bytes | str) -> bool:
        return self.mexists([item])[0]

    def madd(self, items: Sequence[bytes | str], *, dual_write: bool = False) -> list[bool]:
        """Add items. ``dual_write``: first to the standby when one exists (a rebuild is running),
        then to the active filter - in that order, so no cutover can lose the item (docs/python-api.md).
        A cuckoo filter's dual write is one server call that also logs the write for the rebuild's
        replay (docs/cuckoo.md)."""
        raw = [to_bytes(i) for i in items]
        if dual_write and self.backend.kind == "cuckoo":
            return self._cuckoo_dual("add", raw)
        if dual_write:
            with contextlib.suppress(KeyMissing):  # no rebuild running: nothing to do there
                self.backend.madd(self.client, KeyFamily.of(self.key).standby, raw)
        return self.backend.madd(self.client, self.key, raw)

    def mexists(self, items: Sequence[bytes | str]) -> list[bool]:
        return self.backend.mexists(self.client, self.key, [to_bytes(i) for i in items])

    # --- cuckoo filters only ------------------------------------------------------------------

    def delete(self, item: bytes | str, *, dual_write: bool = False) -> bool:
        return self.mdelete([item], dual_write=dual_write)[0]

    def mdelete(self, items: Sequence[bytes | str], *, dual_write: bool = False) -> list[bool]:
        """Delete one copy of each item from a cuckoo filter: False where it was not there. Delete
        only items you added: deleting one that never was can remove another item's fingerprint.
        ``dual_write``: also from the standby a rebuild is loading, safely (docs/cuckoo.md)."""
        backend = self._cuckoo()
        raw = [to_bytes(i) for i in items]
        if dual_write:
            return self._cuckoo_dual("del", raw)
        return backend.mdelete(self.client, self.key, raw)

    def count(self, item: bytes | str) -> int:
        """How many copies of the item's fingerprint a cuckoo filter holds (an upper bound)."""
        return self._cuckoo().count(self.client, self.key, to_bytes(item))

    def _cuckoo(self) -> CuckooBackend:
        backend = self.backend
        if not isinstance(backend, CuckooBackend):
            raise StateConflict(
                "%r is a Bloom filter: items cannot be deleted from it (rebuild it instead)", to_display(self.key)
            )
        return backend

    def _cuckoo_dual(self, op: str, items: list[bytes]) -> list[bool]:
        from bloomctl.backends.library import Library

        if not items:
            return []
        family = KeyFamily.of(self.key)
        keys = [family.active, family.standby, family.standby_meta, family.standby_log, family.lock]
        if self._library is None:
            self._library = Library()
        try:
            flags = self._library.call_keys(self.client, "cf_dual", keys, op, *items)
        except Exception as exc:
            raise translate_cuckoo_error(exc, self.key) from None
        if op == "add" and any(flag != 1 for flag in flags):
            raise StateConflict(
                "the cuckoo filter %r has no room for some items: rebuild it with a larger `capacity`",
                to_display(self.key),
            )
        return [flag == 1 for flag in flags]


class ShardedFilter(Filter):
    """A sharded filter: items are grouped by shard and sent in one pipeline (per node, on a cluster).

    >>> users = ShardedFilter(client, "users")
    >>> users.madd(items); users.mexists(items)
    """

    def __init__(self, client: RedisClient, key: str | bytes) -> None:
        super().__init__(client, key)
        manifest = read_manifest(client, self.key)
        if manifest is None:
            raise StateConflict("%r is not a sharded filter", to_display(self.key))
        self.manifest = manifest
        self._backend = backends.get(manifest.backend)

    def _fan_out(
        self,
        items: Sequence[bytes | str],
        command: Command,
        keys: Sequence[bytes] | None = None,
        *,
        missing_ok: bool = False,
    ) -> list[bool]:
        keys = keys or self.manifest.members
        raw = [to_bytes(i) for i in items]
        if not raw:
            return []
        groups, positions = route_positions(raw, self.manifest.shards)
        pipe = self.client.pipeline(transaction=False)  # a ClusterPipeline groups the commands by node
        sent = []
        for index, group in enumerate(groups):
            if group:
                pipe.execute_command(*command(self.client, keys[index], group))
                sent.append(index)
        answers: list[bool] = [False] * len(raw)
        for index, reply in zip(sent, pipe.execute(raise_on_error=not missing_ok), strict=True):
            if isinstance(reply, Exception):
                if "not found" in str(reply):
                    continue  # missing_ok: a member's standby that does not exist
                raise reply
            for position, flag in zip(positions[index], self.backend.parse_flags(reply), strict=True):
                answers[position] = flag
        return answers

    def madd(self, items: Sequence[bytes | str], *, dual_write: bool = False) -> list[bool]:
        if dual_write:  # the standbys first (where a rebuild runs), then the members: see Filter.madd
            standbys = [family.standby for family in self.manifest.families]
            self._fan_out(items, self.backend.madd_command, standbys, missing_ok=True)
        return self._fan_out(items, self.backend.madd_command)

    def mexists(self, items: Sequence[bytes | str]) -> list[bool]:
        return self._fan_out(items, self.backend.mexists_command)


def open_filter(client: RedisClient, key: str | bytes) -> Filter:
    """A ShardedFilter when ``key`` holds a manifest, else a Filter."""
    return ShardedFilter(client, key) if read_manifest(client, key) else Filter(client, key)
