"""The RedisBloom backend: BF.* commands of the RedisBloom module (or Redis 8's built-in copy).

BF.SCANDUMP's first reply carries a packed little-endian header that is the only place the
server exposes each sub-filter's error rate, bit count and hash count; the later replies are
the raw bit arrays, chunked but never across sub-filters, which is what ``bit_fill`` popcounts
and what a dump carries; BF.LOADCHUNK takes them back, once their header is checked here.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from bloomctl.backends.base import AnyPlan, DumpMismatch, FilterState, SubFilterState
from bloomctl.backends.chunks import ChunkedBackend
from bloomctl.errors import KeyMissing, StateConflict, UnsupportedServer, UsageError, WrongType
from bloomctl.keys import to_display
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.sizing.bloom import Plan, SubFilter, for_line

OPT_NOROUND = 1  # bloom.h BLOOM_OPT_NOROUND: bits as computed, not rounded up to a power of two
OPT_FORCE64 = 4  # BLOOM_OPT_FORCE64: 64-bit hashing (every filter RedisBloom creates)
OPT_NO_SCALING = 8

_HEADER = struct.Struct("<QIII")  # items, nfilters, options, growth
_LINK = struct.Struct("<QQQddIQB")  # bytes, bits, items, error, bpe, hashes, capacity, n2


def parse_scandump_header(blob: bytes) -> tuple[int, int, int, list[SubFilterState]]:
    """Decode the header of ``BF.SCANDUMP key 0`` into (items, options, growth, sub-filters)."""
    if len(blob) < _HEADER.size:
        raise ValueError(f"SCANDUMP header too short ({len(blob)} bytes)")
    items, nfilters, options, growth = _HEADER.unpack_from(blob, 0)
    expected = _HEADER.size + nfilters * _LINK.size
    if len(blob) != expected:
        raise ValueError(f"SCANDUMP header is {len(blob)} bytes, expected {expected} for {nfilters} sub-filters")
    subs = []
    for index in range(nfilters):
        nbytes, bits, sub_items, error, _bpe, hashes, capacity, _n2 = _LINK.unpack_from(
            blob, _HEADER.size + index * _LINK.size
        )
        subs.append(SubFilterState(index, capacity, sub_items, error, hashes, bits, nbytes))
    return items, options, growth, subs


def _bf_error(exc: Exception, key: bytes) -> Exception:
    text = str(exc)
    name = to_display(key)
    if "not found" in text:
        return KeyMissing("no filter at key %r", name)
    if text.startswith("WRONGTYPE"):
        return WrongType("key %r is not a RedisBloom filter", name)
    if "item exists" in text:
        return StateConflict("key %r already exists", name)
    if text.startswith("ERR bad ") or "must be" in text:  # ERR bad capacity / error rate / expansion
        return UsageError("the server refused the arguments: %s", text.removeprefix("ERR "))
    if "unknown command" in text.lower():
        return UnsupportedServer("the server does not know this command: %s", text)
    return exc


def _info_int(value: Any) -> int | None:
    """One BF.INFO number: RedisBloom answers ``BF.INFO key FIELD`` with a one-element array, some
    compatible servers with a bare integer, and redis-py may have parsed it into a dict."""
    if isinstance(value, dict):
        value = next(iter(value.values()), None)
    if isinstance(value, list):
        value = value[0] if value else None
    return None if value is None else int(value)


def header_problems(blob: bytes, member: dict[str, Any]) -> list[str]:
    """What makes a dumped filter's header chunk other than the filter ``member`` describes, every
    sub-filter sized and hashed as RedisBloom's ``bloom_init`` does: BF.LOADCHUNK takes some headers
    it should not, as its own checks let through 32-bit hashing, a zero growth, and any byte count."""
    try:
        items, options, growth, subs = parse_scandump_header(blob)
    except ValueError as exc:
        raise DumpMismatch(f"the filter's header chunk is corrupt ({exc})") from None
    problems = []
    if not options & OPT_FORCE64:  # every filter RedisBloom creates hashes with 64 bits
        problems.append("32-bit hashing")
    if options & ~(OPT_NOROUND | OPT_FORCE64 | OPT_NO_SCALING):
        problems.append(f"options {options:#x}")
    if not options & OPT_NO_SCALING and growth < 1:
        problems.append(f"growth {growth}")
    if len(subs) != member["filters"] or items < member["items"]:
        problems.append(
            f"{len(subs)} sub-filters and {items} items, the dump's header says {member['filters']} and {member['items']}"
        )
    problems += _scaling_problems(options, growth, member)
    problems += _chain_problems(subs, growth, member)
    # each sub-filter's n2: the power of two its positions are taken modulo, when it is not zero
    n2s = [_LINK.unpack_from(blob, _HEADER.size + sub.index * _LINK.size)[7] for sub in subs]
    for sub, n2 in zip(subs, n2s, strict=True):
        if not 0 < sub.error_rate < 1 or sub.capacity < 1:
            problems.append(f"sub-filter {sub.index}: capacity {sub.capacity}, error {sub.error_rate!r}")
            break
        sized = SubFilter.sized(sub.index, sub.capacity, sub.error_rate)
        if options & OPT_NOROUND:  # (a non-zero n2 makes RedisBloom take positions modulo 2**n2, not bits)
            bits_ok = sub.bits == sized.bits and n2 == 0
        else:  # older filters round up to a power of two: the bits RedisBloom's entries came from
            bits_ok = sub.bits >= 64 and sub.bits & (sub.bits - 1) == 0 and sub.bits == 1 << n2
        if not bits_ok or sub.hashes != sized.hashes or sub.bytes * 8 != sub.bits:
            problems.append(
                f"sub-filter {sub.index} has {sub.bits} bits, {sub.hashes} hashes and n2 {n2} for capacity "
                f"{sub.capacity}, error {sub.error_rate:g}"
            )
            break
    if 32 + 64 * len(subs) + sum(sub.bytes for sub in subs) != member["size_bytes"]:
        problems.append("its size does not add up")
    return problems


def _scaling_problems(options: int, growth: int, member: dict[str, Any]) -> list[str]:
    """Whether the chain grows, and by how much, as the dump's header says: a forged growth of 1000
    makes the next sub-filter a thousand times the size."""
    expansion = member.get("expansion")
    if expansion is None:
        return [] if options & OPT_NO_SCALING else ["a growing chain, where the dump's header says it never grows"]
    if options & OPT_NO_SCALING or growth != expansion:
        return [f"growth {'none' if options & OPT_NO_SCALING else growth}, the dump's header says {expansion}"]
    return []


def _chain_problems(subs: list[SubFilterState], growth: int, member: dict[str, Any]) -> list[str]:
    """Each sub-filter's capacity and error rate as the dump's header lists them, and as RedisBloom
    chains them (each new one ``growth`` times the capacity, half the error rate, of the last):
    other numbers give the same bits other hashes, and every item is looked up elsewhere."""
    rates = member.get("error_rates")
    capacity = member.get("capacity")
    for sub in subs:
        if sub.index:
            last = subs[sub.index - 1]
            capacity, expected_rate = last.capacity * growth, last.error_rate * 0.5
        else:
            expected_rate = sub.error_rate
        listed = rates[sub.index] if isinstance(rates, list) and sub.index < len(rates) else None
        if sub.capacity != capacity or sub.error_rate != expected_rate or sub.error_rate != listed:
            return [
                f"sub-filter {sub.index} has capacity {sub.capacity:,} and error {sub.error_rate!r}, the dump's "
                f"header says {capacity!r} and {listed!r}"
            ]
    return []


class RedisBloom(ChunkedBackend):
    name = "redisbloom"
    redis_type = b"MBbloom--"
    dump_command = "BF.SCANDUMP"
    load_command = "BF.LOADCHUNK"
    made_by_plain_add = True  # BF.ADD on a missing key: capacity 100, error rate 1%, or CONFIG bf-*
    command_group = "bf"

    def scannable_on(self, server: ServerInfo) -> bool:
        return server.has_bloom

    def call(self, client: RedisClient, key: bytes, *args: Any) -> Any:
        import redis

        try:
            return client.execute_command(*args)
        except redis.exceptions.ResponseError as exc:
            raise _bf_error(exc, key) from None

    def check_plan(self, plan: AnyPlan, line: str | None = None) -> Plan:
        """Redis 8 takes an error rate above 0.25 as 0.25 and refuses a capacity above 2**30."""
        plan = self.bloom_plan(plan)
        return for_line(plan, line) if line in ("redis8", "redisbloom2") else plan

    def size_bytes(self, plan: AnyPlan) -> int:
        plan = self.bloom_plan(plan)
        return plan.size_bytes

    def owns(self, client: RedisClient, key: bytes, kind: bytes) -> bool:
        return kind == self.redis_type

    def reserve(self, client: RedisClient, key: bytes, plan: AnyPlan) -> None:
        self.call(client, key, *self.reserve_command(key, plan))

    def reserve_command(self, key: bytes, plan: AnyPlan) -> tuple[Any, ...]:
        """BF.RESERVE of ``plan``, with its EXPANSION or NONSCALING."""
        plan = self.bloom_plan(plan)
        args: list[Any] = ["BF.RESERVE", key, repr(plan.error_rate), plan.capacity]
        args += ["EXPANSION", plan.expansion] if plan.scaling else ["NONSCALING"]
        return tuple(args)

    def reserved_error_rate(self, member: dict[str, Any]) -> float:
        """RedisBloom builds a scaling filter's first sub-filter for half the rate it was given."""
        first: float = member["error_rates"][0]
        return first * 2 if member["expansion"] is not None else first

    def check_first_chunk(self, data: bytes, member: dict[str, Any]) -> int | None:
        problems = header_problems(data, member)
        if problems:
            raise DumpMismatch(f"the filter's header chunk is inconsistent: {'; '.join(problems)}")
        return None

    def info_field(self, client: RedisClient, key: bytes, name: str) -> int | None:
        """``BF.INFO key CAPACITY|SIZE|FILTERS|ITEMS|EXPANSION`` as an int (None for a NONSCALING expansion)."""
        return _info_int(self.call(client, key, "BF.INFO", key, name.upper()))

    def info(self, client: RedisClient, key: bytes, *, with_header: bool = True) -> FilterState:
        """BF.INFO, and the SCANDUMP header for the per-sub-filter numbers when the server has it."""
        raw = self.call(client, key, "BF.INFO", key)
        if isinstance(raw, dict):
            fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}
        else:
            fields = {
                (raw[i].decode() if isinstance(raw[i], bytes) else raw[i]): raw[i + 1] for i in range(0, len(raw), 2)
            }
        state = FilterState(
            backend=self.name,
            capacity=_info_int(fields["Capacity"]) or 0,
            size_bytes=_info_int(fields["Size"]) or 0,
            filters=_info_int(fields["Number of filters"]) or 0,
            items=_info_int(fields["Number of items inserted"]) or 0,
            expansion=_info_int(fields.get("Expansion rate")),
        )
        if not with_header:
            return state
        try:
            _iter, blob = self.call(client, key, "BF.SCANDUMP", key, 0)
        except UnsupportedServer:
            return state
        _items, options, _growth, subs = parse_scandump_header(blob)
        if options & OPT_NO_SCALING:
            state = replace(state, expansion=None)
        return replace(state, subfilters=tuple(subs))

    def bit_fill(self, client: RedisClient, key: bytes) -> FilterState:
        """Stream BF.SCANDUMP and popcount every chunk: the true bit fill of each sub-filter.

        Memory stays at one chunk (at most 16 MiB) whatever the filter's size. Chunks never span
        sub-filters, so each is attributed by the running byte offset.
        """
        state = self.info(client, key)
        if not state.subfilters:
            raise UnsupportedServer("this server has no BF.SCANDUMP, which `exact` needs")
        counts = [0] * len(state.subfilters)
        ends = []
        total = 0
        for sub in state.subfilters:
            total += sub.bytes
            ends.append(total)
        offset, current, cursor = 0, 0, 1
        while True:
            cursor, chunk = self.call(client, key, "BF.SCANDUMP", key, cursor)
            if cursor == 0:
                break
            while current < len(ends) and offset >= ends[current]:
                current += 1
            if current >= len(ends) or offset + len(chunk) > ends[current]:
                raise StateConflict("filter %r changed shape during the scan; run again", to_display(key))
            counts[current] += int.from_bytes(chunk, "little").bit_count()
            offset += len(chunk)
        if offset != total:
            raise StateConflict(
                "filter %r scan returned %s bytes, expected %s; run again", to_display(key), offset, total
            )
        subs = tuple(replace(sub, bits_set=count) for sub, count in zip(state.subfilters, counts, strict=True))
        return replace(state, subfilters=subs)

    def card(self, client: RedisClient, key: bytes) -> int:
        try:
            return int(self.call(client, key, "BF.CARD", key))
        except UnsupportedServer:  # RedisBloom before 2.4.4: the (equal) BF.INFO count
            return self.info(client, key, with_header=False).items

    def madd_command(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> tuple[Any, ...]:
        # BF.INSERT NOCREATE, not BF.MADD: an add must never create a filter with default parameters
        # (capacity 100) where one vanished (a replaced standby, a standby not created yet).
        return ("BF.INSERT", key, "NOCREATE", "ITEMS", *items)

    def mexists_command(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> tuple[Any, ...]:
        return ("BF.MEXISTS", key, *items)

    def madd(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        """Add items; a NONSCALING filter that is full stops BF.INSERT at that item (the reply then
        ends in an error): raised, with how many went in, rather than read as "seen before"."""
        if not items:
            return []
        reply = list(self.call(client, key, *self.madd_command(client, key, items)))
        error = next((flag for flag in reply if isinstance(flag, Exception)), None)
        if error is not None or len(reply) != len(items):
            raise StateConflict(
                "adding to %r stopped after %s of %s items (%s): the filter reached its capacity",
                to_display(key),
                f"{sum(1 for flag in reply if not isinstance(flag, Exception)):,}",
                f"{len(items):,}",
                str(error) if error is not None else "a short reply",
            )
        return self.parse_flags(reply)

    def mexists(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        if not items:
            return []
        return self.parse_flags(self.call(client, key, *self.mexists_command(client, key, items)))
