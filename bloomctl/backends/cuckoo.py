"""The cuckoo filter backends: RedisBloom's CF.* commands, and a module-free one in the function library.

A cuckoo filter stores a fingerprint of each item in one of two buckets, so an item can be
deleted again. Both backends answer the same questions (``CuckooState``); the module-free one
(``cuckoo.lua``, layout and hash scheme documented there and in docs/cuckoo.md) keeps one
string, like the bitmap backend, with 8, 16 or 32-bit fingerprints, and never grows.

Adds are inserts of one copy per call (CF.INSERT, never CF.INSERTNX): an item added twice is
there twice, and deleting it once leaves one. A rebuild inserts each distinct source item once.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from bloomctl.backends.base import AnyPlan, Backend, CuckooState, FilterState, cuckoo_subs
from bloomctl.backends.library import LuaBackend
from bloomctl.errors import KeyMissing, StateConflict, UnsupportedServer, UsageError, WrongType
from bloomctl.keys import to_display
from bloomctl.server.client import RedisClient
from bloomctl.sizing.cuckoo import (
    CF_STRUCT_BYTES,
    DEFAULT_BUCKET_SIZE,
    DEFAULT_MAX_ITERATIONS,
    LUA,
    LUA_HEADER_BYTES,
    REDISBLOOM,
    SUBCF_STRUCT_BYTES,
    CuckooPlan,
    cuckoo_plan,
    for_cuckoo_line,
    next_power_of_two,
)

CF_HEADER = struct.Struct(
    "<QQQQHHH"
)  # RedisBloom's CFHeader: items, buckets, deletes, filters, bucket size, max iterations, expansion
LUA_MAGIC = b"bloomcuk"
LUA_FORMAT = 1
LUA_HEADER = struct.Struct(
    ">8sBBBBHHQQqqd"
)  # magic, format, scheme, fingerprint bytes, 0, bucket size, max iterations, buckets, capacity, items, deletes, error rate
LUA_BATCH_SIZE = 500  # items per FCALL bloomctl_cf_madd: relocations near full cost several reads each
SLICE = 1 << 20  # bytes per GETRANGE when counting a module-free filter's slots
LARGE_RESERVE = 16 << 20  # a larger module-free filter is sent whole rather than zeroed by the server


def _fields(raw: Any) -> dict[str, Any]:
    """CF.INFO (a flat list, or a dict with RESP3) as text keys."""
    if isinstance(raw, dict):
        return {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in raw.items()}
    return {(raw[i].decode() if isinstance(raw[i], bytes) else str(raw[i])): raw[i + 1] for i in range(0, len(raw), 2)}


def _cuckoo_plan(plan: Any, engine: str) -> CuckooPlan:
    if not isinstance(plan, CuckooPlan):
        raise UsageError("a cuckoo filter needs a cuckoo plan (`bucket_size`, `max_iterations`), not a Bloom filter's")
    if plan.engine != engine:
        raise UsageError("the plan is for the %s engine, this backend is %s", plan.engine, engine)
    return plan


def parse_cf_header(blob: bytes) -> dict[str, int]:
    """RedisBloom's CF.SCANDUMP header (38 bytes, packed little-endian)."""
    if len(blob) != CF_HEADER.size:
        raise ValueError(f"CF.SCANDUMP header is {len(blob)} bytes, expected {CF_HEADER.size}")
    items, buckets, deletes, filters, bucket_size, max_iterations, expansion = CF_HEADER.unpack(blob)
    return {
        "items": items,
        "buckets": buckets,
        "deletes": deletes,
        "filters": filters,
        "bucket_size": bucket_size,
        "max_iterations": max_iterations,
        "expansion": expansion,
    }


def cf_size_bytes(buckets: int, bucket_size: int, expansion: int, filters: int) -> int:
    """CF.INFO Size of a RedisBloom cuckoo filter with these numbers (``CFMemUsage``)."""
    slots = sum(sub.slots for sub in cuckoo_subs(buckets, bucket_size, expansion, filters))
    return CF_STRUCT_BYTES + SUBCF_STRUCT_BYTES * filters + slots


