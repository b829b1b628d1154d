"""One filter's lifecycle steps: reserve, describe, swap its standby in, roll back.

Every step that moves a filter runs as one Lua script over keys of a single hash slot
(see ``bloomctl.keys``), so readers never observe the active key missing and Redis Cluster
never answers CROSSSLOT. These are the primitives; ``bloomctl.lifecycle.front`` is the front door
that takes the lock and chooses between one filter and a sharded one.
"""

from __future__ import annotations

import functools
import math
import shlex
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from bloomctl import backends
from bloomctl.backends import AUTO, Backend, CuckooState, FilterState
from bloomctl.backends.base import AnyPlan
from bloomctl.errors import ConnectionFailed, KeyMissing, StateConflict
from bloomctl.keys import KeyFamily, to_bytes, to_display
from bloomctl.lifecycle.guards import DEFAULT_GUARDS, SwapGuards, check_min_ratio, to_keep_ms
from bloomctl.lifecycle.lock import DONE
from bloomctl.lifecycle.manifest import Manifest
from bloomctl.lifecycle.metadata import (
    RECIPE,
    UNFINISHED,
    check_companions,
    describe_recipe,
    metadata_for,
    read_metadata,
    typed,
)
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.server.memory import check_memory
from bloomctl.server.topology import node_address
from bloomctl.sizing.bloom import Plan
from bloomctl.sizing.cuckoo import CuckooPlan

if TYPE_CHECKING:
    from bloomctl.lifecycle.lock import FilterLock

# --- reserve --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReserveResult:
    """What ``reserve`` did: created (or found, with ``if_not_exists``) one filter or a sharded one."""

    created: bool
    state: FilterState | None  # None after a dry run that would create the filter (and for a sharded one)
    backend: str = ""
    predicted_size: int | None = None  # what the plan said the server would report
    manifest: Manifest | None = None  # a sharded filter's
    member_states: tuple[FilterState, ...] = ()  # a sharded filter's members, as created
    existing: bool = False  # an existing filter with these parameters was accepted (if_not_exists)

    @property
    def size_mismatch(self) -> bool:
        """The server allocated another size than the plan predicted (a server line the planner
        does not know yet)."""
        return self.created and self.state is not None and self.state.size_bytes != self.predicted_size


def plan_matches(plan: Plan | CuckooPlan, state: FilterState) -> bool:
    """Whether an existing filter was created with ``plan``'s arguments (as far as the server tells)."""
    if isinstance(plan, CuckooPlan) or isinstance(state, CuckooState):
        return (
            isinstance(plan, CuckooPlan)
            and isinstance(state, CuckooState)
            and (state.buckets, state.bucket_size, state.max_iterations, state.fingerprint_bits)
            == (plan.buckets, plan.bucket_size, plan.max_iterations, plan.fingerprint_bits)
            and state.expansion == (plan.growth or None)
        )
    if state.expansion != plan.expansion:
        return False
    if state.subfilters:
        first = state.subfilters[0]
        return first.capacity == plan.capacity and math.isclose(first.error_rate, plan.first.error_rate, rel_tol=1e-12)
    return state.filters == 1 and state.capacity == plan.capacity and state.size_bytes == plan.size_bytes


def on_engine(plan: AnyPlan, chosen: Backend) -> AnyPlan:
    """``plan`` for the backend chosen: a cuckoo filter's on that backend's engine."""
    return plan.for_engine(chosen.engine) if isinstance(plan, CuckooPlan) else plan


