"""Restore: load a dump into the standby(s) of a filter, and with ``swap`` swap them in.

The chunks go into scratch keys (``bloomctl.transfer.scratch``), each checked against the dump's
header, then renamed to the standby under the filter's lock; ``swap`` goes through the usual
guarded swap. Any failure before that rename removes the scratch keys and this run's standby
metadata: the active filter is never touched.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bloomctl import backends
from bloomctl.backends import Backend
from bloomctl.defaults import DEFAULT_KEEP_OLD_SECONDS, DEFAULT_MIN_RATIO
from bloomctl.errors import OutOfMemory, StateConflict, UnsupportedServer
from bloomctl.keys import KeyFamily, to_bytes, to_display
from bloomctl.lifecycle import front as lifecycle
from bloomctl.lifecycle.guards import SwapGuards
from bloomctl.lifecycle.lock import FilterLock
from bloomctl.lifecycle.manifest import Manifest, new_manifest, read_manifest, write_manifest
from bloomctl.lifecycle.metadata import LOADED, LOADING, RECIPE, check_companions, metadata_for, read_metadata
from bloomctl.lifecycle.single import check_family, check_recipe
from bloomctl.lifecycle.standby import is_out_of_memory, new_generation, refuse_unowned_standby
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.server.memory import check_memory
from bloomctl.server.topology import node_client
from bloomctl.sizing.bloom import plan
from bloomctl.transfer.dump import KEPT_META
from bloomctl.transfer.dumpfile import Chunk, DumpCorrupt
from bloomctl.transfer.scratch import SCRATCH_TTL_MS, ScratchWriter
from bloomctl.transfer.validate import check_header, check_sizes, check_target

Events = Callable[[str, dict[str, Any]], None]

# KEYS: scratch, scratch metadata, standby, standby metadata, the filter's lock. ARGV: generation,
# state, the lock's token ('' for a shard member: the lock is in another slot, checked before). The loaded
# scratch key and its metadata replace the standby and its metadata in one step, only while the
# scratch metadata is still this run's: until then an existing standby is untouched.
FINISH_LUA = """
if ARGV[3] ~= '' then
  local lock = redis.call('GET', KEYS[5])
  if not lock or not string.find(lock, ARGV[3], 1, true) then return -2 end
end
if redis.call('HGET', KEYS[2], 'generation') ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local replaced = redis.call('EXISTS', KEYS[3])
redis.call('UNLINK', KEYS[3], KEYS[4])
redis.call('PERSIST', KEYS[1])
redis.call('RENAME', KEYS[1], KEYS[3])
redis.call('HSET', KEYS[2], 'state', ARGV[2])
redis.call('PERSIST', KEYS[2])
redis.call('RENAME', KEYS[2], KEYS[4])
return 1 + replaced
"""

# KEYS as FINISH_LUA's. ARGV: generation. Removes what this run wrote: its scratch key and metadata,
# or, for a member it had already finished (a sharded restore failing later), that standby.
DISCARD_LUA = """
if redis.call('HGET', KEYS[2], 'generation') == ARGV[1] then
  redis.call('UNLINK', KEYS[1], KEYS[2])
  return 1
end
if redis.call('HGET', KEYS[4], 'generation') == ARGV[1] then
  redis.call('UNLINK', KEYS[3], KEYS[4])
  return 2