def _count_added(reply: Sequence[Any], expected: int) -> int | str:
    """CF.INSERT answers 1 (True with RESP3) per item inserted, -1 (False) where no slot was found."""
    added = reply.count(1)
    if len(reply) == expected and added == expected:
        return added
    errors = [flag for flag in reply if isinstance(flag, Exception)]
    if errors:
        return str(errors[0])
    if len(reply) != expected:
        return f"{len(reply)} results for a batch of {expected}"
    return f"the filter is full: no room for {expected - added:,} of {expected:,} items"


class CuckooBackend(Backend):
    """What both cuckoo backends share: adds that never create the filter, deletes, and the full check."""

    kind = "cuckoo"
    engine = REDISBLOOM
    # A batch's worst case is every insert relocating MAXITERATIONS times (a filter at its full load):
    # measured per item and per iteration (RedisBloom 2.8: 7.2 us an item at 500 iterations; the
    # module-free filter: 0.2 ms), so that even then one command stays near 20 ms.
    BUDGET_US = 20_000
    ITEM_US, ITERATION_US = 0.4, 0.015

    def batch_for(self, plan: AnyPlan) -> int:
        if not isinstance(plan, CuckooPlan):
            return self.batch_size
        worst = self.ITEM_US + plan.max_iterations * self.ITERATION_US
        return max(50, min(self.batch_size, int(self.BUDGET_US / worst)))

    def count_added(self, reply: Sequence[Any], expected: int) -> int | str:
        return _count_added(reply, expected)

    def madd(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        """Insert one copy of each item; a filter that has no room for one of them is an error
        (the others were inserted)."""
        if not items:
            return []
        reply = self.call_add(client, key, items)
        added = _count_added(list(reply), len(items))
        if isinstance(added, str):
            raise StateConflict(
                "the cuckoo filter %r has no room (%s): rebuild it with a larger `capacity`", to_display(key), added
            )
        return [True] * len(items)

    def call_add(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> Any:
        return client.execute_command(*self.madd_command(client, key, items))

    def expansion_for(self, expansion: int | None, nonscaling: bool, recorded: str | None = None) -> int | None:
        from bloomctl.sizing.cuckoo import DEFAULT_CUCKOO_EXPANSION, MAX_CUCKOO_EXPANSION

        if nonscaling and expansion is not None:
            raise UsageError("`expansion` and `nonscaling` exclude each other")
        if not self.grows:
            if expansion is not None:
                raise UsageError("%s filters do not grow: leave out `expansion`", self.name)
            return None
        if nonscaling:
            return None
        if expansion is not None:
            if not 1 <= expansion <= MAX_CUCKOO_EXPANSION:
                raise UsageError("`expansion` must be from 1 to %s, got %r", f"{MAX_CUCKOO_EXPANSION:,}", expansion)
            return expansion
        if recorded == "nonscaling":
            return None
        return int(recorded) if recorded else DEFAULT_CUCKOO_EXPANSION

    def mdelete(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        """Remove one copy of each item; False where its fingerprint was not there. Deleting an item
        that was never added can remove another item's fingerprint (a false negative)."""
        raise NotImplementedError

    def count(self, client: RedisClient, key: bytes, item: bytes | str) -> int:
        raise NotImplementedError


def _cf_error(exc: Exception, key: bytes) -> Exception:
    text = str(exc)
    name = to_display(key)
    if "not found" in text.lower() and "unction" not in text:
        return KeyMissing("no cuckoo filter at key %r", name)
    if text.startswith("WRONGTYPE"):
        return WrongType("key %r is not a RedisBloom cuckoo filter", name)
    if "item exists" in text:
        return StateConflict("key %r already exists", name)
    if "must be" in text or "Bad capacity" in text or "range" in text:
        return UsageError("the server refused the arguments: %s", text.removeprefix("ERR "))
    if "unknown command" in text.lower():
        return UnsupportedServer("the server has no cuckoo filter commands: %s", text)
    if "Maximum expansions" in text:
        return StateConflict(
            "the cuckoo filter %r has grown to its most sub-filters (%s): rebuild it with a larger `capacity`",
            name,
            text,
        )
    return exc


class RedisBloomCuckoo(CuckooBackend):
    """RedisBloom's cuckoo filters (CF.*), on Redis 8 and with the module."""

    name = "redisbloom-cuckoo"
    redis_type = b"MBbloomCF"
    engine = REDISBLOOM

    def call(self, client: RedisClient, key: bytes, *args: Any) -> Any:
        import redis

        try:
            return client.execute_command(*args)
        except redis.exceptions.ResponseError as exc:
            raise _cf_error(exc, key) from None

    def call_add(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> Any:
        return self.call(client, key, *self.madd_command(client, key, items))

    def check_plan(self, plan: AnyPlan, line: str | None = None) -> CuckooPlan:
        return for_cuckoo_line(_cuckoo_plan(plan, REDISBLOOM), line)

    def size_bytes(self, plan: AnyPlan) -> int:
        return int(plan.size_bytes)

    def owns(self, client: RedisClient, key: bytes, kind: bytes) -> bool:
        return kind == self.redis_type

    def reserve(self, client: RedisClient, key: bytes, plan: AnyPlan) -> None:
        p = _cuckoo_plan(plan, REDISBLOOM)
        self.call(
            client,
            key,
            "CF.RESERVE",
            key,
            p.capacity,
            "BUCKETSIZE",
            p.bucket_size,
            "MAXITERATIONS",
            p.max_iterations,
            "EXPANSION",
            p.expansion or 0,
        )

    def info(self, client: RedisClient, key: bytes, *, with_header: bool = True) -> FilterState:
        f = _fields(self.call(client, key, "CF.INFO", key))
        buckets, bucket_size = int(f["Number of buckets"]), int(f["Bucket size"])
        filters, growth = int(f["Number of filters"]), int(f["Expansion rate"])
        subs = cuckoo_subs(buckets, bucket_size, growth, filters)
        return CuckooState(
            backend=self.name,
            capacity=sum(sub.slots for sub in subs),
            size_bytes=int(f["Size"]),
            filters=filters,
            items=int(f["Number of items inserted"]),
            expansion=growth or None,
            buckets=buckets,
            bucket_size=bucket_size,
            max_iterations=int(f["Max iterations"]),
            deletes=int(f["Number of items deleted"]),
            fingerprint_bits=8,
            engine=REDISBLOOM,
            cuckoo_subs=subs,
        )

    def bit_fill(self, client: RedisClient, key: bytes) -> FilterState:
        """Count the slots that hold a fingerprint, per sub-filter, from CF.SCANDUMP's chunks (one
        chunk of at most 16 MiB in memory; chunks never span sub-filters)."""
        state = self.info(client, key)
        assert isinstance(state, CuckooState)
        subs = state.cuckoo_subs
        counts = [0] * len(subs)
        if state.items == 0:  # SCANDUMP answers (0, nil) at once for an empty filter
            return replace(state, cuckoo_subs=tuple(replace(s, occupied=0) for s in subs))
        ends, total = [], 0
        for sub in subs:
            total += sub.slots
            ends.append(total)
        cursor, header = self.call(client, key, "CF.SCANDUMP", key, 0)
        if parse_cf_header(header)["filters"] != len(subs):
            raise StateConflict("filter %r changed shape during the scan; run again", to_display(key))
        offset, current = 0, 0
        while True:
            cursor, chunk = self.call(client, key, "CF.SCANDUMP", key, cursor)
            if not cursor:
                break
            while current < len(ends) and offset >= ends[current]:
                current += 1
            if current >= len(ends) or offset + len(chunk) > ends[current]:
                raise StateConflict("filter %r changed shape during the scan; run again", to_display(key))
            counts[current] += len(chunk) - chunk.count(0)
            offset += len(chunk)
        if offset != total:
            raise StateConflict(
                "filter %r scan returned %s bytes, expected %s; run again", to_display(key), offset, total
            )
        return replace(state, cuckoo_subs=tuple(replace(s, occupied=n) for s, n in zip(subs, counts, strict=True)))

    def card(self, client: RedisClient, key: bytes) -> int:
        try:
            return self.info(client, key).items
        except KeyMissing:
            return 0

    def madd_command(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> tuple[Any, ...]:
        # NOCREATE: an add never creates a filter with the server's defaults where one vanished
        return ("CF.INSERT", key, "NOCREATE", "ITEMS", *items)

    def mexists_command(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> tuple[Any, ...]:
        return ("CF.MEXISTS", key, *items)

    def mexists(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        if not items:
            return []
        return self.parse_flags(self.call(client, key, *self.mexists_command(client, key, items)))

    def mdelete(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        if not items:
            return []
        import redis

        pipe = client.pipeline(transaction=False)
        for item in items:
            pipe.execute_command("CF.DEL", key, item)
        try:
            replies = pipe.execute()
        except redis.exceptions.ResponseError as exc:
            raise _cf_error(exc, key) from None
        return [reply == 1 for reply in replies]

    def count(self, client: RedisClient, key: bytes, item: bytes | str) -> int:
        return int(self.call(client, key, "CF.COUNT", key, item))


def parse_lua_header(blob: bytes) -> dict[str, Any] | None:
    if len(blob) < LUA_HEADER_BYTES or not blob.startswith(LUA_MAGIC):
        return None
    _magic, fmt, scheme, fpb, _pad, bs, mi, buckets, capacity, items, deletes, error_rate = LUA_HEADER.unpack_from(blob)
    return {
        "format": fmt,
        "scheme": scheme,
        "fingerprint_bits": fpb * 8,
        "bucket_size": bs,
        "max_iterations": mi,
        "buckets": buckets,
        "capacity": capacity,
        "items": items,
        "deletes": deletes,
        "error_rate": error_rate,
    }


def recognise_lua(head: bytes, length: int) -> bool:
    """Whether a string's first 64 bytes and length are those of a module-free cuckoo filter."""
    h = parse_lua_header(head)
    return (
        h is not None
        and h["fingerprint_bits"] in (8, 16, 32)
        and h["bucket_size"] >= 1
        and h["buckets"] >= 1
        and next_power_of_two(h["buckets"]) == h["buckets"]
        and length == LUA_HEADER_BYTES + h["buckets"] * h["bucket_size"] * h["fingerprint_bits"] // 8
    )


def lua_positions(item: bytes | str, buckets: int, fingerprint_bits: int) -> tuple[int, int, int]:
    """(fingerprint, first bucket, second bucket) of ``item`` in a module-free cuckoo filter: the
    reference for the Lua code and for other languages."""
    import hashlib

    data = item.encode() if isinstance(item, str) else item
    digest = hashlib.sha1(data).hexdigest()
    h = int(digest[:12], 16)
    fp = int(digest[12:20], 16) % ((1 << fingerprint_bits) - 1) + 1
    i1 = h % buckets
    return fp, i1, i1 ^ ((fp * 0x5BD1E995) % (1 << 32) % buckets)


def _lua_error(exc: Exception, key: bytes) -> Exception:
    text = str(exc)
    name = to_display(key)
    if "not found" in text and "unction" not in text:
        return KeyMissing("no cuckoo filter at key %r", name)
    if "WRONGTYPE" in text:
        return WrongType("key %r is not a bloomctl cuckoo filter", name)
    if "item exists" in text:
        return StateConflict("key %r already exists", name)
    if "exceeds the 512 MB" in text:
        return UsageError(text.removeprefix("ERR "))
    if "filter format" in text:
        return UnsupportedServer("key %r: %s (a newer bloomctl wrote it)", name, text.removeprefix("ERR "))
    return exc


def translate_cuckoo_error(exc: Exception, key: bytes) -> Exception:
    """A server error from a cuckoo operation of either backend as the library's typed error."""
    import redis

    if not isinstance(exc, redis.exceptions.ResponseError):
        return exc
    text = str(exc)
    if "WRONGTYPE" in text:
        return WrongType("key %r is not a cuckoo filter", to_display(key))
    return _cf_error(exc, key)


class LuaCuckoo(LuaBackend, CuckooBackend):
    """The module-free cuckoo filter: one string, the function library's ``cf_*`` operations."""

    name = "lua-cuckoo"
    redis_type = b"string"
    magic = LUA_MAGIC
    grows = False
    engine = LUA
    batch_size = LUA_BATCH_SIZE
    ITEM_US, ITERATION_US = 8.0, 0.42
    translate_error = staticmethod(_lua_error)

    def call_add(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> Any:
        return self.call(client, "cf_madd", key, *items)

    def check_plan(self, plan: AnyPlan, line: str | None = None) -> CuckooPlan:
        return _cuckoo_plan(plan, LUA)

    def size_bytes(self, plan: AnyPlan) -> int:
        return int(plan.size_bytes)

    def reserve(self, client: RedisClient, key: bytes, plan: AnyPlan) -> None:
        p = _cuckoo_plan(plan, LUA)
        fpb = p.fingerprint_bits // 8
        rate = p.target_error_rate if p.target_error_rate is not None else p.error_rate
        if p.size_bytes <= LARGE_RESERVE:
            self.call(
                client, "cf_reserve", key, p.buckets, p.bucket_size, fpb, p.max_iterations, p.capacity, repr(rate)
            )
            return
        head = LUA_HEADER.pack(
            LUA_MAGIC, LUA_FORMAT, 1, fpb, 0, p.bucket_size, p.max_iterations, p.buckets, p.capacity, 0, 0, rate
        )
        if not client.set(key, head.ljust(LUA_HEADER_BYTES, b"\0") + bytes(p.size_bytes - LUA_HEADER_BYTES), nx=True):
            raise StateConflict("key %r already exists", to_display(key))

    def owns(self, client: RedisClient, key: bytes, kind: bytes) -> bool:
        return kind == self.redis_type and bool(self.select(client, [key]))

    def select(self, node: Any, keys: list[bytes]) -> list[bytes]:
        if not keys:
            return []
        pipe = node.pipeline(transaction=False)
        for key in keys:
            pipe.getrange(key, 0, LUA_HEADER_BYTES - 1)
            pipe.strlen(key)
        replies = pipe.execute()
        return [key for key, head, n in zip(keys, replies[::2], replies[1::2], strict=True) if recognise_lua(head, n)]

    def info(self, client: RedisClient, key: bytes, *, with_header: bool = True) -> FilterState:
        f = _fields(self.call(client, "cf_info", key, read_only=True))
        buckets, bucket_size = int(f["Number of buckets"]), int(f["Bucket size"])
        return CuckooState(
            backend=self.name,
            capacity=buckets * bucket_size,
            size_bytes=int(f["Size"]),
            filters=1,
            items=int(f["Number of items inserted"]),
            expansion=None,
            buckets=buckets,
            bucket_size=bucket_size,
            max_iterations=int(f["Max iterations"]),
            deletes=int(f["Number of items deleted"]),
            fingerprint_bits=int(f["Fingerprint bits"]),
            engine=LUA,
            cuckoo_subs=cuckoo_subs(buckets, bucket_size, 1, 1),
        )

    def bit_fill(self, client: RedisClient, key: bytes) -> FilterState:
        """Count the slots that hold a fingerprint, reading the string in 1 MiB slices."""
        state = self.info(client, key)
        assert isinstance(state, CuckooState)
        width = state.fingerprint_bits // 8
        size = LUA_HEADER_BYTES + state.capacity * width
        occupied = 0
        code = {1: "B", 2: "H", 4: "I"}[width]
        for offset in range(LUA_HEADER_BYTES, size, SLICE):
            data = client.getrange(key, offset, min(offset + SLICE, size) - 1)  # type: ignore[attr-defined]
            if len(data) != min(SLICE, size - offset):
                raise StateConflict("filter %r changed during the scan; run again", to_display(key))
            slots = array(code, data)  # (zero or not does not depend on the byte order)
            occupied += len(slots) - slots.count(0)
        return replace(state, cuckoo_subs=(replace(state.cuckoo_subs[0], occupied=occupied),))

    def card(self, client: RedisClient, key: bytes) -> int:
        try:
            return self.info(client, key).items
        except KeyMissing:
            return 0

    def madd_command(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> tuple[Any, ...]:
        return self.command(client, "cf_madd", key, *items)

    def mexists_command(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> tuple[Any, ...]:
        return self.command(client, "cf_mexists", key, *items, read_only=True)

    def mexists(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        if not items:
            return []
        return self.parse_flags(self.call(client, "cf_mexists", key, *items, read_only=True))

    def mdelete(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        if not items:
            return []
        return self.parse_flags(self.call(client, "cf_mdel", key, *items))

    def count(self, client: RedisClient, key: bytes, item: bytes | str) -> int:
        return int(self.call(client, "cf_count", key, item, read_only=True))


def plan_for(
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