def reserve(
    client: RedisClient,
    server: ServerInfo,
    key: str | bytes,
    plan: Plan | CuckooPlan,
    *,
    if_not_exists: bool = False,
    backend: str = AUTO,
    force: bool = False,
    dry_run: bool = False,
) -> ReserveResult:
    """Create the filter, after the checks; ``dry_run`` makes every check and creates nothing. The
    plan's type (a ``CuckooPlan`` or a Bloom filter's ``Plan``) decides the filter's."""
    # as this server builds it: Redis 8 caps error rates, and a module-free cuckoo filter never grows
    chosen, plan = backends.plan_reserve(server, backend, functools.partial(on_engine, plan), plan.kind)
    family = KeyFamily.of(key)
    kind = backends.key_type(client, family.active)
    if kind != b"none":
        name = to_display(family.active)
        existing = backends.for_key(client, family.active)
        state = existing.info(client, family.active)
        if if_not_exists and existing is chosen and plan_matches(plan, state):
            return ReserveResult(created=False, state=state, backend=chosen.name, existing=True)
        detail = "with different parameters" if if_not_exists else "(pass `if_not_exists` to accept a matching filter)"
        raise StateConflict(
            "filter %r already exists " + detail + ": %s, capacity %s, %s items",
            name,
            existing.name,
            f"{state.capacity:,}",
            f"{state.items:,}",
        )
    check_family(client, family)
    predicted = chosen.size_bytes(plan)
    if not force:
        check_memory(client, [(family.active, predicted)])
    if dry_run:
        return ReserveResult(created=False, state=None, backend=chosen.name, predicted_size=predicted)
    try:
        chosen.reserve(client, family.active, plan)
    except StateConflict:
        if if_not_exists and backends.key_type(client, family.active) != b"none":
            # made between the look above and the reserve (two `apply` runs at once): judged as any
            # filter found there, accepted when its parameters match
            return reserve(client, server, key, plan, if_not_exists=True, backend=backend, force=force)
        raise
    client.delete(family.meta)
    client.hset(family.meta, mapping=metadata_for(plan, chosen.name))
    state = chosen.info(client, family.active)
    return ReserveResult(created=True, state=state, backend=chosen.name, predicted_size=predicted)


# --- inspect --------------------------------------------------------------------------------


@dataclass
class Description:
    key: bytes
    family: KeyFamily
    state: FilterState
    ttl_ms: int | None  # None: no expiry
    companions: dict[str, bool]
    metadata: dict[str, str]
    slot: int
    node: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"key": to_display(self.key)}
        data.update(self.state.as_dict())
        data.update(
            ttl_seconds=None if self.ttl_ms is None else self.ttl_ms / 1000,
            slot=self.slot,
            node=self.node,
            companions={
                role: {"key": to_display(name), "exists": self.companions[role]}
                for role, name in self.family.all_keys().items()
                if role != "active"
            },
            metadata=typed(self.metadata) if self.metadata else {},
        )
        return data


def describe(client: RedisClient, key: str | bytes, *, exact: bool = False) -> Description:
    family = KeyFamily.of(key)
    backend = backends.for_key(client, family.active)
    state = backend.bit_fill(client, family.active) if exact else backend.info(client, family.active)
    companions = {role: bool(client.exists(name)) for role, name in family.all_keys().items() if role != "active"}
    ttl = client.pttl(family.active)
    return Description(
        key=family.active,
        family=family,
        state=state,
        ttl_ms=ttl if ttl is not None and ttl >= 0 else None,
        companions=companions,
        metadata=read_metadata(client, family.meta),
        slot=family.slot,
        node=node_address(client, family.active),
    )


# --- swap and rollback ----------------------------------------------------------------------

# KEYS: active, standby, old, active meta, standby meta, old meta, lock.
# ARGV: milliseconds to keep the old filter (0: unlink it now), the Redis type the standby must have,
# the bytes its value must start with ('' for none), and the token the lock must hold ('' for no check).
# UNLINK before RENAME: RENAME onto an existing key frees it synchronously and blocks the server.
SWAP_LUA = """
-- Every check before the first write: a Lua error part-way would leave a half-done swap.
local keep = tonumber(ARGV[1])
if not keep or keep < 0 or keep ~= math.floor(keep) then
  return redis.error_reply('BLOOMCTL keep-old must be a whole number of milliseconds')
end
for i = 1, 7 do
  for j = i + 1, 7 do
    if KEYS[i] == KEYS[j] then
      return redis.error_reply('BLOOMCTL the standby must not be the active filter or one of its companions')
    end
  end
end
if ARGV[4] ~= '' then
  local lock = redis.call('GET', KEYS[7])
  if not lock or not string.find(lock, ARGV[4], 1, true) then
    return redis.error_reply('BLOOMCTL lost the lock (it expired): nothing swapped')
  end
end
if redis.call('TYPE', KEYS[2])['ok'] ~= ARGV[2] then
  return redis.error_reply('BLOOMCTL standby is missing or changed type')
end
if ARGV[3] ~= '' and redis.call('GETRANGE', KEYS[2], 0, #ARGV[3] - 1) ~= ARGV[3] then
  return redis.error_reply('BLOOMCTL standby is not a bloomctl filter')
end
-- (checked here too, not only before: a cuckoo standby's dual write may fail, or a rebuild fail,
-- between those checks and this script)
local standby_meta = redis.call('HMGET', KEYS[5], 'state', 'dual', 'dual_error')
if standby_meta[1] == 'loading' or standby_meta[1] == 'failed' or standby_meta[1] == 'interrupted' then
  return redis.error_reply('BLOOMCTL the standby is from a rebuild that did not finish (' .. standby_meta[1] .. '): run the rebuild again')
end
if standby_meta[2] == 'log' then
  return redis.error_reply('BLOOMCTL the standby has not had the writes made during its rebuild replayed: run the rebuild again')
end
if standby_meta[3] then
  return redis.error_reply('BLOOMCTL the standby missed a write the application made during the rebuild (' .. standby_meta[3] .. '): run the rebuild again')
end
redis.call('UNLINK', KEYS[3], KEYS[6])
local had_active = redis.call('EXISTS', KEYS[1])
if had_active == 1 then redis.call('RENAME', KEYS[1], KEYS[3]) end
if redis.call('EXISTS', KEYS[4]) == 1 then redis.call('RENAME', KEYS[4], KEYS[6]) end
redis.call('RENAME', KEYS[2], KEYS[1])
redis.call('PERSIST', KEYS[1])
if redis.call('EXISTS', KEYS[5]) == 1 then
  redis.call('RENAME', KEYS[5], KEYS[4])
  redis.call('PERSIST', KEYS[4])
end
if keep > 0 then
  redis.call('PEXPIRE', KEYS[3], keep)
  redis.call('PEXPIRE', KEYS[6], keep)
else
  redis.call('UNLINK', KEYS[3], KEYS[6])
end
return had_active
"""

