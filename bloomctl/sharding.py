"""Sharded filters: one logical filter spread over N member filters on different slots and nodes.

For sets larger than one node. A small immutable manifest (a Redis hash at the filter's own key)
names the members; an item's shard is ``crc32(item bytes) mod N`` (CRC-32 as in zlib, Java, Go),
so any language routes the same way. Each member is an ordinary filter with its own companions
(standby, old, lock, meta) in its own slot: every lifecycle step runs per member, atomically.
"""

from __future__ import annotations

import contextlib
import json
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bloomctl import __version__, backends
from bloomctl.backends import Backend, FilterState
from bloomctl.errors import KeyMissing, StateConflict, UsageError
from bloomctl.keys import SLOTS, KeyFamily, crc16, to_bytes, to_display
from bloomctl.planner import Plan

MANIFEST_MARK = b"sharded-filter"
MANIFEST_FORMAT = 1
ROUTING = "crc32-mod-n"
MAX_SHARDS = 1024


def shard_of(item: bytes | str, shards: int) -> int:
    """The shard of one item: CRC-32 (IEEE, zlib's) of its bytes, modulo the shard count."""
    return zlib.crc32(to_bytes(item)) % shards


def route(items: Sequence[bytes], shards: int) -> list[list[bytes]]:
    """Items grouped by shard, in their order within each group."""
    groups: list[list[bytes]] = [[] for _ in range(shards)]
    crc = zlib.crc32
    for item in items:
        groups[crc(item) % shards].append(item)
    return groups


def _masters(client: Any) -> list[tuple[str, set[int]]]:
    """Each master ("host:port") with the slots it owns; one entry with every slot when standalone."""
    if not hasattr(client, "get_primaries"):
        return [("standalone", set(range(SLOTS)))]
    owners: dict[str, set[int]] = {}
    for slot, nodes in client.nodes_manager.slots_cache.items():
        primary = nodes[0]
        owners.setdefault(f"{primary.host}:{primary.port}", set()).add(slot)
    return sorted(owners.items())


def member_keys(client: Any, key: bytes, shards: int) -> list[bytes]:
    """Member names ``{tag}:KEY:shard:i``: distinct slots, spread round-robin over the masters.

    The tag is the shortest hex counter (from i * 65536) whose slot belongs to the wanted master
    and no other member; the manifest records the names, so later topology changes do not matter.
    """
    masters = _masters(client)
    used: set[int] = set()
    names = []
    for index in range(shards):
        _node, slots = masters[index % len(masters)]
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


def read_manifest(client: Any, key: str | bytes) -> Manifest | None:
    """The manifest at ``key``, or None when ``key`` is not a sharded filter."""
    raw = to_bytes(key)
    if backends.key_type(client, raw) != b"hash":
        return None
    fields = {k.decode(): v.decode("utf-8", "surrogateescape") for k, v in client.hgetall(raw).items()}
    if fields.get("bloomctl") != MANIFEST_MARK.decode():
        return None
    if fields.get("format") != str(MANIFEST_FORMAT) or fields.get("routing") != ROUTING:
        raise StateConflict(
            f"{to_display(raw)!r} is a sharded filter of format {fields.get('format')} / routing "
            f"{fields.get('routing')}, which this bloomctl does not know: upgrade bloomctl"
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
        raise StateConflict(f"{to_display(raw)!r} holds a damaged sharded-filter manifest ({exc!r})") from None
    if len(manifest.members) != manifest.shards or manifest.backend not in backends.names():
        raise StateConflict(f"{to_display(raw)!r} holds a damaged sharded-filter manifest")
    return manifest


def validate_shards(shards: int) -> int:
    if not 1 <= shards <= MAX_SHARDS:
        raise UsageError(f"--shards must be between 1 and {MAX_SHARDS}, got {shards}")
    return shards


def shard_plan(total: Plan, shards: int) -> Plan:
    """The plan of one member: the total capacity split evenly (rounded up), the same error rate."""
    from bloomctl.planner import plan

    per_shard = max(math.ceil(total.capacity / shards), 1)
    items = None if total.items is None else math.ceil(total.items / shards)
    return plan(per_shard, total.error_rate, total.expansion, items)


def suggest_shards(total_bytes: int, max_shard_bytes: int) -> int:
    if max_shard_bytes <= 0:
        raise UsageError("--max-shard-memory must be positive")
    return max(math.ceil(total_bytes / max_shard_bytes), 1)


def new_manifest(client: Any, key: str | bytes, shards: int, per_shard: Plan, backend: Backend) -> Manifest:
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
        created_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        created_by=f"bloomctl {__version__}",
    )


