"""Filters that move between servers: dump a filter to the portable format, restore one into a
standby, copy one from server to server.

A dump reads the filter as the server stores it (BF.SCANDUMP's chunks, or the bitmap backend's
string in slices): the bits are copied, not the items, so nothing needs the source data. A restore
writes the chunks into a scratch key (never the standby itself: a dual write landing between two
chunks would be overwritten by the next), checks what it loaded against the dump's header, renames
it to the standby under the filter's lock, and with ``swap`` goes through the usual guarded swap.
Any failure before that rename removes the scratch key and this run's standby metadata: the active
filter is never touched.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bloomctl import __version__, backends
from bloomctl.backends import Backend
from bloomctl.backends.base import CuckooState, cuckoo_subs
from bloomctl.backends.bitmap import HEADER_BYTES, installs_nothing, parse_header, recognise
from bloomctl.backends.cuckoo import cf_size_bytes, parse_cf_header, parse_lua_header, recognise_lua
from bloomctl.backends.redisbloom import OPT_FORCE64, OPT_NO_SCALING, OPT_NOROUND, parse_scandump_header
from bloomctl.defaults import DEFAULT_KEEP_OLD_SECONDS, DEFAULT_MIN_RATIO, MAX_SHARDS
from bloomctl.errors import OutOfMemory, StateConflict, UnsupportedServer, VerifyFailed
from bloomctl.keys import KeyFamily, to_bytes, to_display
from bloomctl.lifecycle import front as lifecycle
from bloomctl.lifecycle.lock import FilterLock
from bloomctl.lifecycle.manifest import Manifest, new_manifest, read_manifest, write_manifest
from bloomctl.lifecycle.metadata import LOADED, LOADING, RECIPE, check_companions, metadata_for, read_metadata
from bloomctl.lifecycle.routing import ROUTING
from bloomctl.lifecycle.single import check_family, check_recipe
from bloomctl.lifecycle.standby import is_out_of_memory, new_generation, refuse_unowned_standby
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.server.memory import check_memory
from bloomctl.server.topology import node_client
from bloomctl.sizing.bloom import MAX_EXPANSION, Plan, SubFilter, plan
from bloomctl.sizing.cuckoo import CuckooPlan, cuckoo_plan, next_power_of_two
from bloomctl.transfer.dumpfile import Chunk, DumpCorrupt

BITMAP_SLICE = 1 << 20  # bytes of a bitmap filter per GETRANGE
SCANDUMP = {"redisbloom": "BF.SCANDUMP", "redisbloom-cuckoo": "CF.SCANDUMP"}  # else: the string, in slices
LOADCHUNK = {"redisbloom": "BF.LOADCHUNK", "redisbloom-cuckoo": "CF.LOADCHUNK"}
LOADCHUNK_PIECE = 1 << 20  # bytes per BF.LOADCHUNK: under 1 ms on the server
SCRATCH_TTL_MS = 3_600_000  # a killed restore's scratch key drops itself after an hour
KEPT_META = (RECIPE,)  # metadata a dump carries to the restored filter: how its items were built

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


# --- dump ------------------------------------------------------------------------------------


@dataclass
class Dump:
    """A filter as read from a server: the header and the chunks (read lazily, once)."""

    header: dict[str, Any]
    chunks: Iterator[Chunk]


def _member_header(backend: Backend, client: RedisClient, key: bytes) -> dict[str, Any]:
    state = backend.info(client, key)
    member = {
        "capacity": state.reserved_capacity,
        "items": state.items,
        "size_bytes": state.size_bytes,
        "filters": state.filters,
        "expansion": state.expansion,
        "error_rates": [sub.error_rate for sub in state.subfilters],
    }
    if isinstance(state, CuckooState):  # (capacity: the first sub-filter's slots)
        member.update(
            buckets=state.buckets,
            bucket_size=state.bucket_size,
            max_iterations=state.max_iterations,
            fingerprint_bits=state.fingerprint_bits,
            deletes=state.deletes,
        )
    return member


def read_filter(client: RedisClient, server: ServerInfo, key: str | bytes) -> Dump:
    """The dump of the filter ``key`` (one filter, or every member of a sharded one)."""
    raw = to_bytes(key)
    manifest = read_manifest(client, raw)
    if manifest is not None:
        backend = backends.get(manifest.backend)
        members = list(manifest.members)
        meta = read_metadata(client, KeyFamily.of(members[0]).meta)
    else:
        backend = backends.for_key(client, raw)
        members = [raw]
        meta = read_metadata(client, KeyFamily.of(raw).meta)
    command = SCANDUMP.get(backend.name)
    if command is not None and command.lower() not in server.commands:
        raise UnsupportedServer("%s has no %s: its filters cannot be dumped", server.description, command)
    with installs_nothing():  # reading a bitmap filter must not load the function library (a write)
        described = [_member_header(backend, client, member) for member in members]
        identities = [_identity(client, backend, member) for member in members]
    first = described[0]
    if manifest is not None:
        capacity, error_rate, expansion = manifest.capacity * manifest.shards, manifest.error_rate, manifest.expansion
    else:
        capacity, expansion = first["capacity"], first["expansion"]
        error_rate = _error_rate(backend, first, meta)
    header = {
        "backend": backend.name,
        "key": to_display(raw),
        "key_hex": raw.hex(),
        "shards": manifest.shards if manifest is not None else None,
        "routing": manifest.routing if manifest is not None else None,
        "capacity": capacity,
        "error_rate": error_rate,
        "expansion": expansion,
        "items": sum(m["items"] for m in described),
        "size_bytes": sum(m["size_bytes"] for m in described),
        "members": described,
        "metadata": {name: meta[name] for name in KEPT_META if name in meta},
        "source": {
            "server": server.description,
            "product": server.product,
            "version": server.version,
            "line": server.line,
            "module_version": server.module_version,
        },
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "created_by": f"bloomctl {__version__}",
    }
    return Dump(header, _chunks(client, backend, members, described, identities))


def _error_rate(backend: Backend, member: dict[str, Any], meta: dict[str, str]) -> float:
    """The error rate the filter was reserved with: its metadata's, else from its first sub-filter
    (RedisBloom builds a scaling filter's first sub-filter for half the rate)."""
    if "error_rate" in meta:
        return float(meta["error_rate"])
    if backend.kind == "cuckoo":  # at the load it fills to, as the planner reckons it
        return _cuckoo_plan_of(backend, member).error_rate
    first = member["error_rates"][0]
    return first * 2 if backend.name == "redisbloom" and member["expansion"] is not None else first


def _identity(client: RedisClient, backend: Backend, key: bytes) -> tuple[tuple[Any, ...], int]:
    """What must not change while a member is dumped, and its item count (which may grow): its type,
    its metadata's generation and creation time and the old key's (a swap or a rollback brings
    another filter's), and its layout (a new sub-filter moves the chunks)."""
    family = KeyFamily.of(key)
    kind = backends.key_type(client, key)
    meta = tuple(client.hmget(family.meta, ["generation", "created_at"]))
    # a swap or rollback also moves a filter to (or from) the old key, and its metadata with it
    old = (client.exists(family.old), tuple(client.hmget(family.old_meta, ["generation", "created_at"])))
    state = backend.info(client, key)
    layout: tuple[Any, ...] = tuple((s.capacity, s.bits, s.hashes, s.error_rate) for s in state.subfilters)
    if isinstance(state, CuckooState):
        # A Bloom filter's bits are only ever set, so a dump that reads them while items arrive holds
        # every item it had; a cuckoo filter's fingerprints move (an insert relocates others, maybe
        # from a part not yet read into one already read), so any insert or delete during the dump
        # fails it. Every successful insert counts an item, every delete a deletion.
        layout = (
            state.buckets,
            state.bucket_size,
            state.max_iterations,
            state.fingerprint_bits,
            state.items,
            state.deletes,
        )
    return (kind, meta, old, layout, state.size_bytes, state.filters), state.items


def _chunks(
    client: RedisClient,
    backend: Backend,
    members: list[bytes],
    described: list[dict[str, Any]],
    identities: list[tuple[tuple[Any, ...], int]],
) -> Iterator[Chunk]:
    """Each member's chunks; a member replaced or grown since the header was read fails the dump
    (its items may grow meanwhile: a chunk holds at least the items the header counts)."""
    for index, (member, described_member, (identity, items)) in enumerate(
        zip(members, described, identities, strict=True)
    ):
        if backend.name in SCANDUMP:
            digest = hashlib.blake2b(digest_size=32)
            for chunk in _scandump(client, index, member, SCANDUMP[backend.name]):
                if backend.kind == "cuckoo":
                    _digest(digest, chunk)
                yield chunk
        else:
            yield from _slices(client, index, member, described_member["size_bytes"])
        with installs_nothing():
            after, items_after = _identity(client, backend, member)
        if after != identity or items_after < items:
            raise _changed(member, backend.kind)
        if backend.kind == "cuckoo" and backend.name in SCANDUMP:
            # RedisBloom compacts a grown cuckoo filter after deletes (fingerprints move into earlier
            # sub-filters, maybe parts already read) and resets its deletion count: an add and a
            # delete then leave CF.INFO as it was. A second read must find the same chunks.
            again = hashlib.blake2b(digest_size=32)
            for chunk in _scandump(client, index, member, SCANDUMP[backend.name]):
                _digest(again, chunk)
            if again.digest() != digest.digest():
                raise _changed(member, backend.kind)


def _digest(digest: Any, chunk: Chunk) -> None:
    digest.update(chunk.cursor.to_bytes(8, "little", signed=True))
    digest.update(len(chunk.data).to_bytes(8, "little"))
    digest.update(chunk.data)


def _changed(key: bytes, kind: str = "bloom") -> StateConflict:
    if kind == "cuckoo":
        return StateConflict(
            "the cuckoo filter %r was written to while it was dumped (an insert moves other fingerprints, so the "
            "dump might miss some): dump it again when its writers pause",
            to_display(key),
        )
    return StateConflict(
        "the filter %r changed while it was being dumped (a swap, a rollback, or a new sub-filter): dump it again",
        to_display(key),
    )


def _scandump(client: RedisClient, index: int, key: bytes, command: str = "BF.SCANDUMP") -> Iterator[Chunk]:
    """BF.SCANDUMP's (CF.SCANDUMP's) chunks: the header, then the data; an empty cuckoo filter
    answers (0, nil) at once and has no chunks (its restore reserves it anew)."""
    cursor = 0
    while True:
        cursor, data = client.execute_command(command, key, cursor)
        if not cursor:
            return
        yield Chunk(index, int(cursor), data if isinstance(data, bytes) else bytes(data or b""))


def _slices(client: RedisClient, index: int, key: bytes, size: int) -> Iterator[Chunk]:
    for offset in range(0, size, BITMAP_SLICE):
        data = client.getrange(key, offset, min(offset + BITMAP_SLICE, size) - 1)  # type: ignore[attr-defined]
        if len(data) != min(BITMAP_SLICE, size - offset):
            raise _changed(key)
        yield Chunk(index, offset, data)


# --- restore ---------------------------------------------------------------------------------


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
        }