# KEYS as above. The filter rolled back from becomes the standby, so `swap` can re-apply it.
ROLLBACK_LUA = """
if redis.call('EXISTS', KEYS[3]) == 0 then
  return redis.error_reply('BLOOMCTL no old filter to roll back to')
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return redis.error_reply('BLOOMCTL a standby exists')
end
redis.call('UNLINK', KEYS[5])
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('RENAME', KEYS[1], KEYS[2]) end
if redis.call('EXISTS', KEYS[4]) == 1 then redis.call('RENAME', KEYS[4], KEYS[5]) end
redis.call('RENAME', KEYS[3], KEYS[1])
redis.call('PERSIST', KEYS[1])
if redis.call('EXISTS', KEYS[6]) == 1 then
  redis.call('RENAME', KEYS[6], KEYS[4])
  redis.call('PERSIST', KEYS[4])
end
return 1
"""


def check_family(client: RedisClient, family: KeyFamily, standby: bytes | None = None) -> None:
    """Refuse (exit 5, the key named) when a companion key bloomctl would write, move or delete
    holds someone else's data: metadata that is not bloomctl's hash, a lock that is not a string,
    an "old" key that is not a filter (a swap unlinks the old filter)."""
    standby_meta = standby_meta_key(family, standby if standby is not None else family.standby)
    roles = [
        (family.meta, "metadata"),
        (standby_meta, "metadata"),
        (family.old_meta, "metadata"),
        (family.lock, "lock"),
    ]
    check_companions(client, roles)
    if backends.key_type(client, family.old) != b"none":
        backends.for_key(client, family.old, "old filter")  # WrongType when it is not a filter


def standby_meta_key(family: KeyFamily, standby: bytes) -> bytes:
    """A custom standby brings its own metadata key (its ``:meta`` companion); the default one is ours."""
    return family.standby_meta if standby == family.standby else KeyFamily.of(standby).meta


def _family_keys(family: KeyFamily, standby: bytes) -> list[bytes]:
    """The six keys of a swap, in the order SWAP_LUA and ROLLBACK_LUA expect."""
    return [family.active, standby, family.old, family.meta, standby_meta_key(family, standby), family.old_meta]


def _run_script(client: RedisClient, source: str, keys: list[bytes], args: list[Any]) -> object:
    import redis

    try:
        return client.register_script(source)(keys=keys, args=args)
    except redis.exceptions.ResponseError as exc:
        text = str(exc)
        if "BLOOMCTL" in text:
            raise StateConflict(text.split("BLOOMCTL", 1)[1].strip()) from None
        raise


def atomic_swap(
    client: RedisClient,
    family: KeyFamily,
    *,
    standby: bytes | None = None,
    keep_old_ms: int = 0,
    standby_type: bytes = b"MBbloom--",
    standby_magic: bytes = b"",
    lock_token: str = "",
) -> bool:
    """Move standby -> active and active -> old in one atomic step. True when an active filter was replaced."""
    keys = [*_family_keys(family, standby or family.standby), family.lock]
    return bool(_run_script(client, SWAP_LUA, keys, [int(keep_old_ms), standby_type, standby_magic, lock_token]))


def atomic_rollback(client: RedisClient, family: KeyFamily) -> None:
    _run_script(client, ROLLBACK_LUA, _family_keys(family, family.standby), [])


