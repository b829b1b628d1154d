"""Sharded lifecycle: reserve, describe, swap and roll back every member of a sharded filter.

Each member is an ordinary filter with its own companions (standby, old, lock, meta) in its own
slot, so every step runs per member with the one-filter primitives of ``bloomctl.lifecycle.single``, after
checks over all members. A sharded swap is resumable: members already swapped are recognised
and skipped when it runs again.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from bloomctl import backends
from bloomctl.backends import FilterState
from bloomctl.errors import BloomctlError, ConnectionFailed, StateConflict
from bloomctl.keys import KeyFamily, to_bytes, to_display
from bloomctl.lifecycle.guards import SwapGuards
from bloomctl.lifecycle.lock import FilterLock
from bloomctl.lifecycle.manifest import Manifest, new_manifest, read_manifest, write_manifest
from bloomctl.lifecycle.metadata import metadata_for, read_metadata
from bloomctl.lifecycle.single import Description, ReserveResult, SwapPlan, describe, prepare_swap, rollback, swap_under
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.server.memory import check_memory
from bloomctl.sizing.bloom import Plan, shard_plan


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


def reserve_sharded(
    client: RedisClient,
    server: ServerInfo,
    key: str | bytes,
    total: Plan,
    shards: int,
    *,
    backend: str = backends.AUTO,
    force: bool = False,
    dry_run: bool = False,
) -> ReserveResult:
    """Create the manifest and N member filters (``total``'s capacity split between them)."""
    chosen, member_plan = backends.plan_reserve(server, backend, lambda _chosen: shard_plan(total, shards))
    per_shard = chosen.bloom_plan(member_plan)
    raw = to_bytes(key)
    if backends.key_type(client, raw) != b"none":
        existing = read_manifest(client, raw)
        detail = f"a sharded filter with {existing.shards} shards" if existing else "a key"
        raise StateConflict("%r already exists (%s)", to_display(raw), detail)
    manifest = new_manifest(client, raw, shards, per_shard, chosen)
    for member in manifest.members:
        if backends.key_type(client, member) != b"none":
            raise StateConflict("member %r already exists", to_display(member))
    if not force:  # added up per node: several members can share one
        check_memory(client, [(member, chosen.size_bytes(per_shard)) for member in manifest.members])
    result = ReserveResult(
        created=not dry_run, state=None, backend=chosen.name, predicted_size=chosen.size_bytes(per_shard)
    )
    if dry_run:
        return _with_manifest(result, manifest)
    created: list[bytes] = []
    try:
        for member in manifest.members:
            chosen.reserve(client, member, per_shard)
            created.append(member)
            client.hset(KeyFamily.of(member).meta, mapping=metadata_for(per_shard, chosen.name))
        write_manifest(client, manifest)  # last: the filter exists once every member does
    except BaseException:
        for member in created:  # new and empty: nothing of value is lost
            client.unlink(member, KeyFamily.of(member).meta)
        raise
    states = tuple(chosen.info(client, member) for member in manifest.members)
    return _with_manifest(result, manifest, states)


def _with_manifest(result: ReserveResult, manifest: Manifest, states: tuple[FilterState, ...] = ()) -> ReserveResult:
    return ReserveResult(
        created=result.created,
        state=ShardedState.of(list(states)) if states else None,
        backend=result.backend,
        predicted_size=result.predicted_size,
        manifest=manifest,
        member_states=states,
    )


def existing_sharded(client: RedisClient, key: str | bytes, total: Plan, shards: int, backend: str) -> Manifest | None:
    """The sharded filter at ``key`` when it was created with these parameters and every member
    exists (reserve's ``if_not_exists``); None otherwise."""
    existing = read_manifest(client, key)
    if existing is None or not existing.matches(shards, backend, shard_plan(total, shards)):
        return None
    return existing if all(client.exists(member) for member in existing.members) else None


@dataclass
class ShardedDescription:
    manifest: Manifest
    shards: list[Description | None]  # None for a missing member

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


def describe_sharded(client: RedisClient, manifest: Manifest, *, exact: bool = False) -> ShardedDescription:
    shards: list[Description | None] = []
    for member in manifest.members:
        try:
            shards.append(describe(client, member, exact=exact))
        except StateConflict:
            shards.append(None)
    return ShardedDescription(manifest, shards)


def prepare_sharded_swap(
    client: RedisClient,
    server: ServerInfo,
    manifest: Manifest,
    guards: SwapGuards,
) -> tuple[list[SwapPlan], int]:
    """Every pending member's checked swap, and how many members an earlier, interrupted swap
    already finished (no standby left, and the same rebuild generation as the remaining ones)."""
    families = manifest.families
    has_standby = [backends.key_type(client, f.standby) != b"none" for f in families]
    pending = [f for f, present in zip(families, has_standby, strict=True) if present]
    done = [f for f, present in zip(families, has_standby, strict=True) if not present]
    if pending and done:
        generations = {read_metadata(client, f.standby_meta).get("generation") for f in pending}
        finished = {read_metadata(client, f.meta).get("generation") for f in done}
        if len(generations) != 1 or None in generations or finished != generations:
            missing = ", ".join(to_display(f.standby) for f in done)
            raise StateConflict("the standby of %s shard(s) does not exist: %s", len(done), missing)
    prepared = [prepare_swap(client, server, f.active, guards) for f in pending]
    if not prepared:
        raise StateConflict("no shard of %r has a standby to swap in", to_display(manifest.key))
    return prepared, len(done)


def swap_sharded(
    client: RedisClient,
    manifest: Manifest,
    prepared: list[SwapPlan],
    already_done: int,
    *,
    keep_old_seconds: float = 0,
    lock: FilterLock,
) -> tuple[list[bool], str | None]:
    """Swap every prepared member's standby in, one member at a time (each swap atomic, each
    checking the lock's token in its script). Returns per member whether an active filter was
    replaced, and a note when a member's outcome had to be looked up after a lost reply.

    A failure part-way leaves every shard answering correctly (each holds either its old or its
    new filter); running the swap again finishes the cutover.
    """
    replaced: list[bool] = []
    note = None
    for index, plan_ in enumerate(prepared):
        lock.check_held()
        try:
            # The swap script checks a lock in its own member's slot (a script cannot reach the
            # filter's lock on another node): the member's, taken for this one swap.
            own_lock = FilterLock(
                client, plan_.family.active, command="bloomctl swap (shard)", ttl_ms=lock.ttl_ms, wait=lock.wait
            )
            with own_lock as own:
                done, note = swap_under(client, plan_, keep_old_seconds=keep_old_seconds, lock=own)
        except Exception as exc:
            raise _stopped(manifest, already_done + index, exc) from exc
        replaced.append(done)
        if note is not None and index + 1 < len(prepared):  # the lock is released: the rest must wait
            raise _stopped(manifest, already_done + index + 1, StateConflict(note))
    return replaced, note


def _stopped(manifest: Manifest, swapped: int, exc: BaseException) -> BloomctlError:
    # a lost connection keeps its exit code 3: the server's fault, not a conflict
    kind = ConnectionFailed if isinstance(exc, ConnectionFailed) else StateConflict
    return kind(
        "the sharded swap stopped after %s of %s shards (%s); every shard answers correctly meanwhile: run `bloomctl swap %s` again to finish",
        swapped,
        manifest.shards,
        exc,
        shlex.quote(to_display(manifest.key)),
    )


def rollback_sharded(client: RedisClient, manifest: Manifest, *, dry_run: bool = False) -> None:
    for family in manifest.families:  # every member must be able to roll back before any moves
        if backends.key_type(client, family.old) == b"none":
            raise StateConflict("shard %r has no old filter to roll back to", to_display(family.active))
        if backends.key_type(client, family.standby) != b"none":
            raise StateConflict("shard %r has a standby; swap it in or delete it first", to_display(family.active))
    for member in manifest.members:
        rollback(client, member, dry_run=dry_run)
