"""RedisBloom's cuckoo filters: the CF.* commands, on Redis 8 and with the module.

CF.SCANDUMP answers a 38-byte header (``CF_HEADER``), then the sub-filters' slots in chunks that
never span sub-filters: ``bit_fill`` counts the taken slots in them, a dump carries them, and a
restore loads them back with CF.LOADCHUNK once their header is checked here. An empty filter has
no chunks at all: its restore reserves it anew.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from bloomctl.backends.base import AnyPlan, CuckooState, DumpMismatch, FilterState, cuckoo_subs
from bloomctl.backends.chunks import ChunkedBackend
from bloomctl.backends.cuckoo_base import CuckooBackend, engine_plan, info_fields
from bloomctl.errors import KeyMissing, StateConflict, UnsupportedServer, UsageError, WrongType
from bloomctl.keys import to_display
from bloomctl.server.client import RedisClient
from bloomctl.sizing.cuckoo import (
    CF_STRUCT_BYTES,
    REDISBLOOM,
    SUBCF_STRUCT_BYTES,
    CuckooPlan,
    for_cuckoo_line,
    next_power_of_two,
)

CF_HEADER = struct.Struct(
    "<QQQQHHH"
)  # RedisBloom's CFHeader: items, buckets, deletes, filters, bucket size, max iterations, expansion


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


def header_problems(blob: bytes, member: dict[str, Any]) -> list[str]:
    """What makes a dumped filter's CF.LOADCHUNK header other than the filter ``member`` describes
    (its buckets, bucket size, MAXITERATIONS, expansion and sub-filters), sized as
    CuckooFilter_Init and Grow size them."""
    try:
        head = parse_cf_header(blob)
    except ValueError as exc:
        raise DumpMismatch(f"the filter's header chunk is corrupt ({exc})") from None
    expansion = head["expansion"]
    problems = []
    if head["buckets"] < 1 or next_power_of_two(head["buckets"]) != head["buckets"]:
        problems.append(f"{head['buckets']} buckets (not a power of two)")
    if expansion and next_power_of_two(expansion) != expansion:
        problems.append(f"expansion {expansion} (not a power of two)")
    if not 1 <= head["filters"] <= 65535 or (expansion == 0 and head["filters"] > 1):
        problems.append(f"{head['filters']} sub-filters with expansion {expansion}")
    described = (member["buckets"], member["bucket_size"], member["max_iterations"], member["filters"])
    if (head["buckets"], head["bucket_size"], head["max_iterations"], head["filters"]) != described:
        problems.append(
            f"buckets, bucket size, max iterations and sub-filters {head['buckets']}, {head['bucket_size']}, "
            f"{head['max_iterations']}, {head['filters']}; the dump's header says {', '.join(map(str, described))}"
        )
    slots = (
        sum(sub.slots for sub in cuckoo_subs(head["buckets"], head["bucket_size"], expansion, head["filters"]))
        if not problems
        else 0
    )
    if (member["expansion"] or 0) != expansion:
        problems.append(f"expansion {expansion}")
    elif not 0 <= head["items"] <= slots or head["items"] != member["items"]:
        problems.append(f"{head['items']:,} items (the dump's header says {member['items']:,}, in {slots:,} slots)")
    elif (
        not problems
        and cf_size_bytes(head["buckets"], head["bucket_size"], expansion, head["filters"]) != member["size_bytes"]
    ):
        problems.append("its size does not add up")
    return problems


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


def translate_cuckoo_error(exc: Exception, key: bytes) -> Exception:
    """A server error from a cuckoo operation of either backend as the library's typed error."""
    import redis

    if not isinstance(exc, redis.exceptions.ResponseError):
        return exc
    text = str(exc)
    if "WRONGTYPE" in text:
        return WrongType("key %r is not a cuckoo filter", to_display(key))
    return _cf_error(exc, key)


class RedisBloomCuckoo(ChunkedBackend, CuckooBackend):
    """RedisBloom's cuckoo filters (CF.*), on Redis 8 and with the module."""

    name = "redisbloom-cuckoo"
    redis_type = b"MBbloomCF"
    engine = REDISBLOOM
    dump_command = "CF.SCANDUMP"
    load_command = "CF.LOADCHUNK"
    needs_library = True  # the application's writes during a rebuild go through the library's cf_dual
    made_by_plain_add = True  # CF.ADD on a missing key
    command_group = "cf"
    # RedisBloom compacts a grown cuckoo filter after deletes (fingerprints move into earlier
    # sub-filters, maybe parts already read) and resets its deletion count: an add and a delete
    # then leave CF.INFO as it was. A second read must find the same chunks.
    rereads_dump = True

    def call(self, client: RedisClient, key: bytes, *args: Any) -> Any:
        import redis

        try:
            return client.execute_command(*args)
        except redis.exceptions.ResponseError as exc:
            raise _cf_error(exc, key) from None

    def call_add(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[int | Exception]:
        return self.call(client, key, *self.madd_command(client, key, items))

    def check_plan(self, plan: AnyPlan, line: str | None = None) -> CuckooPlan:
        return for_cuckoo_line(engine_plan(plan, REDISBLOOM), line)

    def size_bytes(self, plan: AnyPlan) -> int:
        return int(plan.size_bytes)

    def owns(self, client: RedisClient, key: bytes, kind: bytes) -> bool:
        return kind == self.redis_type

    def reserve(self, client: RedisClient, key: bytes, plan: AnyPlan) -> None:
        self.call(client, key, *self.reserve_command(key, plan))

    def reserve_command(self, key: bytes, plan: AnyPlan) -> tuple[Any, ...]:
        """CF.RESERVE of ``plan``, every parameter given: the server's defaults never apply."""
        p = engine_plan(plan, REDISBLOOM)
        return (
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
        f = info_fields(self.call(client, key, "CF.INFO", key))
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

    # --- dump and restore --------------------------------------------------------------------

    def check_first_chunk(self, data: bytes, member: dict[str, Any]) -> int | None:
        problems = header_problems(data, member)
        if problems:
            raise DumpMismatch(f"the filter's header chunk is inconsistent: {'; '.join(problems)}")
        return parse_cf_header(data)["items"]

    def fingerprints_in(self, data: bytes, offset: int, member: dict[str, Any]) -> int:
        return len(data) - data.count(0)  # a slot is one byte, zero while empty

    def data_sizes(self, member: dict[str, Any]) -> list[int] | None:
        """Each sub-filter's slots, a byte each (its header chunk matched ``member``): a chunk of
        fingerprints sent twice in place of another would add up to the count all the same."""
        subs = cuckoo_subs(member["buckets"], member["bucket_size"], member["expansion"] or 0, member["filters"])
        return [sub.slots for sub in subs]

    def reserve_like(self, key: bytes, member: dict[str, Any]) -> tuple[Any, ...] | None:
        """CF.SCANDUMP of an empty filter answers no chunks: its restore reserves it with the
        dumped parameters."""
        return self.reserve_command(key, self.dumped_plan(member)) if member["items"] == 0 else None

    def loads_reach_replicas(self, line: str) -> bool:
        # RedisBloom 2.x replicates CF.LOADCHUNK's header but not its data chunks
        return line != "redisbloom2"
