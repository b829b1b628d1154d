"""Dump: read a filter (one, or every member of a sharded one) from a server as the portable dump's
header and chunks.

The filter is read as the server stores it, through its backend (BF.SCANDUMP's chunks, or a
string in slices): the bits are copied, not the items, so nothing needs the source data. What
must not change while a member is read is noted before and compared after; a change fails the dump.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bloomctl import __version__, backends
from bloomctl.backends import Backend
from bloomctl.backends.base import CuckooState
from bloomctl.backends.library import installs_nothing
from bloomctl.errors import UnsupportedServer
from bloomctl.keys import KeyFamily, to_bytes, to_display
from bloomctl.lifecycle.manifest import read_manifest
from bloomctl.lifecycle.metadata import RECIPE, read_metadata
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.transfer.dumpfile import Chunk

KEPT_META = (RECIPE,)  # metadata a dump carries to the restored filter: how its items were built


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
    if isinstance(state, CuckooState):  # its capacity is the first sub-filter's slots
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
    command = backend.dump_command
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
        error_rate = float(meta["error_rate"]) if "error_rate" in meta else backend.reserved_error_rate(first)
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
        digest = hashlib.blake2b(digest_size=32)
        for cursor, data in backend.dump_chunks(client, member, described_member["size_bytes"]):
            chunk = Chunk(index, cursor, data)
            if backend.rereads_dump:
                _digest(digest, chunk)
            yield chunk
        with installs_nothing():
            after, items_after = _identity(client, backend, member)
        if after != identity or items_after < items:
            raise backend.dump_changed(member)
        if backend.rereads_dump:
            again = hashlib.blake2b(digest_size=32)
            for cursor, data in backend.dump_chunks(client, member, described_member["size_bytes"]):
                _digest(again, Chunk(index, cursor, data))
            if again.digest() != digest.digest():
                raise backend.dump_changed(member)


def _digest(digest: Any, chunk: Chunk) -> None:
    digest.update(chunk.cursor.to_bytes(8, "little", signed=True))
    digest.update(len(chunk.data).to_bytes(8, "little"))
    digest.update(chunk.data)
