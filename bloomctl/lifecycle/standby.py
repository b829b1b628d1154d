"""Rebuild step 2, prepare the standbys: replace what a crashed run left, check memory, reserve.

Runs under the filter's lock. Each standby's metadata is marked ``loading`` (with this run's
generation) before the standby exists, so there is never an unmarked standby that a swap could
take for a finished one; ``Standbys.mark`` moves the state on only while the lock and the
standbys are still this run's.
"""

from __future__ import annotations

import contextlib
import random
import shlex
import time
from dataclasses import dataclass, field

from bloomctl import backends
from bloomctl.backends import Backend
from bloomctl.backends.base import AnyPlan
from bloomctl.backends.library import Library
from bloomctl.errors import OutOfMemory, StateConflict
from bloomctl.keys import KeyFamily, to_display
from bloomctl.lifecycle.lock import FilterLock
from bloomctl.lifecycle.manifest import Manifest
from bloomctl.lifecycle.metadata import LOADING, RECIPE, mark_state, metadata_for
from bloomctl.server.client import RedisClient
from bloomctl.server.memory import check_memory

# KEYS: standby, its metadata, its log. ARGV: generation. Removes them only if this run made them.
DISCARD_LUA = """
if redis.call('HGET', KEYS[2], 'generation') ~= ARGV[1] then return 0 end
local build = redis.call('HGET', KEYS[2], 'build')
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3])
if build then redis.call('UNLINK', build) end
return 1
"""


@dataclass(frozen=True)
class Targets:
    """The filters a rebuild writes: the key itself, or every member of a sharded filter."""

    members: list[bytes]
    plan: AnyPlan  # of each member
    manifest: Manifest | None = None
    new_manifest: bool = False  # a first sharded build: write the manifest once the members are ready

    @property
    def families(self) -> list[KeyFamily]:
        return [KeyFamily.of(member) for member in self.members]

    @property
    def standbys(self) -> list[bytes]:
        return [family.standby for family in self.families]


def is_out_of_memory(exc: BaseException) -> bool:
    """A write refused for memory: redis-py's OutOfMemoryError, or a script or pipeline reply
    that carries Redis's OOM error."""
    text = str(exc)
    return type(exc).__name__ == "OutOfMemoryError" or "command not allowed when used memory" in text


def refuse_unowned_standby(client: RedisClient, family: KeyFamily, what: str) -> None:
    """A filter at the standby's name without any metadata was made by hand (to swap in) or is
    another application's key: never replaced. (A killed run's standby, or the filter a rollback
    moved there, has its metadata.)"""
    if backends.key_type(client, family.standby) != b"none" and not client.exists(family.standby_meta):
        raise StateConflict(
            "%r holds a filter without bloomctl's metadata (%r is missing): made by hand, or another "
            "application's; %s would replace it: swap it in (`bloomctl swap %s`), or remove it, then run again",
            to_display(family.standby),
            to_display(family.standby_meta),
            what,
            shlex.quote(to_display(family.active)),
        )