WRITE_MANIFEST_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""


def write_manifest(client: Any, manifest: Manifest) -> None:
    """Create the manifest in one step (no reader sees half of it); it never changes afterwards."""
    fields = [part for pair in manifest.as_hash().items() for part in pair]
    if not client.register_script(WRITE_MANIFEST_LUA)(keys=[manifest.key], args=fields):
        raise StateConflict(f"{to_display(manifest.key)!r} already exists")


def select_manifests(node: Any, keys: list[bytes]) -> list[bytes]:
    """Of ``keys`` (hashes), the manifests of sharded filters: one pipeline."""
    if not keys:
        return []
    pipe = node.pipeline(transaction=False)
    for key in keys:
        pipe.hget(key, "bloomctl")
    return [key for key, mark in zip(keys, pipe.execute(), strict=True) if mark == MANIFEST_MARK]


@dataclass(frozen=True)
class ShardedState(FilterState):
    """The sum of the members' numbers, judged by the worst member (an item lives in one shard)."""

    shard_states: tuple[FilterState, ...] = ()

    @classmethod
    def of(cls, states: list[FilterState]) -> ShardedState:
        first = states[0]
        return cls(
            backend=first.backend,
            capacity=sum(s.capacity for s in states),
            size_bytes=sum(s.size_bytes for s in states),
            filters=sum(s.filters for s in states),
            items=sum(s.items for s in states),
            expansion=first.expansion,
            shard_states=tuple(states),
        )

    @property
    def worst_shard(self) -> int:
        return max(range(len(self.shard_states)), key=lambda i: self.shard_states[i].fill_ratio)

    @property
    def reserved_capacity(self) -> int:
        return sum(s.reserved_capacity for s in self.shard_states)

    @property
    def fill_ratio(self) -> float:
        return self.shard_states[self.worst_shard].fill_ratio

    @property
    def estimated_fpr(self) -> float | None:
        fprs = [s.estimated_fpr for s in self.shard_states if s.estimated_fpr is not None]
        return max(fprs) if fprs else None

    @property
    def exact(self) -> bool:
        return all(s.exact for s in self.shard_states)

    def as_dict(self) -> dict[str, Any]:
        data = super().as_dict()
        data.update(
            shards=len(self.shard_states),
            worst_shard=self.worst_shard,
            shard_fill_ratios=[s.fill_ratio for s in self.shard_states],
        )
        return data


# --- lifecycle over shards ---------------------------------------------------------------------


def reserve_sharded(
    client: Any,
    server: Any,
    key: str | bytes,
    total: Plan,
    shards: int,
    *,
    backend: str = "auto",
    force: bool = False,
    dry_run: bool = False,
) -> tuple[Manifest, list[Any]]:
    """Create the manifest and N member filters; returns the manifest and each member's state."""
    from bloomctl import lifecycle

    chosen = backends.choose(server, backend)
    per_shard = chosen.check_plan(shard_plan(total, validate_shards(shards)))
    raw = to_bytes(key)
    if backends.key_type(client, raw) != b"none":
        existing = read_manifest(client, raw)
        detail = f"a sharded filter with {existing.shards} shards" if existing else "a key"
        raise StateConflict(f"{to_display(raw)!r} already exists ({detail})")
    manifest = new_manifest(client, raw, shards, per_shard, chosen)
    for member in manifest.members:
        if backends.key_type(client, member) != b"none":
            raise StateConflict(f"member {to_display(member)!r} already exists")
    if not force:  # added up per node: several members can share one
        lifecycle.check_memory_many(client, [(member, chosen.size_bytes(per_shard)) for member in manifest.members])
    if dry_run:
        return manifest, []
    created: list[bytes] = []
    try:
        for member in manifest.members:
            chosen.reserve(client, member, per_shard)
            created.append(member)
            client.hset(KeyFamily.of(member).meta, mapping=lifecycle.metadata_for(per_shard, chosen.name))
        write_manifest(client, manifest)  # last: the filter exists once every member does
    except BaseException:
        for member in created:  # new and empty: nothing of value is lost
            client.unlink(member, KeyFamily.of(member).meta)
        raise
    return manifest, [chosen.info(client, member) for member in manifest.members]


