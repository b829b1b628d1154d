"""The bitmap backend: a Bloom filter in one plain Redis string, hashed by server-side Lua.

For servers without RedisBloom (Redis OSS, managed services that refuse modules). The filter
is a 64-byte header followed by the bit array (layout in ``bitmap.lua`` and the README), so one
RENAME moves everything. Hashing runs on the server, in a Redis Functions library (Redis 7+)
or, on older servers, the same Lua code through EVALSHA: any client in any language that can
send FCALL gets the same answers.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from bloomctl.backends.base import AnyPlan, DumpMismatch, FilterState, SubFilterState
from bloomctl.backends.library import (  # noqa: F401 (their names here too: the library began as this backend's)
    FUNCTIONS,
    HANDLERS,
    LIBRARY_NAME,
    LIBRARY_VERSION,
    SCRIPT,
    LuaBackend,
    functions_source,
    installs_nothing,
    library_source,
    script_source,
)
from bloomctl.backends.strings import StringBackend
from bloomctl.defaults import BITMAP_BATCH_SIZE
from bloomctl.errors import KeyMissing, StateConflict, UnsupportedServer, UsageError, WrongType
from bloomctl.keys import to_display
from bloomctl.server.client import RedisClient
from bloomctl.sizing.bloom import Plan
from bloomctl.sizing.bloom import plan as make_plan

FORMAT_VERSION = 1
MAGIC = b"bloomctl"
HEADER_BYTES = 64
HEADER = struct.Struct(">8sBBHIQQdq")  # magic, format, scheme, 0, k, m, capacity, error rate, items
MAX_STRING_BYTES = 512 * 1024 * 1024
LARGE_RESERVE = 16 << 20  # a filter above this is sent whole rather than zeroed by the server
MAX_BITS = (MAX_STRING_BYTES - HEADER_BYTES) * 8


def positions(item: bytes | str, bits: int, hashes: int) -> list[int]:
    """The bit positions of ``item``: the reference for the Lua code and for other languages."""
    data = item.encode() if isinstance(item, str) else item
    digest = hashlib.sha1(data).hexdigest()
    h1, h2 = int(digest[:12], 16), int(digest[12:24], 16)
    pos, step = h1 % bits, h2 % bits or 1
    out = []
    for _ in range(hashes):
        out.append(pos)
        pos = (pos + step) % bits
    return out


def parse_header(blob: bytes) -> dict[str, Any] | None:
    if len(blob) < HEADER_BYTES or not blob.startswith(MAGIC):
        return None
    _magic, fmt, scheme, _pad, k, m, capacity, error_rate, items = HEADER.unpack_from(blob)
    return {
        "format": fmt,
        "scheme": scheme,
        "hashes": k,
        "bits": m,
        "capacity": capacity,
        "error_rate": error_rate,
        "items": items,
    }


def recognise(head: bytes, length: int) -> bool:
    """Whether a string's first 64 bytes and length are those of a bitmap filter (of any format)."""
    header = parse_header(head)
    return (
        header is not None
        and header["hashes"] > 0
        and header["bits"] > 0
        and header["bits"] % 64 == 0
        and length == HEADER_BYTES + header["bits"] // 8
    )


def _error(exc: Exception, key: bytes) -> Exception:
    text = str(exc)
    name = to_display(key)
    if "not found" in text and "unction" not in text:
        return KeyMissing("no filter at key %r", name)
    if text.startswith("WRONGTYPE") or "WRONGTYPE" in text:
        return WrongType("key %r is not a bloomctl bitmap filter", name)
    if "item exists" in text:
        return StateConflict("key %r already exists", name)
    if "exceeds the 512 MB" in text:
        return UsageError(text.removeprefix("ERR "))
    if "filter format" in text:
        return UnsupportedServer("key %r: %s (a newer bloomctl wrote it)", name, text.removeprefix("ERR "))
    return exc


class TooLarge(UsageError):
    """A bitmap filter past Redis's 512 MB string limit (a reserve says how many shards would do)."""