@dataclass(frozen=True)
class SwapPlan:
    """What a swap would do, checked against the server; ``swap`` performs it."""

    family: KeyFamily
    standby: bytes
    backend: Backend
    standby_state: FilterState
    active_state: FilterState | None

    @property
    def shrink_ratio(self) -> float | None:
        if self.active_state is None or self.active_state.items == 0:
            return None
        return self.standby_state.items / self.active_state.items


def _counted(backend: Backend, client: RedisClient, key: bytes) -> FilterState:
    """info without the per-sub-filter header, with the exact item count (BF.CARD where it exists)."""
    return replace(backend.info(client, key, with_header=False), items=backend.card(client, key))


def check_recipe(active: dict[str, str], standby: dict[str, str]) -> None:
    """The standby's items must be built as the active filter's were (the source's kind, column,
    template and prefix): built otherwise, every lookup the application makes the old way misses.
    Filters whose metadata records no recipe (made by `reserve`, or by bloomctl before 0.2) pass."""
    was, now = active.get(RECIPE), standby.get(RECIPE)
    if was is not None and now is not None and was != now:
        raise StateConflict(
            "the standby's items are built differently from the active filter's (%s, was %s): every lookup "
            "built the old way would miss; pass `allow_recipe_change` if the application changed too",
            describe_recipe(now),
            describe_recipe(was),
        )


def prepare_swap(
    client: RedisClient,
    server: ServerInfo,
    key: str | bytes,
    guards: SwapGuards = DEFAULT_GUARDS,
    *,
    standby: str | bytes | None = None,
) -> SwapPlan:
    """Every check of a swap of ``standby`` (default: the filter's own) into ``key``, under ``guards``:
    what the swap would do, or why it must not."""
    check_min_ratio(guards.min_ratio)
    family = KeyFamily.of(key)
    standby_key = to_bytes(standby) if standby is not None else family.standby
    companions = set(family.all_keys().values()) - {family.standby}
    if standby_key in companions or standby_meta_key(family, standby_key) in companions - {family.standby_meta}:
        raise StateConflict(
            "the standby %r must not be the active filter or one of its companion keys", to_display(standby_key)
        )
    if server.cluster and KeyFamily.of(standby_key).slot != family.slot:
        raise StateConflict(
            "standby %r is in slot %s, the active filter in slot %s: on a cluster both must share a hash tag (default standby: %r)",
            to_display(standby_key),
            KeyFamily.of(standby_key).slot,
            family.slot,
            to_display(family.standby),
        )
    check_family(client, family, standby_key)
    if backends.key_type(client, standby_key) == b"none" and backends.key_type(client, family.active) == b"none":
        backends.for_key(client, family.active)  # neither exists: a typo? name the filter, with suggestions
    backend = backends.for_key(client, standby_key, "standby")
    standby_meta = read_metadata(client, standby_meta_key(family, standby_key))
    state = standby_meta.get("state")
    if state in UNFINISHED:
        raise StateConflict(
            "the standby %r is from a rebuild that did not finish (%s): run the rebuild again",
            to_display(standby_key),
            state,
        )
    if "dual_error" in standby_meta:  # a cuckoo standby that missed an application's write
        raise StateConflict(
            "the standby %r missed a write the application made during the rebuild (%s): it may lack items; "
            "run the rebuild again",
            to_display(standby_key),
            standby_meta["dual_error"],
        )
    standby_state = _counted(backend, client, standby_key)
    if backend.overfills and standby_state.items > standby_state.capacity:  # dual writes since the rebuild
        raise StateConflict(
            "the standby %r holds %s items, over its capacity of %s: a filter that never grows answers 'maybe' for "
            "ever more absent items past it; rebuild with a larger capacity",
            to_display(standby_key),
            f"{standby_state.items:,}",
            f"{standby_state.capacity:,}",
        )
    active_state = None
    if backends.key_type(client, family.active) != b"none":
        active_backend = backends.for_key(client, family.active, "active filter")
        if active_backend is not backend:
            raise StateConflict(
                "the standby is a %s filter and the active one a %s filter: readers of the active key would break",
                backend.name,
                active_backend.name,
            )
        active_state = _counted(backend, client, family.active)
    if active_state is not None and not guards.allow_recipe_change:
        check_recipe(read_metadata(client, family.meta), read_metadata(client, standby_meta_key(family, standby_key)))
    result = SwapPlan(family, standby_key, backend, standby_state, active_state)
    ratio = result.shrink_ratio
    if active_state is not None and ratio is not None and ratio < guards.min_ratio and not guards.allow_shrink:
        raise StateConflict(
            "standby has %s items, %s of the active filter's %s (guard: %s); pass `allow_shrink` if that is intended",
            f"{standby_state.items:,}",
            f"{ratio:.1%}",
            f"{active_state.items:,}",
            f"{guards.min_ratio:.0%}",
        )
    return result