def new_generation() -> str:
    """A rebuild's identity, recorded in its standbys' metadata: UTC time and 32 random bits."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{random.getrandbits(32):08x}"


@dataclass
class Standbys:
    client: RedisClient
    targets: Targets
    lock: FilterLock
    generation: str

    def mark(self, state: str) -> None:
        """Set the standbys' state, only while the lock and the standbys are still this run's."""
        self.lock.check_held()
        for member in self.targets.families:
            if not mark_state(self.client, member.standby_meta, self.generation, state):
                raise StateConflict("the standby %r was replaced by another run", to_display(member.standby))

    def discard(self) -> int:
        """Remove the standbys and their metadata while they are still this run's (nothing of
        value: the run that made them failed); returns how many were removed."""
        script = self.client.register_script(DISCARD_LUA)
        return sum(
            int(script(keys=[member.standby, member.standby_meta, member.standby_log], args=[self.generation]))
            for member in self.targets.families
        )


@dataclass
class Stale:
    """What earlier runs left at the standbys' keys: the items they held, and the memory each
    frees when it is replaced. ``items`` is None when no standby was there."""

    items: int | None = None
    freed: dict[bytes, int] = field(default_factory=dict)


def stale_standbys(client: RedisClient, targets: Targets) -> Stale:
    """The standbys an earlier run left (refused when they are not bloomctl's)."""
    stale = Stale()
    for member in targets.families:
        if backends.key_type(client, member.standby) != b"none":
            refuse_unowned_standby(client, member, "a rebuild")
            found = backends.for_key(client, member.standby, "standby")
            stale.items = (stale.items or 0) + found.card(client, member.standby)
            stale.freed[member.standby] = found.info(client, member.standby, with_header=False).size_bytes
    return stale


def check_standby_memory(client: RedisClient, backend: Backend, targets: Targets, stale: Stale) -> None:
    """The new standbys fit their nodes, counting the memory the stale ones give back."""
    size = backend.size_bytes(targets.plan)
    planned = [(standby, max(size - stale.freed.get(standby, 0), 0)) for standby in targets.standbys]
    check_memory(client, planned, kept=[member.old for member in targets.families])


def reserve_standbys(
    client: RedisClient, backend: Backend, targets: Targets, lock: FilterLock, recipe: str | None = None
) -> Standbys:
    """Replace the standbys with new, empty ones marked ``loading`` (recording ``recipe``, how
    the items are built); returns them for marking. A backend that needs the function library has
    it checked first, so that a refusal leaves no mark."""
    if backend.needs_library:  # usable (installed, current, callable) before the first mark: a user
        Library().ensure(client)  # denied FUNCTION is refused with no `loading` metadata left behind
    standbys = Standbys(client, targets, lock, new_generation())
    meta = {**metadata_for(targets.plan, backend.name), "state": LOADING, "generation": standbys.generation}
    if backend.logs_dual_writes:
        meta["dual"] = "log"  # the application's writes go to the log until the rebuild replays it
    if recipe is not None:
        meta[RECIPE] = recipe
    try:
        for member in targets.families:
            _reserve_member(client, backend, targets, member, meta, standbys)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (a large bitmap's SET takes a while): nothing was
        with contextlib.suppress(Exception):  # loaded, and a `loading` mark would stay without TTL
            standbys.discard()
        raise
    return standbys


def _reserve_member(
    client: RedisClient, backend: Backend, targets: Targets, member: KeyFamily, meta: dict[str, str], standbys: Standbys
) -> None:
    check_log(client, member.standby_log)
    leftover = client.hget(member.standby_meta, "build")  # a killed run's upload copy (it expires anyway)
    client.unlink(member.standby, member.standby_meta, member.standby_log, *([leftover] if leftover else []))
    client.hset(member.standby_meta, mapping=meta)  # marked before it exists: no unmarked window
    try:
        backend.reserve(client, member.standby, targets.plan)
    except Exception as exc:
        if is_out_of_memory(exc):
            standbys.discard()
            raise out_of_memory(exc, member.standby) from None
        # a reserve the server refused (a user denied FCALL or BF.RESERVE): nothing was loaded,
        # and a `loading` mark with no standby would only keep `swap` refusing until the next run
        with contextlib.suppress(Exception):
            standbys.discard()
        raise


def check_log(client: RedisClient, log: bytes) -> None:
    """The standby's log is a list bloomctl's functions append to: anything else there is someone
    else's, and is never deleted."""
    kind = backends.key_type(client, log)
    if kind not in (b"none", b"list"):
        raise StateConflict(
            "%r holds %s: bloomctl keeps a cuckoo standby's log there; move that key away first",
            to_display(log),
            backends.describe_type(kind),
        )


def out_of_memory(exc: BaseException, standby: bytes) -> OutOfMemory:
    return OutOfMemory(
        "the server is out of memory (%s): the standby %r was removed to give the memory back; nothing was "
        "swapped (plan a smaller filter, free memory or raise maxmemory, then run again)",
        str(exc).splitlines()[0][:120],
        to_display(standby),
    )