end
return 0
"""


@dataclass
class RestoreReport:
    key: str
    backend: str
    items: int
    shards: int | None
    chunks: int = 0
    bytes: int = 0
    standbys: list[str] = field(default_factory=list)
    swapped: bool = False
    replaced_active: bool = False
    replaced_standby: bool = False
    source: dict[str, Any] = field(default_factory=dict)
    note: str | None = None
    seconds: float = 0.0
    dry_run: bool = False  # every check made, every chunk read; nothing written

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "backend": self.backend,
            "items": self.items,
            "shards": self.shards,
            "chunks": self.chunks,
            "bytes": self.bytes,
            "standbys": self.standbys,
            "swapped": self.swapped,
            "replaced_active": self.replaced_active,
            "replaced_standby": self.replaced_standby,
            "source": self.source,
            "note": self.note,
            "seconds": round(self.seconds, 3),
            "dry_run": self.dry_run,
        }


def restore(
    client: RedisClient,
    server: ServerInfo,
    key: str | bytes,
    header: dict[str, Any],
    chunks: Iterator[Chunk],
    *,
    swap: bool = False,
    keep_old_seconds: float = DEFAULT_KEEP_OLD_SECONDS,
    min_ratio: float = DEFAULT_MIN_RATIO,
    allow_shrink: bool = False,
    allow_recipe_change: bool = False,
    force: bool = False,
    lock_wait: float = 0,
    events: Events | None = None,
    confirm: lifecycle.Confirm | None = None,
    dry_run: bool = False,
) -> RestoreReport:
    """Load ``chunks`` (a dump of the filter ``header`` describes) into the standby(s) of ``key``;
    with ``swap``, swap them in (the swap's guards apply; ``confirm`` is asked first). Nothing but
    this run's scratch keys and standby metadata is written before every chunk has arrived and
    checked out. ``dry_run``: every check (the target's keys, the lock, memory, every chunk's and
    the file's checksum), nothing written."""
    started = time.perf_counter()
    log: Events = events or (lambda message, fields: None)
    guards = SwapGuards(
        min_ratio=min_ratio,
        allow_shrink=allow_shrink,
        allow_recipe_change=allow_recipe_change,
        keep_old_seconds=keep_old_seconds,
    )
    if swap:
        guards.check()  # refused before the whole dump is loaded, not after
    check_header(header)
    check_sizes(header)  # before anything is reserved: the server allocates what a header declares
    raw = to_bytes(key)
    family = KeyFamily.of(raw)
    check_family(client, family)
    backend = check_target(client, server, raw, header)
    if swap and not guards.allow_recipe_change and RECIPE in header["metadata"]:
        check_recipe(read_metadata(client, family.meta), {RECIPE: header["metadata"][RECIPE]})
    report = RestoreReport(
        to_display(raw), backend.name, int(header["items"]), header["shards"], source=header.get("source", {})
    )
    if dry_run:
        return _dry_run(
            client, raw, header, backend, chunks, report, force, server.line, started, guards if swap else None
        )
    with FilterLock(client, family.active, command="bloomctl restore", wait=lock_wait) as lock:
        manifest, fresh = _targets(client, raw, header, backend)
        families = [KeyFamily.of(member) for member in manifest.members] if manifest else [family]
        writers, generation = _prepare(client, backend, header, families, force, server.line)
        _load(client, lock, writers, families, chunks, generation, report, server.line)
        report.standbys = [to_display(member.standby) for member in families]
        log(
            f"restored {report.items:,} items ({report.chunks} chunks, {report.bytes:,} bytes) into "
            + (f"{len(families)} shard standbys" if manifest else repr(report.standbys[0])),
            {"phase": "load", "chunks": report.chunks, "bytes": report.bytes},
        )
        if fresh and manifest is not None:
            write_manifest(client, manifest)
        if swap:
            try:
                result = lifecycle.guarded_swap(client, server, family.active, guards, lock=lock, confirm=confirm)
            except lifecycle.NotConfirmed:
                raise lifecycle.NotConfirmed(
                    "not confirmed: the restored filter waits in the standby (`bloomctl swap %s` swaps it in)",
                    shlex.quote(to_display(raw)),
                ) from None
            report.swapped = True
            report.replaced_active = any(result.replaced)
            report.note = result.note or report.note
    report.seconds = time.perf_counter() - started
    return report


def _dry_run(
    client: RedisClient,
    key: bytes,
    header: dict[str, Any],
    backend: Backend,
    chunks: Iterator[Chunk],
    report: RestoreReport,
    force: bool,
    line: str,
    started: float,
    guards: SwapGuards | None,
) -> RestoreReport:
    """A restore's checks without a write: the lock free (and scripts allowed), the target's keys
    and members, memory, with ``guards`` the swap's shrink guard on the dump's declared count, then
    every chunk read (the reader checks each one's CRC and the file's SHA-256). What only loading
    shows (the chunks' offsets against the header, a Bloom filter's set bits against its count, a
    cuckoo filter's fingerprint count) is checked by the real restore, before anything becomes the
    standby."""
    FilterLock(client, key).check_free(scripts=True)
    manifest, _fresh = _targets(client, key, header, backend)  # (a new manifest is made, not written)
    families = [KeyFamily.of(member) for member in manifest.members] if manifest else [KeyFamily.of(key)]
    for member in families:
        _check_scratch(client, member)
    _check_members(client, backend, header, families, force, line, clear=False)
    if guards is not None and manifest is None:
        _check_shrink(client, backend, key, int(header["items"]), guards)
    for chunk in chunks:
        if not 0 <= chunk.member < len(header["members"]):
            raise DumpCorrupt("the dump has a chunk for member %s of %s", chunk.member, len(header["members"]))
        report.chunks += 1
        report.bytes += len(chunk.data)
    report.dry_run = True
    report.standbys = [to_display(member.standby) for member in families]
    report.seconds = time.perf_counter() - started
    return report


def _check_members(
    client: RedisClient,
    backend: Backend,
    header: dict[str, Any],
    families: list[KeyFamily],
    force: bool,
    line: str,
    *,
    clear: bool,
) -> None:
    """The members' companions checked, a killed restore's leftovers removed (``clear``), memory checked."""
    for member in families:
        check_family(client, member)
        refuse_unowned_standby(client, member, "a restore")
        if clear:
            _clear_scratch(client, member)
    # Where a load does not reach the replicas, rewrite_for_replicas writes the filter a second time
    # for them, and RESTORE ... REPLACE holds the new copy before it frees the loaded one
    twice = 1 if backend.loads_reach_replicas(line) else 2
    sizes = [
        (member.standby, twice * int(m["size_bytes"])) for member, m in zip(families, header["members"], strict=True)
    ]
    if not force:
        check_memory(
            client,
            sizes,
            kept=[member.old for member in families],
            advice="free memory or raise maxmemory, or pass `force`",
        )


def _prepare(
    client: RedisClient,
    backend: Backend,
    header: dict[str, Any],
    families: list[KeyFamily],
    force: bool,
    line: str = "",
) -> tuple[list[ScratchWriter], str]:
    """Under the lock: the members' companions checked, a killed restore's leftovers removed, memory
    checked, and each member's scratch metadata written (state ``loading``, with its TTL, in one
    MULTI). Returns the writers and this run's generation."""
    _check_members(client, backend, header, families, force, line, clear=True)
    generation = new_generation()
    writers = []
    for member, described in zip(families, header["members"], strict=True):
        per_member = backend.restore_plan(described, float(header["error_rate"]), header["expansion"])
        meta = {**metadata_for(per_member, backend.name), "state": LOADING, "generation": generation}
        meta["error_rate"] = repr(float(header["error_rate"]))
        meta.update({name: value for name, value in header["metadata"].items() if name in KEPT_META})
        meta["restored_from"] = str(header.get("source", {}).get("server", "?"))[:200]
        pipe = client.pipeline(transaction=True)
        pipe.hset(member.companion("restore:meta"), mapping=meta)
        pipe.pexpire(member.companion("restore:meta"), SCRATCH_TTL_MS)
        pipe.execute()
        writers.append(ScratchWriter(client, backend, member, described, to_display(member.active)))
    return writers, generation


def _load(
    client: RedisClient,
    lock: FilterLock,
    writers: list[ScratchWriter],
    families: list[KeyFamily],
    chunks: Iterator[Chunk],
    generation: str,
    report: RestoreReport,
    line: str = "",
) -> None:
    """Every chunk into its member's scratch key, each member checked, then renamed to its standby;
    on any failure (a signal included) this run's scratch keys and metadata are removed."""
    try:
        for chunk in chunks:  # the reader checks each chunk's CRC, and the file's SHA-256 at its end
            if not 0 <= chunk.member < len(writers):
                raise DumpCorrupt("the dump has a chunk for member %s of %s", chunk.member, len(writers))
            lock.check_writing()
            writers[chunk.member].write(chunk)
            report.chunks += 1
            report.bytes += len(chunk.data)
        for writer in writers:
            writer.finish()
            writer.check()
            if not writer.backend.loads_reach_replicas(line):
                report.note = rewrite_for_replicas(client, writer.scratch) or report.note
        lock.check_writing()
        finish = client.register_script(FINISH_LUA)
        for writer, member in zip(writers, families, strict=True):
            own_lock = member.lock == lock.lock_key  # a shard member's lock key is its own, not the held one
            keys = [writer.scratch, writer.scratch_meta, member.standby, member.standby_meta, member.lock]
            done = int(finish(keys=keys, args=[generation, LOADED, lock.token if own_lock else ""]))
            report.replaced_standby |= done == 2
            if done == -2:
                raise StateConflict("lost the lock on %r (it expired): nothing swapped", to_display(member.active))
            if done < 1:
                raise StateConflict("the standby %r was replaced by another run", to_display(member.standby))
    except BaseException as exc:
        for writer in writers:
            writer.abort()
        discard = client.register_script(DISCARD_LUA)
        for writer, member in zip(writers, families, strict=True):
            with contextlib.suppress(Exception):  # what cannot be removed now expires by itself
                discard(
                    keys=[writer.scratch, writer.scratch_meta, member.standby, member.standby_meta], args=[generation]
                )
        if isinstance(exc, Exception) and is_out_of_memory(exc):
            raise OutOfMemory(
                "the server is out of memory (%s): the restore's scratch keys were removed; the standby and the active "
                "filter are untouched (free memory or raise maxmemory, then run again)",
                str(exc).splitlines()[0][:120],
            ) from None
        raise


def rewrite_for_replicas(client: RedisClient, key: bytes) -> str | None:
    """RedisBloom 2.x replicates CF.LOADCHUNK's header but not its data chunks (a replica would count
    the items and find none of them). Where the key's node has replicas (or does not say), the loaded
    filter is written once more as RESTORE ... REPLACE of its DUMP, which replicas receive whole.
    Returns a note when it did."""
    node = node_client(client, key)
    try:
        replicas = int(node.info("replication").get("connected_slaves", 0))
    except Exception:  # not allowed to look: assume there are
        replicas = 1
    if not replicas:
        return None
    from redis.exceptions import NoPermissionError

    try:
        payload = node.dump(key)
        if payload is None:  # the scratch key expired or was removed since it was loaded
            raise StateConflict("%r disappeared while it was restored: nothing swapped; run it again", to_display(key))
        ttl = node.pttl(key)
        node.restore(key, ttl if ttl and ttl > 0 else SCRATCH_TTL_MS, payload, replace=True)
    except NoPermissionError as exc:
        raise UnsupportedServer(
            "RedisBloom 2.x does not replicate CF.LOADCHUNK's data, and this user may not DUMP and RESTORE the "
            "restored filter for its replicas (%s): allow them (`bloomctl doctor` prints the ACL line), or rebuild "
            "the filter from the source there",
            str(exc).splitlines()[0][:120],
        ) from None
    return (
        "RedisBloom 2.x does not replicate CF.LOADCHUNK's data: the restored filter was written once more as one "
        f"RESTORE ({len(payload):,} bytes) so that its replicas hold it too"
    )


def _check_shrink(client: RedisClient, backend: Backend, key: bytes, items: int, guards: SwapGuards) -> None:
    """A dry run's shrink guard: the dump's declared count against the active filter's now (the
    swap itself checks the loaded standby's count)."""
    if guards.allow_shrink or backends.key_type(client, key) == b"none":
        return
    active = backend.card(client, key)
    if active and items / active < guards.min_ratio:
        raise StateConflict(
            "the dump holds %s items, %s of the active filter's %s (guard: %s): the swap would refuse it; pass "
            "`allow_shrink` if that is intended",
            f"{items:,}",
            f"{items / active:.1%}",
            f"{active:,}",
            f"{guards.min_ratio:.0%}",
        )


def _check_scratch(client: RedisClient, family: KeyFamily) -> None:
    """Refuse a scratch key bloomctl did not write (a restore loads into it)."""
    scratch, meta = family.companion("restore"), family.companion("restore:meta")
    check_companions(client, [(meta, "metadata")])
    kind = backends.key_type(client, scratch)
    if kind != b"none" and not client.exists(meta) and not any(b.owns(client, scratch, kind) for b in backends.every()):
        raise StateConflict(
            "%r holds data bloomctl did not write (bloomctl restores into it): move that key away first",
            to_display(scratch),
        )


def _clear_scratch(client: RedisClient, family: KeyFamily) -> None:
    """Remove a killed restore's leftovers (they would expire anyway); refuse to touch a scratch
    key bloomctl did not write."""
    _check_scratch(client, family)
    client.unlink(family.companion("restore"), family.companion("restore:meta"))


def _targets(client: RedisClient, key: bytes, header: dict[str, Any], backend: Backend) -> tuple[Manifest | None, bool]:
    """The manifest of a sharded restore: the target's own (its per-shard parameters must be the
    dump's), else a new one for this server's masters, written once the members' standbys exist,
    whose member names must be free. Returns it and whether it is new."""
    if not header["shards"]:
        return None, False
    first = header["members"][0]
    existing = read_manifest(client, key)
    if existing is not None:
        if (existing.capacity, existing.error_rate, existing.expansion) != (
            first["capacity"],
            float(header["error_rate"]),
            header["expansion"],
        ):
            raise StateConflict(
                "%r is sharded with capacity %s per shard, error rate %s, expansion %s; the dump's shards have %s, "
                "%s, %s: restore into another key, or rebuild from the source",
                to_display(key),
                f"{existing.capacity:,}",
                existing.error_rate,
                existing.expansion,
                f"{first['capacity']:,}",
                header["error_rate"],
                header["expansion"],
            )
        return existing, False
    per_shard = plan(int(first["capacity"]), float(header["error_rate"]), header["expansion"])
    manifest = new_manifest(client, key, int(header["shards"]), per_shard, backend)
    taken = [m for m in manifest.members if backends.key_type(client, m) != b"none"]
    if taken:
        raise StateConflict(
            "the shard key %r exists already: move it away, or restore into another key", to_display(taken[0])
        )
    return manifest, True