def swap(client: RedisClient, prepared: SwapPlan, *, keep_old_seconds: float = 0, lock_token: str = "") -> bool:
    """The atomic swap; with ``lock_token``, the script also checks that the filter's lock is still ours."""
    return atomic_swap(
        client,
        prepared.family,
        standby=prepared.standby,
        keep_old_ms=to_keep_ms(keep_old_seconds),
        standby_type=prepared.backend.redis_type,
        standby_magic=prepared.backend.magic,
        lock_token=lock_token,
    )


def swap_under(
    client: RedisClient, prepared: SwapPlan, *, keep_old_seconds: float, lock: FilterLock
) -> tuple[bool, str | None]:
    """``swap`` under ``lock`` (the script checks its token). When the reply never comes (a timeout,
    a dropped connection), the swap may or may not have run: release the lock, which settles it (a
    script still waiting in the server then fails its token check), and look. Returns whether an
    active filter was replaced, and a note when the outcome had to be looked up."""
    import redis

    # the standby's rebuild generation: after a lost reply, the active filter carrying it means applied
    # The standby key alone could mislead: a run waiting for the lock may create a new one meanwhile.
    generation = client.hget(standby_meta_key(prepared.family, prepared.standby), "generation")
    try:
        replaced = swap(client, prepared, keep_old_seconds=keep_old_seconds, lock_token=lock.token)
        DONE.append(f"the swap of {to_display(prepared.family.active)!r} completed")
        return replaced, None
    except KeyboardInterrupt:  # a signal while the script ran: say whether it was applied
        _look_after_signal(client, prepared, generation)
        raise
    except (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError) as exc:
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no reply'}"
        name = to_display(prepared.family.active)
        unknown = ConnectionFailed(
            "the swap of %r got no reply (%s) and the server has not answered since: whether it was applied is "
            "unknown; `bloomctl info %s` shows which filter is active once it answers",
            name,
            reason,
            shlex.quote(name),
        )
        if not lock.release_confirmed(time.monotonic() + lock.ttl_ms / 1000 + 5):
            raise unknown from None
        try:
            if generation is not None:
                applied = client.hget(prepared.family.meta, "generation") == generation
            else:
                applied = backends.key_type(client, prepared.standby) == b"none"
        except Exception:
            raise unknown from None
        if not applied:
            raise ConnectionFailed(
                "the swap of %r got no reply (%s); bloomctl released its lock and looked: it was NOT applied (the "
                "standby is still there, the active filter unchanged): run it again",
                name,
                reason,
            ) from None
        return (
            prepared.active_state is not None,
            f"the swap's reply did not arrive ({reason}); bloomctl looked: it was applied",
        )


def _look_after_signal(client: RedisClient, prepared: SwapPlan, generation: bytes | None) -> None:
    """A signal came while the swap's script ran, before its reply was read: look whether it was
    applied, so that the line after the signal says so (or that it is unknown)."""
    name = to_display(prepared.family.active)
    try:
        if generation is not None:
            applied = client.hget(prepared.family.meta, "generation") == generation
        else:
            applied = backends.key_type(client, prepared.standby) == b"none"
    except BaseException:  # (a second signal, a lost server): it stays unknown
        DONE.append(f"whether the swap of {name!r} was applied is unknown (`bloomctl info {shlex.quote(name)}` tells)")
        return
    if applied:
        DONE.append(f"the swap of {name!r} completed")


def rollback(client: RedisClient, key: str | bytes, *, dry_run: bool = False) -> None:
    """Every check, then (unless ``dry_run``) the atomic rollback."""
    family = KeyFamily.of(key)
    check_family(client, family)
    if backends.key_type(client, family.old) == b"none":
        if backends.key_type(client, family.active) == b"none":
            backends.for_key(client, family.active)  # no filter at all: a typo? name it, with suggestions
        raise KeyMissing(
            "no old filter %r to roll back to (a swap with `keep_old` seconds keeps one)", to_display(family.old)
        )
    backends.for_key(client, family.old, "old filter")
    if backends.key_type(client, family.standby) != b"none":
        raise StateConflict(
            "standby %r exists; swap it in or delete it before rolling back", to_display(family.standby)
        )
    if not dry_run:
        atomic_rollback(client, family)
