"""Backends: the commands that create, read and fill one Bloom filter on the server.

The lifecycle (reserve, info, fill-ratio, swap, ...) talks only to this seam. Two backends
implement it: ``redisbloom`` (the BF.* commands) and ``bitmap`` (a plain string hashed by
server-side Lua, for servers without modules). Every method takes the redis-py client
explicitly (standalone or cluster). This module is the registry: it picks a backend for a new
filter and recognises an existing key's backend from the key itself.
"""

from __future__ import annotations

from bloomctl.backends.base import Backend, FilterState, SubFilterState
from bloomctl.backends.bitmap import Bitmap
from bloomctl.backends.redisbloom import RedisBloom
from bloomctl.client import RedisClient
from bloomctl.defaults import AUTO
from bloomctl.errors import KeyMissing, UsageError, WrongType
from bloomctl.keys import to_display
from bloomctl.server import ServerInfo

__all__ = ["AUTO", "Backend", "FilterState", "SubFilterState", "choose", "for_key", "get", "key_type", "names"]

_BACKENDS: dict[str, Backend] = {"redisbloom": RedisBloom(), "bitmap": Bitmap()}


def get(name: str) -> Backend:
    """The backend called ``name`` (``redisbloom`` or ``bitmap``)."""
    try:
        return _BACKENDS[name]
    except KeyError:
        raise UsageError("unknown backend %r: choose auto, redisbloom or bitmap", name) from None


def names() -> list[str]:
    return list(_BACKENDS)


def choose(server: ServerInfo, requested: str = AUTO) -> Backend:
    """The backend for a new filter: RedisBloom where the server has BF.*, else the bitmap one."""
    if requested == AUTO:
        return get("redisbloom" if server.has_bloom else "bitmap")
    if requested == "redisbloom":
        server.require_bloom()
    return get(requested)


TYPE_NAMES = {
    b"string": "a string",
    b"hash": "a hash",
    b"list": "a list",
    b"set": "a set",
    b"zset": "a sorted set",
    b"stream": "a stream",
    b"MBbloomCF": "a cuckoo filter",
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