def _int(value: Any, low: int, high: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)


def _member_ok(member: Any, kind: str = "bloom") -> bool:
    return (
        isinstance(member, dict)
        and _int(member.get("capacity"), 1)
        and _int(member.get("items"), 0)
        and _int(member.get("size_bytes"), 1)
        and _int(member.get("filters"), 1)
        and (member.get("expansion") is None or _int(member.get("expansion"), 1, MAX_EXPANSION))
        and (
            kind != "cuckoo"
            or (
                _int(member.get("buckets"), 1)
                and _int(member.get("bucket_size"), 1, 255)
                and _int(member.get("max_iterations"), 1, 65535)
                and member.get("fingerprint_bits") in (8, 16, 32)
                and _int(member.get("deletes", 0), 0)
            )
        )
    )


def check_header(header: dict[str, Any]) -> None:
    """Every field a restore uses, of the right kind and in range: a hand-edited or foreign header
    fails here with one line (exit 8), before anything is written."""
    shards = header.get("shards")
    members = header.get("members")
    metadata = header.get("metadata")
    source = header.get("source", {})
    error_rate = header.get("error_rate")
    ok = (
        header.get("backend") in backends.names()
        and (shards is None or _int(shards, 1, MAX_SHARDS))
        and isinstance(members, list)
        and len(members) == (shards or 1)
        and all(_member_ok(m, backends.get(header["backend"]).kind) for m in members)
        and (shards is None or backends.get(header["backend"]).kind == "bloom")
        and _int(header.get("capacity"), 1)
        and isinstance(error_rate, float | int)
        and not isinstance(error_rate, bool)
        and 0 < error_rate < 1
        and (header.get("expansion") is None or _int(header.get("expansion"), 1, MAX_EXPANSION))
        and _int(header.get("items"), 0)
        and isinstance(metadata, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        and isinstance(source, dict)
        and (shards is None or header.get("routing") == ROUTING)
    )
    if not ok:
        raise DumpCorrupt("the dump's header is incomplete or inconsistent (backend, parameters, members)")


def check_target(client: RedisClient, server: ServerInfo, key: bytes, header: dict[str, Any]) -> Backend:
    """Whether ``server`` can hold the dump as the filter ``key``: the backend's commands, and an
    existing filter of the same backend and sharding."""
    backend = backends.get(header["backend"])
    source = header.get("source", {}).get("server", "another server")
    command = LOADCHUNK.get(backend.name)
    if command is not None and command.lower() not in server.commands:
        raise UnsupportedServer(
            "%s cannot load a RedisBloom dump (no %s): restore it on a server with RedisBloom or Redis 8, "
            "or rebuild the filter here from the source with `--backend module-free`",
            server.description,
            command,
        )
    manifest = read_manifest(client, key)
    if manifest is not None:
        active_backend, shards = backends.get(manifest.backend), manifest.shards
    elif backends.key_type(client, key) != b"none":
        active_backend, shards = backends.for_key(client, key, "active filter"), None
    else:
        return backend
    if active_backend is not backend:
        raise StateConflict(
            "the dump (from %s) holds a %s filter and %r is a %s filter: %s bits cannot become a %s filter "
            "(applications read them with other commands); rebuild from the source instead",
            source,
            backend.name,
            to_display(key),
            active_backend.name,
            backend.name,
            active_backend.name,
        )
    if shards != header["shards"]:
        raise StateConflict(
            "the dump holds %s and %r is %s: restore into another key (--to-key), or rebuild from the source",
            f"a filter of {header['shards']} shards" if header["shards"] else "one filter",
            to_display(key),
            f"sharded over {shards}" if shards else "one filter",
        )
    return backend


def check_redisbloom_header(blob: bytes, member: dict[str, Any], name: str) -> None:
    """BF.LOADCHUNK takes some headers it should not (RedisBloom's own checks let through 32-bit
    hashing, a zero growth, and any byte count): the first chunk must be what the dump's header
    describes, every sub-filter sized and hashed as RedisBloom's ``bloom_init`` does."""
    try:
        items, options, growth, subs = parse_scandump_header(blob)
    except ValueError as exc:
        raise DumpCorrupt("%s: the filter's header chunk is corrupt (%s)", name, str(exc)) from None
    problems = []
    if not options & OPT_FORCE64:  # every filter RedisBloom creates hashes with 64 bits
        problems.append("32-bit hashing")
    if options & ~(OPT_NOROUND | OPT_FORCE64 | OPT_NO_SCALING):
        problems.append(f"options {options:#x}")
    if not options & OPT_NO_SCALING and growth < 1:
        problems.append(f"growth {growth}")
    if len(subs) != member["filters"] or items < member["items"]:
        problems.append(
            f"{len(subs)} sub-filters and {items} items, the dump's header says {member['filters']} and {member['items']}"
        )
    for sub in subs:
        if not 0 < sub.error_rate < 1 or sub.capacity < 1:
            problems.append(f"sub-filter {sub.index}: capacity {sub.capacity}, error {sub.error_rate!r}")
            break
        sized = SubFilter.sized(sub.index, sub.capacity, sub.error_rate)
        if options & OPT_NOROUND:
            bits_ok = sub.bits == sized.bits
        else:  # rounded up to a power of two (older filters): the bits RedisBloom's entries came from
            bits_ok = sub.bits >= 64 and sub.bits & (sub.bits - 1) == 0
        if not bits_ok or sub.hashes != sized.hashes or sub.bytes * 8 != sub.bits:
            problems.append(
                f"sub-filter {sub.index} has {sub.bits} bits and {sub.hashes} hashes for capacity {sub.capacity}, "
                f"error {sub.error_rate:g}"
            )
            break
    if 32 + 64 * len(subs) + sum(sub.bytes for sub in subs) != member["size_bytes"]:
        problems.append("its size does not add up")
    if problems:
        raise DumpCorrupt("%s: the filter's header chunk is inconsistent: %s", name, "; ".join(problems))


def check_cuckoo_header(blob: bytes, member: dict[str, Any], name: str) -> None:
    """CF.LOADCHUNK's header: what the dump's header describes (its buckets, bucket size,
    MAXITERATIONS, expansion and sub-filters), sized as CuckooFilter_Init and Grow size them."""
    try:
        head = parse_cf_header(blob)
    except ValueError as exc:
        raise DumpCorrupt("%s: the filter's header chunk is corrupt (%s)", name, str(exc)) from None
    expansion = head["expansion"]
    problems = []
    if head["buckets"] < 1 or next_power_of_two(head["buckets"]) != head["buckets"]:
        problems.append(f"{head['buckets']} buckets (not a power of two)")
    if expansion and next_power_of_two(expansion) != expansion:
        problems.append(f"expansion {expansion} (not a power of two)")
    if not 1 <= head["filters"] <= 65535 or (expansion == 0 and head["filters"] > 1):
        problems.append(f"{head['filters']} sub-filters with expansion {expansion}")
    described = (member["buckets"], member["bucket_size"], member["max_iterations"], member["filters"])
    if (head["buckets"], head["bucket_size"], head["max_iterations"], head["filters"]) != described:
        problems.append(
            f"buckets, bucket size, max iterations and sub-filters {head['buckets']}, {head['bucket_size']}, "
            f"{head['max_iterations']}, {head['filters']}; the dump's header says {', '.join(map(str, described))}"
        )
    slots = (
        sum(sub.slots for sub in cuckoo_subs(head["buckets"], head["bucket_size"], expansion, head["filters"]))
        if not problems
        else 0
    )
    if (member["expansion"] or 0) != expansion:
        problems.append(f"expansion {expansion}")
    elif not 0 <= head["items"] <= slots or head["items"] != member["items"]:
        problems.append(f"{head['items']:,} items (the dump's header says {member['items']:,}, in {slots:,} slots)")
    elif (
        not problems
        and cf_size_bytes(head["buckets"], head["bucket_size"], expansion, head["filters"]) != member["size_bytes"]
    ):
        problems.append("its size does not add up")
    if problems:
        raise DumpCorrupt("%s: the filter's header chunk is inconsistent: %s", name, "; ".join(problems))


def _cuckoo_plan_of(backend: Backend, member: dict[str, Any], error_rate: float | None = None) -> CuckooPlan:
    """The plan a cuckoo member of a dump was built with (for its metadata, and an empty one's reserve)."""
    return cuckoo_plan(
        int(member["buckets"]) * int(member["bucket_size"]),
        bucket_size=int(member["bucket_size"]),
        max_iterations=int(member["max_iterations"]),
        expansion=member["expansion"],
        engine="lua" if backend.name == "lua-cuckoo" else "redisbloom",
        fingerprint_bits=int(member["fingerprint_bits"]) if backend.name == "lua-cuckoo" else None,
        error_rate=error_rate,
    )


def _lua_matches(blob: bytes, member: dict[str, Any]) -> bool:
    """The module-free filter's own header is the one the dump describes (format, layout, counts)."""
    head = parse_lua_header(blob[:HEADER_BYTES])
    if head is None or (head["format"], head["scheme"]) != (1, 1):
        return False
    described = (member["buckets"], member["bucket_size"], member["fingerprint_bits"], member["max_iterations"])
    slots = head["buckets"] * head["bucket_size"]
    return (head["buckets"], head["bucket_size"], head["fingerprint_bits"], head["max_iterations"]) == described and (
        0 <= head["items"] <= slots and head["deletes"] >= 0
    )


def _lua_header_items(blob: bytes) -> int:
    head = parse_lua_header(blob[:HEADER_BYTES])
    assert head is not None
    return int(head["items"])


def _taken_slots(data: bytes, offset: int, width: int) -> int:
    """Slots that hold a fingerprint in a slice of the module-free string starting at ``offset``
    (its first 64 bytes are the header; slices are whole slots after it)."""
    from array import array

    body = data[max(HEADER_BYTES - offset, 0) :]
    if len(body) % width:
        raise DumpCorrupt("a slice of the cuckoo filter does not end on a slot")
    slots = array({1: "B", 2: "H", 4: "I"}[width], body)
    return len(slots) - slots.count(0)


def _pieces(chunk: Chunk) -> Iterator[tuple[int, bytes]]:
    """A SCANDUMP data chunk (up to 16 MiB: 7-10 ms of BF.LOADCHUNK on the server) as LOADCHUNK
    pieces of at most LOADCHUNK_PIECE bytes. A data chunk's iterator is its end position plus one
    (RedisBloom's SBChain_LoadEncodedChunk takes the position as iterator minus length), so a piece
    ending ``b`` bytes into the chunk carries ``iterator - length + b``."""
    data, length = chunk.data, len(chunk.data)
    if length <= LOADCHUNK_PIECE:
        yield chunk.cursor, data
        return
    start = chunk.cursor - length
    view = memoryview(data)
    for a in range(0, length, LOADCHUNK_PIECE):
        b = min(a + LOADCHUNK_PIECE, length)
        yield start + b, bytes(view[a:b])


class StreamedSet:
    """``SET key value`` sent in pieces on a connection of its own: the value is never whole in the
    client, and the server executes the command once its last byte has arrived."""

    def __init__(self, node: Any, key: bytes, size: int) -> None:
        self.pool = node.connection_pool
        try:
            self.connection = self.pool.get_connection()
        except TypeError:  # redis-py 5: the command name is a required argument
            self.connection = self.pool.get_connection("SET")
        self.size, self.sent = size, 0
        try:
            head = b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(key), key, size)
            self.connection.send_packed_command([head])
        except BaseException:
            self.abort()
            raise

    def send(self, data: bytes) -> None:
        try:
            self.connection.send_packed_command([data], check_health=False)
        except BaseException:
            self.abort()
            raise
        self.sent += len(data)

    def finish(self) -> None:
        if self.sent != self.size:
            self.abort()
            raise DumpCorrupt("the dump holds %s bytes of a bitmap filter of %s", f"{self.sent:,}", f"{self.size:,}")
        try:
            ttl = str(SCRATCH_TTL_MS).encode()  # SET ... PX: the scratch key is never without its TTL
            self.connection.send_packed_command(
                [b"\r\n$2\r\nPX\r\n$%d\r\n%s\r\n" % (len(ttl), ttl)], check_health=False
            )
            self.connection.read_response()
        except BaseException:
            self.abort()
            raise
        self.pool.release(self.connection)

    def abort(self) -> None:
        """Close the connection: the server drops the unfinished command with it."""
        self.connection.disconnect()
        self.pool.release(self.connection)