@dataclass
class ShardedDescription:
    manifest: Manifest
    shards: list[Any]  # lifecycle.Description, or None for a missing member

    def as_dict(self) -> dict[str, Any]:
        present = [d for d in self.shards if d is not None]
        worst = max(present, key=lambda d: d.state.fill_ratio, default=None)
        fprs = [d.state.estimated_fpr for d in present if d.state.estimated_fpr is not None]
        return {
            "key": to_display(self.manifest.key),
            "sharded": True,
            "manifest": self.manifest.as_dict(),
            "backend": self.manifest.backend,
            "shards": self.manifest.shards,
            "missing_members": [
                to_display(m) for m, d in zip(self.manifest.members, self.shards, strict=True) if d is None
            ],
            "capacity": sum(d.state.capacity for d in present),
            "reserved_capacity": sum(d.state.reserved_capacity for d in present),
            "items": sum(d.state.items for d in present),
            "size_bytes": sum(d.state.size_bytes for d in present),
            "fill_ratio": worst.state.fill_ratio if worst else 0.0,
            "worst_shard": self.shards.index(worst) if worst else None,
            "estimated_fpr": max(fprs) if fprs else None,  # an item is looked up in one shard: the worst one bounds it
            "members": [None if d is None else {**d.as_dict(), "shard": i} for i, d in enumerate(self.shards)],
        }


def describe_sharded(client: Any, manifest: Manifest, *, exact: bool = False) -> ShardedDescription:
    from bloomctl import lifecycle

    shards = []
    for member in manifest.members:
        try:
            shards.append(lifecycle.describe(client, member, exact=exact))
        except StateConflict:
            shards.append(None)
    return ShardedDescription(manifest, shards)


def swap_sharded(
    client: Any,
    server: Any,
    manifest: Manifest,
    *,
    keep_old_seconds: float = 0,
    min_ratio: float = 0.5,
    allow_shrink: bool = False,
    lock: Any = None,
) -> list[bool]:
    """Swap every member's standby in, one member at a time (each swap atomic), after all guards.

    Resumable: when an earlier swap stopped part-way, the members already swapped (no standby left,
    and their active filter carries the same rebuild generation as the remaining standbys) are
    skipped, so running `swap` again finishes the cutover.
    """
    from bloomctl import lifecycle

    families = [KeyFamily.of(member) for member in manifest.members]
    has_standby = [backends.key_type(client, f.standby) != b"none" for f in families]
    pending = [f for f, present in zip(families, has_standby, strict=True) if present]
    done = [f for f, present in zip(families, has_standby, strict=True) if not present]
    if pending and done:
        generations = {lifecycle.read_metadata(client, f.standby_meta).get("generation") for f in pending}
        finished = {lifecycle.read_metadata(client, f.meta).get("generation") for f in done}
        if len(generations) != 1 or None in generations or finished != generations:
            missing = ", ".join(to_display(f.standby) for f in done)
            raise StateConflict(f"the standby of {len(done)} shard(s) does not exist: {missing}")
    prepared = [
        lifecycle.prepare_swap(client, server, f.active, min_ratio=min_ratio, allow_shrink=allow_shrink)
        for f in pending
    ]
    if not prepared:
        raise StateConflict(f"no shard of {to_display(manifest.key)!r} has a standby to swap in")
    replaced = []
    for index, plan_ in enumerate(prepared):
        if lock is not None:
            lock.check_held()
        try:
            replaced.append(lifecycle.swap(client, plan_, keep_old_seconds=keep_old_seconds))
        except Exception as exc:
            swapped = len(done) + index
            raise StateConflict(
                f"the sharded swap stopped after {swapped} of {manifest.shards} shards ({exc}); every shard answers "
                f"correctly meanwhile: run `bloomctl swap {to_display(manifest.key)}` again to finish"
            ) from exc
    return replaced