class Bitmap(StringBackend):
    name = "bitmap"
    magic = MAGIC
    command_group = "bitmap"
    overfills = True  # a full bitmap filter takes more items, answering "maybe" for ever more absent ones
    batch_size = BITMAP_BATCH_SIZE
    translate_error = staticmethod(_error)

    # --- the Backend interface -------------------------------------------------------------

    def check_plan(self, plan: AnyPlan, line: str | None = None) -> Plan:
        plan = self.bloom_plan(plan)
        if plan.scaling:
            raise UsageError("bitmap filters do not grow: use `nonscaling` (or leave `expansion` out)")
        if plan.first.bits > MAX_BITS:
            raise TooLarge(
                "%s bytes of bits exceed Redis's 512 MB string limit: lower `capacity` or raise `error_rate`, or split the set over several filters (shards)",
                f"{plan.first.bytes:,}",
            )
        return plan

    def reserve(self, client: RedisClient, key: bytes, plan: AnyPlan) -> None:
        """Create the empty filter. A large one arrives whole from the client (SET ... NX): the
        server reads a big value in the background and stores it without copying, where zeroing
        it would block (91 ms for 228 MB, measured); the function library makes small ones."""
        plan = self.check_plan(plan)
        if HEADER_BYTES + plan.first.bytes <= LARGE_RESERVE:
            self.call(client, "reserve", key, plan.first.bits, plan.first.hashes, plan.capacity, repr(plan.error_rate))
            return
        head = HEADER.pack(
            MAGIC, FORMAT_VERSION, 1, 0, plan.first.hashes, plan.first.bits, plan.capacity, plan.error_rate, 0
        )
        value = head.ljust(HEADER_BYTES, b"\0") + bytes(plan.first.bytes)
        if not client.set(key, value, nx=True):
            raise StateConflict("key %r already exists", to_display(key))

    def size_bytes(self, plan: AnyPlan) -> int:
        plan = self.bloom_plan(plan)
        return HEADER_BYTES + plan.first.bytes

    def recognise(self, head: bytes, length: int) -> bool:
        return recognise(head, length)

    def check_first_chunk(self, data: bytes, member: dict[str, Any]) -> int | None:
        head = parse_header(data[:HEADER_BYTES])
        if head is None or HEADER_BYTES + head["bits"] // 8 != int(member["size_bytes"]) or head["bits"] % 64:
            raise self.not_the_header()
        # The string's own parameters are those the dump's header lists, and its bits and hashes are
        # what they give: a k one higher looks every item up at one more position, most of them unset.
        rates = member.get("error_rates") or [None]
        try:
            sized = make_plan(head["capacity"], head["error_rate"], None).first
        except (UsageError, ValueError, OverflowError):
            sized = None
        if (
            (head["format"], head["scheme"]) != (FORMAT_VERSION, 1)
            or head["capacity"] != member["capacity"]
            or not math.isclose(head["error_rate"], rates[0] or -1.0, rel_tol=1e-9)
            or sized is None
            or (head["bits"], head["hashes"]) != (sized.bits, sized.hashes)
        ):
            raise DumpMismatch(
                f"the filter's header is inconsistent: {head['bits']} bits and {head['hashes']} hashes for capacity "
                f"{head['capacity']:,} and error rate {head['error_rate']!r} (format {head['format']}, scheme "
                f"{head['scheme']}); the dump's header says capacity {member['capacity']!r}, error rate {rates[0]!r}"
            )
        return None

    def info(self, client: RedisClient, key: bytes, *, with_header: bool = True) -> FilterState:
        raw = self.call(client, "info", key, read_only=True)
        fields = {(raw[i].decode() if isinstance(raw[i], bytes) else raw[i]): raw[i + 1] for i in range(0, len(raw), 2)}
        capacity, items = int(fields["Capacity"]), int(fields["Number of items inserted"])
        bits = int(fields["Bits"])
        error_rate = float(fields["Error rate"])
        sub = SubFilterState(0, capacity, items, error_rate, int(fields["Hashes"]), bits, bits // 8)
        return FilterState(self.name, capacity, int(fields["Size"]), 1, items, None, (sub,))

    def bit_fill(self, client: RedisClient, key: bytes) -> FilterState:
        state = self.info(client, key)
        bits_set = int(self.call(client, "bitcount", key, read_only=True))
        return replace(state, subfilters=(replace(state.subfilters[0], bits_set=bits_set),))

    def card(self, client: RedisClient, key: bytes) -> int:
        return int(self.call(client, "card", key, read_only=True))

    def madd_command(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> tuple[Any, ...]:
        return self.command(client, "madd", key, *items)

    def mexists_command(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> tuple[Any, ...]:
        return self.command(client, "mexists", key, *items, read_only=True)

    def madd(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        if not items:
            return []
        return self.parse_flags(self.call(client, "madd", key, *items))

    def mexists(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        if not items:
            return []
        return self.parse_flags(self.call(client, "mexists", key, *items, read_only=True))