class _Writer:
    """Writes one member's chunks into its scratch key."""

    def __init__(
        self, client: RedisClient, backend: Backend, family: KeyFamily, member: dict[str, Any], name: str
    ) -> None:
        self.client, self.backend, self.family, self.member, self.name = client, backend, family, member, name
        self.scratch = family.companion("restore")
        self.scratch_meta = family.companion("restore:meta")
        self.started = False
        self.offset = 0
        self.streamed: StreamedSet | None = None
        self.fingerprints = 0  # a cuckoo filter's taken slots, counted as the chunks pass
        self.counted_items: int | None = None  # and the item count its own header holds

    def write(self, chunk: Chunk) -> None:
        import redis

        command = LOADCHUNK.get(self.backend.name)
        if command is not None:
            if not self.started and self.backend.name == "redisbloom":
                check_redisbloom_header(chunk.data, self.member, self.name)
            elif not self.started:
                check_cuckoo_header(chunk.data, self.member, self.name)
                self.counted_items = parse_cf_header(chunk.data)["items"]
            else:
                self.fingerprints += len(chunk.data) - chunk.data.count(0)
            try:
                if not self.started:  # the header creates the key: with its TTL, in one MULTI
                    pipe = self.client.pipeline(transaction=True)
                    pipe.execute_command(command, self.scratch, chunk.cursor, chunk.data)
                    pipe.pexpire(self.scratch, SCRATCH_TTL_MS)
                    pipe.execute()
                else:  # (a CF.SCANDUMP chunk's iterator is its end + 1 too: it splits the same way)
                    for cursor, piece in _pieces(chunk):
                        self.client.execute_command(command, self.scratch, cursor, piece)
            except redis.exceptions.ResponseError as exc:
                if is_out_of_memory(exc):
                    raise
                raise UnsupportedServer(
                    "the server cannot load chunk at %s of %s (%s): rebuild the filter from the source",
                    chunk.cursor,
                    self.name,
                    str(exc),
                ) from None
        else:
            self._write_slice(chunk)
        self.started = True

    def _reserve_empty(self) -> None:
        """An empty RedisBloom cuckoo filter has no chunks (CF.SCANDUMP answers nothing for it): it
        is reserved anew with its parameters, with the scratch key's TTL, in one MULTI."""
        p = _cuckoo_plan_of(self.backend, self.member)
        pipe = self.client.pipeline(transaction=True)
        pipe.execute_command(
            "CF.RESERVE",
            self.scratch,
            p.capacity,
            "BUCKETSIZE",
            p.bucket_size,
            "MAXITERATIONS",
            p.max_iterations,
            "EXPANSION",
            p.expansion or 0,
        )
        pipe.pexpire(self.scratch, SCRATCH_TTL_MS)
        pipe.execute()
        self.started = True

    def _write_slice(self, chunk: Chunk) -> None:
        """A bitmap filter arrives as one SET whose value streams from here as the slices come: the
        server reads it between other clients' commands and stores it without a copy, so no command
        of the restore blocks it (slices written with SETRANGE cost one allocation of the whole
        string, 82 ms for 120 MB, or reallocations as it grew). Until the last byte, nothing exists;
        a failure closes the connection and the server drops the partial command."""
        size = int(self.member["size_bytes"])
        if chunk.cursor != self.offset or self.offset + len(chunk.data) > size:
            raise DumpCorrupt(
                "%s: a slice at byte %s where %s was next, of %s", self.name, chunk.cursor, self.offset, size
            )
        if not self.started:
            if self.backend.name == "lua-cuckoo":
                ok = recognise_lua(chunk.data[:HEADER_BYTES], size) and _lua_matches(chunk.data, self.member)
            else:
                head = parse_header(chunk.data[:HEADER_BYTES])
                ok = head is not None and HEADER_BYTES + head["bits"] // 8 == size and not head["bits"] % 64
            if not ok:
                raise DumpCorrupt(
                    "%s: the first slice is not the header of the %s filter the dump describes",
                    self.name,
                    self.backend.name,
                )
            if self.backend.name == "lua-cuckoo":
                self.counted_items = _lua_header_items(chunk.data)
            self.streamed = StreamedSet(node_client(self.client, self.scratch), self.scratch, size)
        if self.backend.name == "lua-cuckoo":
            self.fingerprints += _taken_slots(chunk.data, chunk.cursor, int(self.member["fingerprint_bits"]) // 8)
        assert self.streamed is not None
        self.streamed.send(chunk.data)
        self.offset += len(chunk.data)

    def finish(self) -> None:
        """The end of a streamed bitmap value: the server stores it now, with its TTL."""
        if self.streamed is not None:
            streamed, self.streamed = self.streamed, None
            streamed.finish()

    def abort(self) -> None:
        if self.streamed is not None:
            streamed, self.streamed = self.streamed, None
            streamed.abort()

    def check(self) -> None:
        """The loaded scratch key is the filter the dump's header describes (its size and layout; at
        least its items)."""
        member = self.member
        if not self.started and self.backend.name == "redisbloom-cuckoo" and member["items"] == 0:
            self._reserve_empty()
            return
        if not self.started:
            raise DumpCorrupt("%s: the dump holds no chunks for it", self.name)
        if self.counted_items is not None and self.counted_items != self.fingerprints:
            # every fingerprint is one item a filter counted: a dump that says otherwise is forged, or was
            # read while the filter changed (a restored filter with a wrong count could not be dumped again)
            raise DumpCorrupt(
                "%s: the cuckoo filter holds %s fingerprints, its header counts %s items: the dump is inconsistent",
                self.name,
                f"{self.fingerprints:,}",
                f"{self.counted_items:,}",
            )
        if self.backend.name in ("bitmap", "lua-cuckoo"):
            head = self.client.getrange(self.scratch, 0, HEADER_BYTES - 1)  # type: ignore[attr-defined]
            length = int(self.client.strlen(self.scratch))  # type: ignore[attr-defined]
            known = recognise(head, length) if self.backend.name == "bitmap" else recognise_lua(head, length)
            if length != member["size_bytes"] or not known:
                raise VerifyFailed(
                    "%s: the restored bitmap filter is %s bytes, the dump says %s",
                    self.name,
                    length,
                    member["size_bytes"],
                )
        state = self.backend.info(self.client, self.scratch, with_header=False)
        # the items may have grown while the member was dumped (its chunks then hold them too)
        fewer = state.items < member["items"] and self.backend.kind != "cuckoo"  # (a cuckoo filter's deletes)
        if (state.size_bytes, state.filters) != (member["size_bytes"], member["filters"]) or fewer:
            raise VerifyFailed(
                "%s: the restored filter has %s items in %s bytes, the dump says %s items (or more) in %s bytes",
                self.name,
                f"{state.items:,}",
                f"{state.size_bytes:,}",
                f"{member['items']:,}",
                f"{member['size_bytes']:,}",
            )


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
) -> RestoreReport:
    """Load ``chunks`` (a dump of the filter ``header`` describes) into the standby(s) of ``key``;
    with ``swap``, swap them in (the swap's guards apply). Nothing but this run's scratch keys and
    standby metadata is written before every chunk has arrived and checked out."""
    started = time.perf_counter()
    log: Events = events or (lambda message, fields: None)
    check_header(header)
    raw = to_bytes(key)
    family = KeyFamily.of(raw)
    check_family(client, family)
    backend = check_target(client, server, raw, header)
    if swap and not allow_recipe_change and RECIPE in header["metadata"]:
        check_recipe(read_metadata(client, family.meta), {RECIPE: header["metadata"][RECIPE]})
    report = RestoreReport(
        to_display(raw), backend.name, int(header["items"]), header["shards"], source=header.get("source", {})
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
            result = lifecycle.swap(
                client,
                server,
                family.active,
                keep_old_seconds=keep_old_seconds,
                min_ratio=min_ratio,
                allow_shrink=allow_shrink,
                allow_recipe_change=allow_recipe_change,
                lock=lock,
            )
            report.swapped = True
            report.replaced_active = any(result.replaced)
            report.note = result.note or report.note
    report.seconds = time.perf_counter() - started
    return report


def _prepare(
    client: RedisClient,
    backend: Backend,
    header: dict[str, Any],
    families: list[KeyFamily],
    force: bool,
    line: str = "",
) -> tuple[list[_Writer], str]:
    """Under the lock: the members' companions checked, a killed restore's leftovers removed, memory
    checked, and each member's scratch metadata written (state ``loading``, with its TTL, in one
    MULTI). Returns the writers and this run's generation."""
    for member in families:
        check_family(client, member)
        refuse_unowned_standby(client, member, "a restore")
        _clear_scratch(client, member)
    # RedisBloom 2.x cuckoo filters are written a second time for their replicas (RESTORE ... REPLACE
    # holds the new copy before it frees the loaded one)
    twice = 2 if backend.name == "redisbloom-cuckoo" and line == "redisbloom2" else 1
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
    generation = new_generation()
    writers = []
    for member, described in zip(families, header["members"], strict=True):
        per_member: Plan | CuckooPlan
        if backend.kind == "cuckoo":
            per_member = _cuckoo_plan_of(backend, described)
        else:
            per_member = plan(described["capacity"], float(header["error_rate"]), header["expansion"])
        meta = {**metadata_for(per_member, backend.name), "state": LOADING, "generation": generation}
        meta["error_rate"] = repr(float(header["error_rate"]))
        meta.update({name: value for name, value in header["metadata"].items() if name in KEPT_META})
        meta["restored_from"] = str(header.get("source", {}).get("server", "?"))[:200]
        pipe = client.pipeline(transaction=True)
        pipe.hset(member.companion("restore:meta"), mapping=meta)
        pipe.pexpire(member.companion("restore:meta"), SCRATCH_TTL_MS)
        pipe.execute()
        writers.append(_Writer(client, backend, member, described, to_display(member.active)))
    return writers, generation


def _load(
    client: RedisClient,
    lock: FilterLock,
    writers: list[_Writer],
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
            if writer.backend.name == "redisbloom-cuckoo" and line == "redisbloom2":
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


def _BACKENDS() -> list[Backend]:
    return [backends.get(name) for name in backends.names()]


def _clear_scratch(client: RedisClient, family: KeyFamily) -> None:
    """Remove a killed restore's leftovers (they would expire anyway); refuse to touch a scratch
    key bloomctl did not write."""
    scratch, meta = family.companion("restore"), family.companion("restore:meta")
    check_companions(client, [(meta, "metadata")])
    kind = backends.key_type(client, scratch)
    if kind != b"none" and not client.exists(meta) and not any(b.owns(client, scratch, kind) for b in _BACKENDS()):
        raise StateConflict(
            "%r holds data bloomctl did not write (bloomctl restores into it): move that key away first",
            to_display(scratch),
        )
    client.unlink(scratch, meta)


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


def copy(
    source: RedisClient,
    source_server: ServerInfo,
    key: str | bytes,
    target: RedisClient,
    target_server: ServerInfo,
    target_key: str | bytes,
    **options: Any,
) -> RestoreReport:
    """Dump ``key`` from one server and restore it as ``target_key`` on another, chunk by chunk."""
    dump = read_filter(source, source_server, key)
    return restore(target, target_server, target_key, dump.header, dump.chunks, **options)
