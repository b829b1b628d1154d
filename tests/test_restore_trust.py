"""A restore trusts no header (issue #24 items 1 and 2): a dump whose bits do not hold the items its
header counts is refused (exit 8), and so is a header declaring more than its file holds or than its
own capacity and error rate give, before the server reserves anything. Each dump here is written by
bloomctl's own writer, every checksum valid; each test runs on a fresh server, so that its
`used_memory_peak` shows what a refused restore made the server allocate."""

from __future__ import annotations

import io
import json
import math
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from bloomctl.defaults import COUNT_TOLERANCE
from bloomctl.keys import KeyFamily
from bloomctl.lifecycle.front import reserve
from bloomctl.server.capabilities import detect
from bloomctl.sizing.bloom import SubFilter, plan
from bloomctl.transfer import dumpfile
from bloomctl.transfer.dump import read_filter
from bloomctl.transfer.dumpfile import Chunk
from bloomctl.transfer.scratch import TOLERANCE_ITEMS, TOLERANCE_SIGMAS, estimated_items, popcount
from tests.fixtures.redis import Target
from tests.servers import RedisServer

BACKENDS = [pytest.param("redisbloom", marks=pytest.mark.redisbloom), "bitmap"]
MB = 1 << 20


def _own_server(request: pytest.FixtureRequest, workdir: Path) -> Iterator[Target]:
    """A new server of its own (with RedisBloom for its RedisBloom backends): its memory peak is this test's."""
    shared = request.getfixturevalue("bloom" if request.param.startswith("redisbloom") else "plain")
    server = RedisServer(workdir, module=shared.module)
    try:
        yield Target(request.param, "standalone", server.url)
    finally:
        server.stop()


@pytest.fixture(params=BACKENDS)
def side(request: pytest.FixtureRequest, workdir: Path) -> Iterator[Target]:
    yield from _own_server(request, workdir)


def make(side: Target, key: str, capacity: int, items: int, *, grow: bool = False, prefix: str = "user") -> list[str]:
    """A filter of ``items`` items; ``grow``: a RedisBloom filter past its capacity (two sub-filters)."""
    names = [f"{prefix}:{i}" for i in range(items)]
    expansion = 2 if grow and side.backend.name == "redisbloom" else None
    reserve(side.client, detect(side.client), key, plan(capacity, 0.01, expansion), backend=side.backend.name)
    side.add(key, names)
    return names


def dumped(side: Target, key: str) -> tuple[dict, list[Chunk]]:
    dump = read_filter(side.client, detect(side.client), key)
    return json.loads(json.dumps(dump.header)), list(dump.chunks)


def written(header: dict, chunks: list[Chunk]) -> bytes:
    """A dump file from bloomctl's own writer: every chunk's CRC and the file's SHA-256 valid."""
    out = io.BytesIO()
    dumpfile.write(out, {k: v for k, v in header.items() if k not in ("format", "version")}, iter(chunks))
    return out.getvalue()


def snapshot(side: Target) -> dict[bytes, bytes]:
    return {key: side.client.dump(key) for key in side.client.keys("*")}


def peak(side: Target) -> int:
    return int(side.client.info("memory")["used_memory_peak"])


