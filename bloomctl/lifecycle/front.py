"""Lifecycle: the front door for reserve, describe, swap and rollback, on any filter.

Each function takes the key of a filter, finds out whether it is one filter or a sharded one,
takes the filter's lock where the step moves keys, and runs the guards, so an application and
the CLI get the same behaviour from the same call. The steps themselves live in
``bloomctl.lifecycle.single`` (one filter) and ``bloomctl.lifecycle.sharded`` (over members).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from bloomctl import backends
from bloomctl.backends import AUTO
from bloomctl.defaults import DEFAULT_KEEP_OLD_SECONDS, DEFAULT_MIN_RATIO, MAX_SHARDS
from bloomctl.errors import StateConflict, UsageError
from bloomctl.keys import KeyFamily, to_display
from bloomctl.lifecycle import lock as lock_module
from bloomctl.lifecycle.guards import SwapGuards
from bloomctl.lifecycle.lock import FilterLock
from bloomctl.lifecycle.manifest import Manifest, read_manifest
from bloomctl.lifecycle.sharded import (
    ShardedDescription,
    describe_sharded,
    existing_sharded,
    prepare_sharded_swap,
    reserve_sharded,
    rollback_sharded,
    swap_sharded,
)
from bloomctl.lifecycle.single import Description, ReserveResult, prepare_swap, swap_under
from bloomctl.lifecycle.single import describe as describe_single
from bloomctl.lifecycle.single import reserve as reserve_single
from bloomctl.lifecycle.single import rollback as rollback_single
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.sizing.bloom import Plan
from bloomctl.sizing.cuckoo import CuckooPlan

Confirm = Callable[[str], bool]  # asked a yes/no question before a swap or rollback changes anything

__all__ = [
    "Confirm",
    "Description",
    "ReserveResult",
    "RollbackResult",
    "ShardedDescription",
    "SwapGuards",
    "SwapResult",
]


def reserve(
    client: RedisClient,
    server: ServerInfo,
    key: str | bytes,
    plan: Plan | CuckooPlan,
    *,
    shards: int | None = None,
    if_not_exists: bool = False,
    backend: str = AUTO,
    force: bool = False,
    dry_run: bool = False,
) -> ReserveResult:
    """Create the filter ``key`` (or, with ``shards``, a sharded filter splitting ``plan``'s capacity),
    after every check; ``dry_run`` makes the checks and creates nothing. With ``if_not_exists``, a
    filter created with the same parameters is accepted unchanged (``created`` is False)."""
    from bloomctl.backends.bitmap import TooLarge

    try:
        if shards is None:
            return reserve_single(
                client, server, key, plan, if_not_exists=if_not_exists, backend=backend, force=force, dry_run=dry_run
            )
        if not isinstance(plan, Plan):
            raise UsageError("cuckoo filters are not sharded: leave out `shards`")
        chosen = backends.choose(server, backend)
        if if_not_exists and (existing := existing_sharded(client, key, plan, shards, chosen.name)) is not None:
            return ReserveResult(created=False, state=None, backend=chosen.name, manifest=existing, existing=True)
        return reserve_sharded(client, server, key, plan, shards, backend=chosen.name, force=force, dry_run=dry_run)
    except TooLarge as exc:
        raise too_large(plan, shards, exc) from None


def too_large(plan: Plan | CuckooPlan, shards: int | None, exc: UsageError) -> UsageError:
    """A bitmap filter (or shard) past the 512 MB string limit: how many shards would each fit."""
    from bloomctl.backends.bitmap import Bitmap
    from bloomctl.sizing.bloom import shard_plan

    if not isinstance(plan, Plan):
        return exc
    bitmap = backends.get(Bitmap.name)
    for more in range((shards or 1) + 1, MAX_SHARDS + 1):
        try:
            bitmap.check_plan(shard_plan(plan, more))
        except UsageError:
            continue
        each = f"each of the {shards} shards" if shards else "it"
        return UsageError(
            "%s would need more than Redis's 512 MB string limit (a bitmap filter is one string): give `shards` %s "
            "or more, lower `capacity` or raise `error_rate`",
            each,
            more,
        )
    return exc


def describe(client: RedisClient, key: str | bytes, *, exact: bool = False) -> Description | ShardedDescription:
    """Everything about one filter (or a sharded one, member by member); ``exact`` counts the set bits."""
    manifest = read_manifest(client, key)
    if manifest is not None:
        return describe_sharded(client, manifest, exact=exact)
    return describe_single(client, key, exact=exact)


@dataclass(frozen=True)
class SwapResult:
    key: bytes
    standby: bytes | None  # None for a sharded filter (each member swaps its own standby)
    replaced: list[bool]  # per filter (one, or one per member swapped now): an active filter was replaced
    items: int | None  # items of the filter swapped in (one filter)
    previous_items: int | None  # items of the filter it replaced (one filter)
    old: bytes  # where the replaced filter is kept (one filter)
    keep_old_seconds: float
    manifest: Manifest | None = None
    note: str | None = None  # the swap's reply was lost, and bloomctl looked: it was applied
    dry_run: bool = False  # every check passed; nothing was swapped

    @property
    def sharded(self) -> bool:
        return self.manifest is not None


class NotConfirmed(StateConflict):
    """The user answered no: the swap (or the command) did not happen."""


def _confirmed(confirm: Confirm | None, question: str) -> None:
    if confirm is not None and not confirm(question):
        raise NotConfirmed("not confirmed: nothing changed")


def swap(
    client: RedisClient,
    server: ServerInfo,
    key: str | bytes,
    *,
    standby: str | bytes | None = None,
    keep_old_seconds: float = DEFAULT_KEEP_OLD_SECONDS,
    min_ratio: float = DEFAULT_MIN_RATIO,
    allow_shrink: bool = False,
    confirm: Confirm | None = None,
    lock: FilterLock | None = None,
    allow_recipe_change: bool = False,
    lock_wait: float = 0,
    dry_run: bool = False,
) -> SwapResult:
    """Atomically replace the filter ``key`` with its standby, under the filter's lock.

    Refuses a standby that is missing, unfinished, of another backend, or (unless ``allow_shrink``)
    holding fewer than ``min_ratio`` of the active filter's items. A sharded filter swaps every
    member (resuming an interrupted swap). Pass ``lock`` when the caller already holds it (a rebuild);
    ``lock_wait`` seconds to wait for a held lock. The replaced filter is kept ``keep_old_seconds``
    (an hour by default) for ``rollback``; 0 unlinks it. ``dry_run``: every check, nothing written
    (the lock is looked at, not taken).
    """
    guards = SwapGuards(
        min_ratio=min_ratio,
        allow_shrink=allow_shrink,
        allow_recipe_change=allow_recipe_change,
        keep_old_seconds=keep_old_seconds,
    )
    return guarded_swap(
        client, server, key, guards, standby=standby, confirm=confirm, lock=lock, lock_wait=lock_wait, dry_run=dry_run
    )


def guarded_swap(
    client: RedisClient,
    server: ServerInfo,
    key: str | bytes,
    guards: SwapGuards,
    *,
    standby: str | bytes | None = None,
    confirm: Confirm | None = None,
    lock: FilterLock | None = None,
    lock_wait: float = 0,
    dry_run: bool = False,
) -> SwapResult:
    """``swap`` with its guards as one value (a rebuild's, a restore's)."""
    guards.check()  # both numbers, before anything is taken or written
    if standby is not None and read_manifest(client, key) is not None:
        raise UsageError("a sharded filter swaps each member with its own standby: leave out `standby`")
    if dry_run:
        from bloomctl.backends.bitmap import installs_nothing

        FilterLock(client, key).check_free()
        with installs_nothing():
            return _swap_under_lock(client, server, key, standby, guards, None, None)
    held: AbstractContextManager[FilterLock] = (
        nullcontext(lock) if lock is not None else FilterLock(client, key, command="bloomctl swap", wait=lock_wait)
    )
    with held as the_lock:
        return _swap_under_lock(client, server, key, standby, guards, confirm, the_lock)


def _swap_under_lock(
    client: RedisClient,
    server: ServerInfo,
    key: str | bytes,
    standby: str | bytes | None,
    guards: SwapGuards,
    confirm: Confirm | None,
    lock: FilterLock | None,
) -> SwapResult:
    """The checks, then (under ``lock``) the swap; with no lock (a dry run), only the checks."""
    family = KeyFamily.of(key)
    keep_old_seconds = guards.keep_old_seconds
    manifest = read_manifest(client, family.active)
    if manifest is not None:
        if standby is not None:
            raise UsageError("a sharded filter swaps each member with its own standby: leave out `standby`")
        prepared, done = prepare_sharded_swap(client, server, manifest, guards)
        if lock is None:
            would_replace = [p.active_state is not None for p in prepared]
            return SwapResult(
                family.active, None, would_replace, None, None, family.old, keep_old_seconds, manifest, None, True
            )
        _confirmed(confirm, f"Swap the {manifest.shards} shard standbys of {to_display(manifest.key)!r} in?")
        members, note = swap_sharded(client, manifest, prepared, done, keep_old_seconds=keep_old_seconds, lock=lock)
        lock_module.DONE.append(f"the swap of {to_display(family.active)!r} completed")
        return SwapResult(family.active, None, members, None, None, family.old, keep_old_seconds, manifest, note)
    plan = prepare_swap(client, server, family.active, guards, standby=standby)
    previous = plan.active_state.items if plan.active_state else None
    if lock is None:
        replaced_now = [plan.active_state is not None]
        items = plan.standby_state.items
        return SwapResult(
            family.active, plan.standby, replaced_now, items, previous, family.old, keep_old_seconds, dry_run=True
        )
    _confirmed(
        confirm,
        f"Swap {to_display(plan.standby)!r} ({plan.standby_state.items:,} items) into {to_display(family.active)!r}"
        + (f" ({previous:,} items now)" if previous is not None else " (absent now)")
        + "?",
    )
    replaced, note = swap_under(client, plan, keep_old_seconds=keep_old_seconds, lock=lock)  # (it records DONE)
    return SwapResult(
        family.active,
        plan.standby,
        [replaced],
        plan.standby_state.items,
        previous,
        family.old,
        keep_old_seconds,
        None,
        note,
    )


@dataclass(frozen=True)
class RollbackResult:
    key: bytes
    standby: bytes  # where the filter rolled back from now is (one filter)
    manifest: Manifest | None = None
    dry_run: bool = False  # every check passed; nothing was rolled back


def rollback(
    client: RedisClient,
    key: str | bytes,
    *,
    confirm: Confirm | None = None,
    lock: FilterLock | None = None,
    lock_wait: float = 0,
    dry_run: bool = False,
) -> RollbackResult:
    """Atomically restore the filter ``key`` had before the last swap (kept with ``keep_old_seconds``),
    under the filter's lock (pass ``lock`` when the caller holds it; ``lock_wait`` seconds to wait
    for it). The filter rolled back from becomes the standby, so a swap re-applies it. ``dry_run``:
    every check, nothing written."""
    family = KeyFamily.of(key)
    manifest = read_manifest(client, family.active)
    if dry_run:
        FilterLock(client, family.active).check_free()
        if manifest is not None:
            rollback_sharded(client, manifest, dry_run=True)
        else:
            rollback_single(client, family.active, dry_run=True)
        return RollbackResult(family.active, family.standby, manifest, dry_run=True)
    the_lock = FilterLock(client, family.active, command="bloomctl rollback", wait=lock_wait)
    with nullcontext(lock) if lock is not None else the_lock:
        if manifest is not None:
            _confirmed(confirm, f"Roll the {manifest.shards} shards of {to_display(family.active)!r} back?")
            rollback_sharded(client, manifest)
        else:
            _confirmed(confirm, f"Roll {to_display(family.active)!r} back to {to_display(family.old)!r}?")
            rollback_single(client, family.active)
        lock_module.DONE.append(f"the rollback of {to_display(family.active)!r} completed")
    return RollbackResult(family.active, family.standby, manifest)
