"""Backends: the commands that create, read and fill one filter on the server.

The lifecycle (reserve, info, fill-ratio, swap, ...) talks only to this seam. Four backends
implement it, two per filter type: Bloom filters on ``redisbloom`` (the BF.* commands) and
``bitmap`` (a plain string hashed by server-side Lua, for servers without modules); cuckoo
filters on ``redisbloom-cuckoo`` (CF.*) and ``lua-cuckoo`` (a string, the same function library).
Every method takes the redis-py client explicitly (standalone or cluster). This module is the
registry: it picks a backend for a new filter and recognises an existing key's backend from the
key itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bloomctl.backends.base import AnyPlan, Backend, CuckooState, FilterState, SubFilterState
from bloomctl.backends.bitmap import Bitmap
from bloomctl.backends.cuckoo_base import CuckooBackend
from bloomctl.backends.cuckoo_lua import LuaCuckoo
from bloomctl.backends.cuckoo_redisbloom import RedisBloomCuckoo
from bloomctl.backends.redisbloom import RedisBloom
from bloomctl.defaults import AUTO
from bloomctl.errors import KeyMissing, UsageError, WrongType
from bloomctl.keys import to_display
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.sizing.cuckoo import (
    DEFAULT_BUCKET_SIZE,
    DEFAULT_MAX_ITERATIONS,
    LUA,
    REDISBLOOM,
    CuckooPlan,
    cuckoo_plan,
    for_cuckoo_line,
)

__all__ = [
    "AUTO",
    "Backend",
    "CuckooState",
    "FilterState",
    "SubFilterState",
    "choose",
    "cuckoo_plan_for",
    "for_key",
    "get",
    "key_type",
    "names",
    "plan_reserve",
]

_BACKENDS: dict[str, Backend] = {
    "redisbloom": RedisBloom(),
    "bitmap": Bitmap(),
    "redisbloom-cuckoo": RedisBloomCuckoo(),
    "lua-cuckoo": LuaCuckoo(),
}
BLOOM, CUCKOO = "bloom", "cuckoo"
KINDS = (BLOOM, CUCKOO)
MODULE_FREE = "module-free"  # --backend for either type's module-free backend (bitmap, lua-cuckoo)
# The backend that each pair of --type and --backend values names.
_BY_CHOICE = {
    (BLOOM, "redisbloom"): "redisbloom",
    (BLOOM, "bitmap"): "bitmap",
    (BLOOM, MODULE_FREE): "bitmap",
    (CUCKOO, "redisbloom"): "redisbloom-cuckoo",
    (CUCKOO, MODULE_FREE): "lua-cuckoo",
    (CUCKOO, "bitmap"): "lua-cuckoo",  # the module-free one, whatever the name says
}


def get(name: str) -> Backend:
    """The backend called ``name`` (``redisbloom``, ``bitmap``, ``redisbloom-cuckoo``, ``lua-cuckoo``)."""
    try:
        return _BACKENDS[name]
    except KeyError:
        raise UsageError("unknown backend %r: choose auto, redisbloom or bitmap", name) from None


def names() -> list[str]:
    return list(_BACKENDS)


def every() -> list[Backend]:
    """Every backend, one of each."""
    return list(_BACKENDS.values())


def choose(server: ServerInfo, requested: str = AUTO, kind: str = BLOOM) -> Backend:
    """The backend for a new filter of type ``kind``: RedisBloom's where the server has its commands
    (BF.*, CF.*), else the module-free one. ``requested`` is a backend's name, or (with ``kind``)
    auto, redisbloom, module-free or bitmap."""
    if kind not in KINDS:
        raise UsageError("unknown filter type %r: choose bloom or cuckoo", kind)
    if requested in _BACKENDS and requested not in ("redisbloom", "bitmap"):
        chosen = get(requested)
        if chosen.kind != kind:
            raise UsageError("the %s backend keeps %s filters, not %s filters", requested, chosen.kind, kind)
    elif requested == AUTO:
        if kind == CUCKOO:
            chosen = get("redisbloom-cuckoo" if server.has_cuckoo else "lua-cuckoo")
        else:
            chosen = get("redisbloom" if server.has_bloom else "bitmap")
    elif (kind, requested) in _BY_CHOICE:
        chosen = get(_BY_CHOICE[(kind, requested)])
    else:
        raise UsageError("unknown backend %r: choose auto, redisbloom or module-free", requested)
    if chosen.name == "redisbloom":
        server.require_bloom()
    elif chosen.name == "redisbloom-cuckoo":
        server.require_cuckoo()
    return chosen


PlanFor = Callable[[Backend], AnyPlan]  # a new filter's plan, made for the backend chosen


def plan_reserve(
    server: ServerInfo, requested: str | Backend, plan: AnyPlan | PlanFor, kind: str = BLOOM
) -> tuple[Backend, AnyPlan]:
    """The backend of a new filter and its plan as ``server`` builds it (Redis 8 caps error rates
    and capacities; a bitmap filter never grows). ``requested`` is an option value for ``choose``,
    or the backend already chosen (an existing filter's, a window's); ``plan`` is the plan, or a
    function that makes it for the backend chosen (which decides the expansion and the cuckoo engine)."""
    chosen = requested if isinstance(requested, Backend) else choose(server, requested, kind)
    the_plan = plan(chosen) if callable(plan) else plan
    return chosen, chosen.check_plan(the_plan, server.line)


TYPE_NAMES = {
    b"string": "a string",
    b"hash": "a hash",
    b"list": "a list",
    b"set": "a set",
    b"zset": "a sorted set",
    b"stream": "a stream",
    b"MBbloomCF": "a RedisBloom cuckoo filter",
    b"MBbloom--": "a RedisBloom Bloom filter",
    b"ReJSON-RL": "a JSON document",
}


def key_type(client: RedisClient, key: bytes) -> bytes:
    kind = client.type(key)
    return kind if isinstance(kind, bytes) else str(kind).encode()


def describe_type(kind: bytes) -> str:
    return TYPE_NAMES.get(kind, kind.decode(errors="replace"))


def for_key(client: RedisClient, key: bytes, role: str = "filter") -> Backend:
    """The backend of the filter at ``key``, recognised from the key itself."""
    kind = key_type(client, key)
    if kind == b"none":
        missing = KeyMissing("%s %r does not exist", role, to_display(key))
        if role in ("filter", "active filter"):  # a name the user gave: the command line may suggest others
            missing.filter_key = key
        raise missing
    for backend in _BACKENDS.values():
        if backend.owns(client, key, kind):
            return backend
    detail = (
        "a string that is not a bloomctl filter" if kind == b"string" else f"{describe_type(kind)}, not a Bloom filter"
    )
    raise WrongType("%s %r holds %s", role, to_display(key), detail)


def cuckoo_plan_for(
    backend: str,
    capacity: int,
    error_rate: float | None,
    expansion: int | None,
    nonscaling: bool,
    cuckoo: dict[str, Any],
    items: int | None,
    line: str | None,
) -> CuckooPlan:
    """The plan of a command's options (``cuckoo``: bucket_size, max_iterations, fingerprint_bits,
    each None for the default), for ``backend`` (``redisbloom-cuckoo`` or ``lua-cuckoo``) as the
    server ``line`` builds it."""
    chosen: CuckooBackend = LuaCuckoo() if backend == "lua-cuckoo" else RedisBloomCuckoo()
    the_plan = cuckoo_plan(
        capacity,
        bucket_size=cuckoo["bucket_size"] or DEFAULT_BUCKET_SIZE,
        max_iterations=cuckoo["max_iterations"] or DEFAULT_MAX_ITERATIONS,
        expansion=chosen.expansion_for(expansion, nonscaling),
        engine=LUA if backend == "lua-cuckoo" else REDISBLOOM,
        error_rate=error_rate,
        fingerprint_bits=cuckoo["fingerprint_bits"],
        items=items,
    )
    return for_cuckoo_line(the_plan, line)
