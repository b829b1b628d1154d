"""The module-free cuckoo filter: one string, the function library's ``cf_*`` operations.

The string (``cuckoo.lua``, layout and hash scheme documented there and in docs/cuckoo.md) opens
with a 64-byte header, like the bitmap backend's, and holds 8, 16 or 32-bit fingerprints; the
filter never grows. A dump reads it in slices; a restore checks the first slice's header against
the dump's and counts the fingerprints it loads against the items that header counts.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from bloomctl.backends.base import AnyPlan, CuckooState, DumpMismatch, FilterState, cuckoo_subs
from bloomctl.backends.cuckoo_base import CuckooBackend, engine_plan, info_fields
from bloomctl.backends.strings import SLICE, StringBackend
from bloomctl.errors import KeyMissing, StateConflict, UnsupportedServer, UsageError, WrongType
from bloomctl.keys import to_display
from bloomctl.server.client import RedisClient
from bloomctl.sizing.cuckoo import LUA, LUA_HEADER_BYTES, CuckooPlan, next_power_of_two

LUA_MAGIC = b"bloomcuk"
LUA_FORMAT = 1
LUA_HEADER = struct.Struct(
    ">8sBBBBHHQQqqd"
)  # magic, format, scheme, fingerprint bytes, 0, bucket size, max iterations, buckets, capacity, items, deletes, error rate
LUA_BATCH_SIZE = 500  # items per FCALL bloomctl_cf_madd: relocations near full cost several reads each
LARGE_RESERVE = 16 << 20  # a larger module-free filter is sent whole rather than zeroed by the server
SLOT_CODES = {1: "B", 2: "H", 4: "I"}  # array type codes of a fingerprint's width in bytes


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


def _lua_matches(blob: bytes, member: dict[str, Any]) -> bool:
    """The module-free filter's own header is the one the dump describes (format, layout, counts)."""
    head = parse_lua_header(blob[:LUA_HEADER_BYTES])
    if head is None or (head["format"], head["scheme"]) != (1, 1):
        return False
    described = (member["buckets"], member["bucket_size"], member["fingerprint_bits"], member["max_iterations"])
    slots = head["buckets"] * head["bucket_size"]
    return (head["buckets"], head["bucket_size"], head["fingerprint_bits"], head["max_iterations"]) == described and (
        0 <= head["items"] <= slots and head["deletes"] >= 0
    )


def _taken_slots(data: bytes, offset: int, width: int) -> int:
    """Slots that hold a fingerprint in a slice of the string starting at ``offset``: its first 64
    bytes are the header, and slices are whole slots after it."""
    body = data[max(LUA_HEADER_BYTES - offset, 0) :]
    if len(body) % width:
        raise DumpMismatch("a slice of the cuckoo filter does not end on a slot")
    slots = array(SLOT_CODES[width], body)
    return len(slots) - slots.count(0)


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


class LuaCuckoo(StringBackend, CuckooBackend):
    """The module-free cuckoo filter: one string, the function library's ``cf_*`` operations."""

    name = "lua-cuckoo"
    magic = LUA_MAGIC
    engine = LUA
    command_group = "bitmap"  # the function library's commands, as the bitmap backend's
    batch_size = LUA_BATCH_SIZE
    ITEM_US, ITERATION_US = 8.0, 0.42
    translate_error = staticmethod(_lua_error)

    def call_add(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[int | Exception]:
        return self.call(client, "cf_madd", key, *items)

    def check_plan(self, plan: AnyPlan, line: str | None = None) -> CuckooPlan:
        return engine_plan(plan, LUA)

    def size_bytes(self, plan: AnyPlan) -> int:
        return int(plan.size_bytes)

    def reserve(self, client: RedisClient, key: bytes, plan: AnyPlan) -> None:
        p = engine_plan(plan, LUA)
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

    def recognise(self, head: bytes, length: int) -> bool:
        return recognise_lua(head, length)

    def info(self, client: RedisClient, key: bytes, *, with_header: bool = True) -> FilterState:
        f = info_fields(self.call(client, "cf_info", key, read_only=True))
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
        code = SLOT_CODES[width]
        for offset in range(LUA_HEADER_BYTES, size, SLICE):
            data = client.getrange(key, offset, min(offset + SLICE, size) - 1)  # type: ignore[attr-defined]
            if len(data) != min(SLICE, size - offset):
                raise StateConflict("filter %r changed during the scan; run again", to_display(key))
            slots = array(code, data)  # whether a slot is zero does not depend on the byte order
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

    # --- dump and restore --------------------------------------------------------------------

    def dumped_fingerprint_bits(self, member: dict[str, Any]) -> int | None:
        return int(member["fingerprint_bits"])

    def check_first_chunk(self, data: bytes, member: dict[str, Any]) -> int | None:
        if not (recognise_lua(data[:LUA_HEADER_BYTES], int(member["size_bytes"])) and _lua_matches(data, member)):
            raise self.not_the_header()
        head = parse_lua_header(data[:LUA_HEADER_BYTES])
        assert head is not None
        return int(head["items"])

    def fingerprints_in(self, data: bytes, offset: int, member: dict[str, Any]) -> int:
        return _taken_slots(data, offset, int(member["fingerprint_bits"]) // 8)
