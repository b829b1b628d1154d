"""Manifest: the small immutable hash at a sharded filter's own key that names its members.

A sharded filter is N ordinary member filters on different slots (and nodes); the manifest
records their names, the backend, the per-member parameters and the routing, so later
topology changes do not matter. It is written once, in one step, after every member exists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from bloomctl import __version__, backends
from bloomctl.backends import Backend
from bloomctl.errors import StateConflict
from bloomctl.keys import SLOTS, KeyFamily, crc16, to_bytes, to_display
from bloomctl.lifecycle.metadata import create_hash, now_utc
from bloomctl.lifecycle.routing import ROUTING, shard_of
from bloomctl.server.client import RedisClient
from bloomctl.server.topology import masters
from bloomctl.sizing.bloom import Plan, validate_shards

MANIFEST_MARK = b"sharded-filter"
MANIFEST_FORMAT = 1


def member_keys(client: RedisClient, key: bytes, shards: int) -> list[bytes]:
    """Member names ``{tag}:KEY:shard:i``: distinct slots, spread round-robin over the masters.

    The tag is the shortest hex counter (from i * 65536) whose slot belongs to the wanted master
    and no other member; the manifest records the names, so later topology changes do not matter.
    """
    owners = masters(client)
    used: set[int] = set()
    names = []
    for index in range(shards):
        _node, slots = owners[index % len(owners)]
        candidate = index * 65536
        while True:
            tag = format(candidate, "x").encode()
            slot = crc16(tag) % SLOTS
            if slot in slots and slot not in used:
                break
            candidate += 1
        used.add(slot)
        names.append(b"{" + tag + b"}:" + key + b":shard:" + str(index).encode())
    return names


def is_member_name(key: bytes) -> bool:
    """Whether a key looks like a shard of some sharded filter (they are reported through the manifest)."""
    if not key.startswith(b"{"):
        return False
    tag, _, rest = key[1:].partition(b"}")
    head, sep, index = rest.rpartition(b":shard:")
    return bool(sep) and head.startswith(b":") and index.isdigit() and all(c in b"0123456789abcdef" for c in tag)


@dataclass(frozen=True)
class Manifest:
    key: bytes
    shards: int
    members: tuple[bytes, ...]
    backend: str
    capacity: int  # per shard
    error_rate: float
    expansion: int | None
    created_at: str = ""
    created_by: str = ""
    routing: str = ROUTING
    format: int = MANIFEST_FORMAT
    extra: dict[str, str] = field(default_factory=dict)

    def shard_of(self, item: bytes | str) -> int:
        return shard_of(item, self.shards)

    @property
    def families(self) -> list[KeyFamily]:
        return [KeyFamily.of(member) for member in self.members]

    def as_hash(self) -> dict[str, str]:
        return {
            "bloomctl": MANIFEST_MARK.decode(),
            "format": str(self.format),
            "routing": self.routing,
            "shards": str(self.shards),
            "members": json.dumps([m.decode("utf-8", "surrogateescape") for m in self.members]),
            "backend": self.backend,
            "capacity_per_shard": str(self.capacity),
            "error_rate": repr(self.error_rate),
            "expansion": "nonscaling" if self.expansion is None else str(self.expansion),
            "created_at": self.created_at,
            "created_by": self.created_by,
        }

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = dict(self.as_hash())
        data.update(
            shards=self.shards,
            members=[to_display(m) for m in self.members],
            format=self.format,
            capacity_per_shard=self.capacity,
            error_rate=self.error_rate,
            expansion=self.expansion,
        )
        data.pop("bloomctl")
        return data

    def matches(self, shards: int, backend: str, per_shard: Plan) -> bool:
        """Whether this sharded filter was created with these parameters."""
        return (self.shards, self.backend, self.capacity, self.expansion, self.error_rate) == (
            shards,
            backend,
            per_shard.capacity,
            per_shard.expansion,
            per_shard.error_rate,
        )


def read_manifest(client: RedisClient, key: str | bytes) -> Manifest | None:
    """The manifest at ``key``, or None when ``key`` is not a sharded filter."""
    raw = to_bytes(key)
    if backends.key_type(client, raw) != b"hash":
        return None
    fields = {k.decode(): v.decode("utf-8", "surrogateescape") for k, v in client.hgetall(raw).items()}
    if fields.get("bloomctl") != MANIFEST_MARK.decode():
        return None
    if fields.get("format") != str(MANIFEST_FORMAT) or fields.get("routing") != ROUTING:
        raise StateConflict(
            "%r is a sharded filter of format %s / routing %s, which this bloomctl does not know: upgrade bloomctl",
            to_display(raw),
            fields.get("format"),
            fields.get("routing"),
        )
    try:
        members = tuple(m.encode("utf-8", "surrogateescape") for m in json.loads(fields["members"]))
        manifest = Manifest(
            key=raw,
            shards=int(fields["shards"]),
            members=members,
            backend=fields["backend"],
            capacity=int(fields["capacity_per_shard"]),
            error_rate=float(fields["error_rate"]),
            expansion=None if fields["expansion"] == "nonscaling" else int(fields["expansion"]),
            created_at=fields.get("created_at", ""),
            created_by=fields.get("created_by", ""),
        )
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise StateConflict("%r holds a damaged sharded-filter manifest (%r)", to_display(raw), exc) from None
    if len(manifest.members) != manifest.shards or manifest.backend not in backends.names():
        raise StateConflict("%r holds a damaged sharded-filter manifest", to_display(raw))
    return manifest


def new_manifest(client: RedisClient, key: str | bytes, shards: int, per_shard: Plan, backend: Backend) -> Manifest:
    raw = to_bytes(key)
    KeyFamily.of(raw)  # validates the name
    return Manifest(
        key=raw,
        shards=validate_shards(shards),
        members=tuple(member_keys(client, raw, shards)),
        backend=backend.name,
        capacity=per_shard.capacity,
        error_rate=per_shard.error_rate,
        expansion=per_shard.expansion,
        created_at=now_utc(),
        created_by=f"bloomctl {__version__}",
    )


def write_manifest(client: RedisClient, manifest: Manifest) -> None:
    """Create the manifest in one step (no reader sees half of it); it never changes afterwards."""
    if not create_hash(client, manifest.key, manifest.as_hash()):
        raise StateConflict("%r already exists", to_display(manifest.key))


def select_manifests(node: RedisClient, keys: list[bytes]) -> list[bytes]:
    """Of ``keys`` (hashes), the manifests of sharded filters: one pipeline."""
    if not keys:
        return []
    pipe = node.pipeline(transaction=False)
    for key in keys:
        pipe.hget(key, "bloomctl")
    return [key for key, mark in zip(keys, pipe.execute(), strict=True) if mark == MANIFEST_MARK]