def rollback_sharded(client: Any, manifest: Manifest) -> None:
    from bloomctl import lifecycle

    for member in manifest.members:  # every member must be able to roll back before any moves
        family = KeyFamily.of(member)
        if backends.key_type(client, family.old) == b"none":
            raise StateConflict(f"shard {to_display(member)!r} has no old filter to roll back to")
        if backends.key_type(client, family.standby) != b"none":
            raise StateConflict(f"shard {to_display(member)!r} has a standby; swap it in or delete it first")
    for member in manifest.members:
        lifecycle.rollback(client, member)


# --- the application API ------------------------------------------------------------------------


class Filter:
    """One filter, whichever backend: ``add``, ``madd``, ``exists``, ``mexists``.

    >>> users = Filter(client, "users")
    >>> users.madd(["user:1", "user:2"]); users.exists("user:1")
    """

    def __init__(self, client: Any, key: str | bytes) -> None:
        self.client, self.key = client, to_bytes(key)
        self._backend: Backend | None = None

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = backends.for_key(self.client, self.key)
        return self._backend

    def add(self, item: bytes | str) -> bool:
        return self.madd([item])[0]

    def exists(self, item: bytes | str) -> bool:
        return self.mexists([item])[0]

    def madd(self, items: Sequence[bytes | str], *, dual_write: bool = False) -> list[bool]:
        """Add items. ``dual_write``: first to the standby when one exists (a rebuild is running),
        then to the active filter - in that order, so no cutover can lose the item (README)."""
        raw = [to_bytes(i) for i in items]
        if dual_write:
            with contextlib.suppress(KeyMissing):  # no rebuild running: nothing to do there
                self.backend.madd(self.client, KeyFamily.of(self.key).standby, raw)
        return self.backend.madd(self.client, self.key, raw)

    def mexists(self, items: Sequence[bytes | str]) -> list[bool]:
        return self.backend.mexists(self.client, self.key, [to_bytes(i) for i in items])


class ShardedFilter(Filter):
    """A sharded filter: items are grouped by shard and sent in one pipeline (per node, on a cluster).

    >>> users = ShardedFilter(client, "users")
    >>> users.madd(items); users.mexists(items)
    """

    def __init__(self, client: Any, key: str | bytes) -> None:
        super().__init__(client, key)
        manifest = read_manifest(client, self.key)
        if manifest is None:
            raise StateConflict(f"{to_display(self.key)!r} is not a sharded filter")
        self.manifest = manifest
        self._backend = backends.get(manifest.backend)

    def _fan_out(
        self,
        items: Sequence[bytes | str],
        command: Any,
        keys: Sequence[bytes] | None = None,
        *,
        missing_ok: bool = False,
    ) -> list[bool]:
        keys = keys or self.manifest.members
        raw = [to_bytes(i) for i in items]
        if not raw:
            return []
        groups = route(raw, self.manifest.shards)
        positions: list[list[int]] = [[] for _ in groups]
        crc = zlib.crc32
        for position, item in enumerate(raw):
            positions[crc(item) % self.manifest.shards].append(position)
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
            standbys = [KeyFamily.of(member).standby for member in self.manifest.members]
            self._fan_out(items, self.backend.madd_command, standbys, missing_ok=True)
        return self._fan_out(items, self.backend.madd_command)

    def mexists(self, items: Sequence[bytes | str]) -> list[bool]:
        return self._fan_out(items, self.backend.mexists_command)


def open_filter(client: Any, key: str | bytes) -> Filter:
    """A ShardedFilter when ``key`` holds a manifest, else a Filter."""
    return ShardedFilter(client, key) if read_manifest(client, key) else Filter(client, key)