def restore(side: Target, data: bytes, tmp_path: Path, how: str, key: str = "live", *args: str, swap: bool = True):
    """`restore KEY --swap` of ``data`` from a pipe (stdin), a regular file, or one padded after its end."""
    options = [*args, *(["--swap", "--allow-shrink"] if swap else [])]
    if how in ("file", "padded", "members"):
        path = tmp_path / "crafted.bfdump"
        path.write_bytes(data)
        if how == "padded":  # a sparse tail of zeros after the end record: the file's length says 2 GiB
            os.truncate(path, len(data) + 2048 * MB)
        if how == "members":  # member records (no chunk data) before the end record: 8 MB of them
            end = len(data) - 1 - struct.calcsize(">QQ32s")
            path.write_bytes(data[:end] + b"M\0\0" * (8 * MB // 3) + data[end:])
        return side.cli("restore", key, "-i", str(path), *options)
    return side.cli("restore", key, *options, input=data)


def live(side: Target) -> dict[bytes, bytes]:
    """The active filter a bad dump must not replace (and its metadata), as the server holds it."""
    make(side, "live", 50_000, 500, prefix="live")
    return snapshot(side)


def refused(side: Target, result, before: dict[bytes, bytes], *expected: str) -> None:
    assert result.exit_code == 8, result.stderr
    assert result.stderr.count("\n") == 1 and all(text in result.stderr for text in expected), result.stderr
    assert snapshot(side) == before  # the active filter untouched; no standby, scratch key or metadata left


def zeroed(chunk: Chunk, keep: int = 0) -> Chunk:
    return Chunk(chunk.member, chunk.cursor, chunk.data[:keep] + bytes(len(chunk.data) - keep))


# --- item 1: the loaded bits must hold the items the header counts -------------------------------


@pytest.mark.redisbloom
@pytest.mark.parametrize("how", ["pipe", "file"])
def test_a_dump_of_its_header_chunk_alone_is_refused(bloom, workdir, tmp_path, how):
    """The audit's case: RedisBloom's header chunk and no data, swapped in with exit 0 and a count of
    199,998 while every item was missing. A pipe is read to its end, a file checked at once."""
    server = RedisServer(workdir, module=bloom.module)
    try:
        side = Target("redisbloom", "standalone", server.url)
        names = make(side, "users", 200_000, 20_000)
        header, chunks = dumped(side, "users")
        before, memory = live(side), peak(side)
        result = restore(side, written(header, chunks[:1]), tmp_path, how)
        expected = "holds 0 of the" if how == "pipe" else "truncated or forged"
        refused(side, result, before, expected)
        assert peak(side) - memory < MB
        assert restore(side, written(header, chunks), tmp_path, how, "copy").exit_code == 0
        assert all(side.backend.mexists(side.client, b"copy", names))
    finally:
        server.stop()


@pytest.mark.parametrize("which", ["one chunk", "every chunk"])
def test_a_dump_with_zeroed_bits_is_refused(side, tmp_path, which):
    """Bits zeroed and the checksums made anew: the header still counts every item."""
    if side.backend.name == "redisbloom":
        names = make(side, "users", 1_000, 3_000, grow=True)  # a header, then one chunk per sub-filter
        where = "in sub-filter 1" if which == "one chunk" else "in sub-filter 0"
    else:
        names = make(side, "users", 2_000_000, 30_000)  # 2.4 MB: three slices of 1 MiB
        where = "its bits hold about"
    header, chunks = dumped(side, "users")
    assert len(chunks) == 3
    before = live(side)
    if which == "one chunk":
        bad = [*chunks[:-1], zeroed(chunks[-1])]
    elif side.backend.name == "redisbloom":
        bad = [chunks[0], *(zeroed(chunk) for chunk in chunks[1:])]
    else:  # the bitmap string's first 64 bytes are its header
        bad = [zeroed(chunks[0], keep=64), *(zeroed(chunk) for chunk in chunks[1:])]
    refused(side, restore(side, written(header, bad), tmp_path, "pipe"), before, "its header counts", where)
    assert restore(side, written(header, chunks), tmp_path, "pipe", "copy").exit_code == 0
    assert all(side.backend.mexists(side.client, b"copy", names))


def _count_at(side: Target, header: dict, chunks: list[Chunk], items: int) -> list[Chunk]:
    """``chunks`` with the filter's own count set to ``items`` (and the dump's header's)."""
    header["items"] = header["members"][0]["items"] = items
    first = bytearray(chunks[0].data)
    if side.backend.name == "redisbloom":  # the chain's count, then its one sub-filter's
        struct.pack_into("<Q", first, 0, items)
        struct.pack_into("<Q", first, 20 + 16, items)
    else:  # the bitmap header's last field
        struct.pack_into(">q", first, 40, items)
    return [Chunk(0, chunks[0].cursor, bytes(first)), *chunks[1:]]


def test_the_count_guard_at_its_boundary(side, tmp_path):
    """The most items a filter's bits let its header count is accepted; one more is refused."""
    make(side, "users", 10_000, 8_000)
    header, chunks = dumped(side, "users")
    state = side.backend.info(side.client, b"users")
    (sub,) = state.subfilters
    bits = b"".join(chunk.data for chunk in chunks[1:]) if side.backend.name == "redisbloom" else chunks[0].data[64:]
    estimate, spread = estimated_items(sub.bits, sub.hashes, popcount(bits))
    most = math.floor(estimate + max(TOLERANCE_SIGMAS * spread, COUNT_TOLERANCE * estimate) + TOLERANCE_ITEMS)
    assert 8_000 < most < 8_000 * 1.05
    before = live(side)
    result = restore(side, written(header, _count_at(side, header, chunks, most + 1)), tmp_path, "pipe")
    refused(side, result, before, f"its header counts {most + 1:,}")
    result = restore(side, written(header, _count_at(side, header, chunks, most)), tmp_path, "pipe", "copy")
    assert result.exit_code == 0, result.stderr
    assert side.card("copy") == most


def test_a_count_a_parallel_build_leaves_restores(side, tmp_path):
    """A parallel build keeps a summed count up to 1% above its bits' estimate (items repeated
    across its parts): a dump of such a filter must restore (900 over, at 100,000, was refused)."""
    make(side, "users", 200_000, 100_000)
    header, chunks = dumped(side, "users")
    result = restore(side, written(header, _count_at(side, header, chunks, 100_900)), tmp_path, "pipe", "copy")
    assert result.exit_code == 0, result.stderr
    assert side.card("copy") == 100_900


def test_copy_refuses_a_filter_whose_bits_do_not_hold_its_count(side):
    """The same check guards `copy`: a source filter whose header counts items its bits lack (its
    header loaded alone, or its bits cleared) is not swapped in on the target."""
    make(side, "users", 200_000, 20_000)
    if side.backend.name == "redisbloom":
        header = side.client.execute_command("BF.SCANDUMP", "users", 0)[1]
        side.client.execute_command("BF.LOADCHUNK", "forged", 1, header)
    else:
        value = side.client.get("users")
        side.client.set("forged", value[:64] + bytes(len(value) - 64))
    before = snapshot(side)
    result = side.cli("copy", "forged", "--to", side.url, "--to-key", "moved", "--swap")
    refused(side, result, before, "moved")
    assert side.cli("copy", "users", "--to", side.url, "--to-key", "moved", "--swap").exit_code == 0


# --- item 2: declared sizes against the file, and against the capacity and error rate ------------

HUGE = 50_000_000  # items at 1%: a sub-filter of 60 MB


def _crafted(side: Target, capacity: int, declared_capacity: int) -> bytes:
    """A dump of a filter whose one sub-filter is sized for ``capacity`` items, with no data; the
    dump's header says its capacity is ``declared_capacity`` (199,998 items, it claims)."""
    make(side, "users", 1_000, 10)
    header, chunks = dumped(side, "users")
    sub = SubFilter.sized(0, capacity, 0.01)
    items = 199_998
    if side.backend.name == "redisbloom":
        size = 32 + 64 + sub.bytes
        first = struct.pack("<QIII", items, 1, 1 | 4 | 8, 2) + struct.pack(
            "<QQQddIQB", sub.bytes, sub.bits, items, sub.error_rate, sub.bits_per_item, sub.hashes, capacity, 0
        )
    else:
        size = 64 + sub.bytes
        head = struct.pack(">8sBBHIQQdq", b"bloomctl", 1, 1, 0, sub.hashes, sub.bits, capacity, 0.01, items)
        first = head.ljust(64, b"\0")
    member = header["members"][0]
    member.update(capacity=declared_capacity, size_bytes=size, items=items, expansion=None, error_rates=[0.01])
    header.update(capacity=declared_capacity, size_bytes=size, items=items, expansion=None, error_rate=0.01)
    side.client.delete("users", KeyFamily.of("users").meta)
    return written(header, [Chunk(0, chunks[0].cursor, first)])


@pytest.mark.parametrize(
    ("how", "declared", "expected"),
    [
        ("file", HUGE, "truncated or forged"),  # the file cannot hold what its header declares
        ("pipe", 1_000, "the header is inconsistent"),  # 60 MB are not what 1,000 items at 1% take
    ],
)
def test_a_huge_sub_filter_without_data_is_refused_before_anything_is_reserved(side, tmp_path, how, declared, expected):
    data = _crafted(side, HUGE, declared)
    before, memory = live(side), peak(side)
    result = restore(side, data, tmp_path, how)
    assert peak(side) - memory < MB  # the server allocated nothing for it
    refused(side, result, before, expected)
    refused(side, restore(side, data, tmp_path, how, "live", "--dry-run"), before, expected)


@pytest.mark.parametrize(("how", "expected"), [("padded", "bytes follow its end"), ("members", "and its chunks hold")])
def test_a_file_padded_to_its_declared_size_is_refused_before_anything_is_reserved(side, tmp_path, how, expected):
    """A file's length can be made to cover its header's sizes without chunk data: a sparse tail
    after its end record, or records that hold no data. The chunks' own lengths are what count."""
    data = _crafted(side, 5_000_000, 5_000_000)  # a 6 MB sub-filter, declared
    before, memory = live(side), peak(side)
    result = restore(side, data, tmp_path, how)
    assert peak(side) - memory < MB
    refused(side, result, before, expected)


def test_a_consistent_huge_header_on_a_pipe_is_refused_when_its_data_falls_short(side, tmp_path):
    """On a pipe nothing shows the size of what follows: the server reserves what a header
    consistent with its capacity declares (within its free memory), and the restore stops when
    the data falls short, removing it."""
    data = _crafted(side, HUGE, HUGE)
    before = live(side)
    result = restore(side, data, tmp_path, "pipe")
    refused(side, result, before, "truncated" if side.backend.name == "redisbloom" else "bytes of a bitmap filter")


# --- and honest dumps still restore, empty and overfilled ones included -------------------------


@pytest.mark.parametrize("how", ["pipe", "file"])
def test_honest_dumps_still_restore(side, tmp_path, how):
    empty: list[str] = []
    make(side, "empty", 1_000, 0)
    full = make(side, "full", 1_000, 3_000, grow=True)  # grown on RedisBloom, 3x overfilled as a bitmap
    for key, names in (("empty", empty), ("full", full)):
        header, chunks = dumped(side, key)
        result = restore(side, written(header, chunks), tmp_path, how, key, swap=False)
        assert result.exit_code == 0, result.stderr
        standby = KeyFamily.of(key).standby  # (a swap refuses a bitmap filter past its capacity)
        assert side.card(standby) == side.card(key) and side.dump(standby) == side.dump(key)
        assert all(side.backend.mexists(side.client, standby, names))


# --- cuckoo filters: their fingerprints are counted exactly, their sizes checked the same way -----

CUCKOO = [pytest.param("redisbloom-cuckoo", marks=pytest.mark.redisbloom), "lua-cuckoo"]


@pytest.fixture(params=CUCKOO)
def cside(request: pytest.FixtureRequest, workdir: Path) -> Iterator[Target]:
    yield from _own_server(request, workdir)


def cuckoo(side: Target, key: str, capacity: int, items: int, *extra: str) -> list[str]:
    engine = "redisbloom" if side.backend.name == "redisbloom-cuckoo" else "module-free"
    made = side.cli("reserve", key, "--type", "cuckoo", "-c", str(capacity), "--backend", engine, *extra)
    assert made.exit_code == 0, made.stderr
    names = [f"item:{i}" for i in range(items)]
    side.add(key, names)
    return names


@pytest.mark.parametrize("how", ["pipe", "file"])
def test_honest_cuckoo_dumps_still_restore(cside, tmp_path, how):
    grown = ("--expansion", "2") if cside.backend.name == "redisbloom-cuckoo" else ()
    cases = {"empty": cuckoo(cside, "empty", 1_000, 0), "cf": cuckoo(cside, "cf", 20_000, 5_000)}
    cside.backend.mdelete(cside.client, b"cf", cases["cf"][::10])
    cases["cf"] = [name for i, name in enumerate(cases["cf"]) if i % 10]
    if grown:
        cases["grown"] = cuckoo(cside, "grown", 1_000, 1_500, *grown)  # two sub-filters
    for key, names in cases.items():
        header, chunks = dumped(cside, key)
        result = restore(cside, written(header, chunks), tmp_path, how, f"copy-{key}")
        assert result.exit_code == 0, result.stderr
        assert cside.card(f"copy-{key}") == cside.card(key)
        assert all(cside.backend.mexists(cside.client, f"copy-{key}".encode(), names))


def test_a_cuckoo_header_declaring_a_huge_filter_is_refused_before_anything_is_reserved(cside, tmp_path):
    """A cuckoo filter's header chunk of 2**25 buckets (64 MB) and no slots, in a file."""
    from bloomctl.backends.cuckoo_lua import LUA_HEADER
    from bloomctl.backends.cuckoo_redisbloom import CF_HEADER

    cuckoo(cside, "cf", 1_000, 10)
    header, chunks = dumped(cside, "cf")
    member, buckets = header["members"][0], 1 << 25
    layout, where = (CF_HEADER, 1) if cside.backend.name == "redisbloom-cuckoo" else (LUA_HEADER, 7)
    fields = list(layout.unpack_from(chunks[0].data))
    grow = buckets * member["bucket_size"] * (member["fingerprint_bits"] // 8) - (
        member["buckets"] * member["bucket_size"] * (member["fingerprint_bits"] // 8)
    )
    fields[where] = buckets
    first = layout.pack(*fields) + chunks[0].data[layout.size : 64 if layout is LUA_HEADER else None]
    member.update(buckets=buckets, capacity=buckets * member["bucket_size"], size_bytes=member["size_bytes"] + grow)
    header["size_bytes"] = member["size_bytes"]
    if layout is LUA_HEADER:
        fields[8] = member["capacity"]
        first = layout.pack(*fields).ljust(64, b"\0")
    data = written(header, [Chunk(0, chunks[0].cursor, first)])
    before, memory = snapshot(cside), peak(cside)
    result = restore(cside, data, tmp_path, "file", "copy")
    assert peak(cside) - memory < MB
    refused(cside, result, before, "truncated or forged")


def test_an_empty_cuckoo_member_with_a_chunk_is_refused(cside, tmp_path):
    """An empty RedisBloom cuckoo filter is dumped without chunks and reserved anew: a header chunk
    for it (2**25 buckets) made a 67 MB empty standby of an 829-byte file."""
    from bloomctl.backends.cuckoo_redisbloom import CF_HEADER

    if cside.backend.name != "redisbloom-cuckoo":
        pytest.skip("a module-free cuckoo filter's dump always carries its string")
    cuckoo(cside, "full", 1_000, 10)
    _full, chunks = dumped(cside, "full")
    cuckoo(cside, "cf", 1_000, 0)
    header, empty = dumped(cside, "cf")
    assert empty == []  # (the server dumps an empty cuckoo filter without chunks)
    fields = list(CF_HEADER.unpack_from(chunks[0].data))
    fields[1] = 1 << 25
    forged = Chunk(0, chunks[0].cursor, CF_HEADER.pack(*fields) + chunks[0].data[CF_HEADER.size :])
    before, memory = snapshot(cside), peak(cside)
    result = restore(cside, written(header, [forged]), tmp_path, "pipe", "copy")
    assert peak(cside) - memory < MB
    refused(cside, result, before, "an empty filter that has none")
