"""Tests that kill the mutants that survived in more modules guarding data (scripts/mutation.sh,
docs/testing.md): the cuckoo replay's counting, a restore's bit tally and the dump file reader,
the rebuild's verify step, the recipe and capacity guards, the client build's probe and the
window's expiry. Each states the behaviour the surviving mutant broke unnoticed."""

from __future__ import annotations

import hashlib
import io
import json
import math
import struct
import zlib

import pytest

from bloomctl.backends.base import SubFilterState
from bloomctl.errors import StateConflict
from bloomctl.lifecycle.metadata import RECIPE, describe_recipe, recipe_field
from bloomctl.lifecycle.single import check_recipe
from bloomctl.rebuild.dedupe import Seen
from bloomctl.rebuild.replay import Copies, decide
from bloomctl.transfer import dumpfile
from bloomctl.transfer.dumpfile import Chunk, DumpCorrupt, Reader, declared_data
from bloomctl.transfer.scratch import BitTally, estimated_items, popcount

# --- the cuckoo replay's counting --------------------------------------------------------------


def source_of(*items: bytes) -> Seen:
    """The rebuild's de-duplication after the source's export: the items the standby holds."""
    seen = Seen(1 << 30)
    seen.fresh(list(items))
    return seen


def test_the_replay_skips_the_sources_own_add_once_and_counts_every_other_copy():
    """A source item's first ``+`` is the source's copy (skipped), each later one a copy more; a
    delete is applied while the standby holds a copy, never past the last."""
    view: dict[bytes, Copies] = {}
    log = [b"+a", b"+a", b"-a", b"-a", b"-a", b"+a", b"-a"]
    assert decide(log, source_of(b"a"), view) == [b"+a", b"-a", b"-a", b"+a", b"-a"]
    assert (view[b"a"].count, view[b"a"].in_source, view[b"a"].matched) == (0, True, True)


def test_the_replay_applies_every_add_of_an_item_the_source_lacks_and_no_delete_before_it():
    view: dict[bytes, Copies] = {}
    log = [b"-b", b"+b", b"+b", b"-b", b"-b", b"-b"]
    assert decide(log, source_of(b"a"), view) == [b"+b", b"+b", b"-b", b"-b"]
    assert (view[b"b"].count, view[b"b"].in_source, view[b"b"].matched) == (0, False, False)


def test_the_replay_deletes_the_sources_copy_then_takes_the_next_add_as_it():
    """A delete that comes before the source's own add in the log removes the source's copy; that
    add is then skipped (the export already held the item), the next one counts."""
    view: dict[bytes, Copies] = {}
    assert decide([b"-a", b"-a", b"+a", b"+a"], source_of(b"a"), view) == [b"-a", b"+a"]
    assert view[b"a"].count == 1


def test_the_replay_keeps_its_view_across_batches():
    """A batch sees the copies the earlier batches left: the source is asked only about new items."""
    seen = source_of(b"a")
    view: dict[bytes, Copies] = {}
    assert decide([b"+a", b"+c"], seen, view) == [b"+c"]
    seen.fresh([b"c"])  # (not asked again: the view already knows c's copies)
    assert decide([b"+a", b"-c", b"-c", b"-a", b"-a", b"-a"], seen, view) == [b"+a", b"-c", b"-a", b"-a"]
    assert decide([], seen, view) == []
    assert Copies(2, True) == Copies(2, True, False)


# --- a restore's bit tally ---------------------------------------------------------------------


def sub(index: int, size: int, items: int = 0, hashes: int = 7) -> SubFilterState:
    return SubFilterState(
        index=index, capacity=1000, items=items, error_rate=0.01, hashes=hashes, bits=8 * size, bytes=size
    )


def test_the_items_estimated_from_a_sub_filters_set_bits_and_their_spread():
    """n = (m/k) ln(m/(m-X)), spread sqrt(m (e^l - 1 - l)) / k; a saturated sub-filter could hold any number."""
    assert estimated_items(8000, 7, 0) == (0.0, 0.0)
    estimate, spread = estimated_items(8000, 7, 2000)
    assert estimate == pytest.approx(8000 * math.log(4 / 3) / 7, rel=1e-12)
    assert spread == pytest.approx(math.sqrt(8000 * (1 / 3 - math.log(4 / 3))) / 7, rel=1e-12)
    assert estimated_items(8000, 7, 7999)[0] == pytest.approx(8000 * math.log(8000) / 7, rel=1e-12)
    assert estimated_items(8000, 7, 8000) == (math.inf, math.inf)
    assert estimated_items(8000, 7, 9000) == (math.inf, math.inf)
    assert popcount(b"") == 0 and popcount(b"\xff" * 9 + b"\x01") == 73 and popcount(bytes(17)) == 0


def test_the_bits_are_counted_without_numpy_2_too(monkeypatch):
    """numpy before 2.0 has no ``bitwise_count``: Python counts them, the same."""
    import numpy

    data = bytes(range(256)) * 3 + b"\x07"
    counted = popcount(data)
    monkeypatch.delattr(numpy, "bitwise_count")
    assert popcount(data) == counted == 3 * 1024 + 3


def test_the_tally_takes_chunks_in_order_each_inside_one_sub_filter():
    tally = BitTally("f")
    tally.layout([sub(0, 4), sub(1, 8)])
    assert tally.ends == [4, 12] and tally.counts == [0, 0]
    with pytest.raises(DumpCorrupt, match=r"^f: a chunk at byte 1 of the filter's bits where 0 was next"):
        tally.add(1, b"\xff")
    tally.add(0, b"\xff\x00\x00\x01")  # to the first sub-filter's last byte
    tally.add(4, b"\x03" * 8)  # the second sub-filter, whole
    assert tally.counts == [9, 16] and tally.offset == 12 and tally.current == 1
    with pytest.raises(DumpCorrupt, match=r"runs past its sub-filters \(12 bytes\)"):
        tally.add(12, b"\x00")
    tally.check([sub(0, 4), sub(1, 8)])

    across = BitTally("f")
    across.layout([sub(0, 4), sub(1, 8)])
    with pytest.raises(DumpCorrupt, match=r"a chunk at byte 0 of the filter's bits runs past"):
        across.add(0, b"\x00" * 5)
    chain = BitTally("f")
    chain.layout([sub(0, 4), sub(1, 8), sub(2, 16)])
    assert chain.ends == [4, 12, 28] and chain.counts == [0, 0, 0]
    chain.add(0, bytes(4))
    with pytest.raises(DumpCorrupt, match=r"runs past its sub-filters \(28 bytes\)"):
        chain.add(4, bytes(9))
    empty = BitTally("f")
    empty.layout([])
    with pytest.raises(DumpCorrupt, match=r"runs past its sub-filters \(0 bytes\)"):
        empty.add(0, b"\x00")


def test_a_string_counted_before_its_layout_and_a_tally_short_of_its_bytes():
    """A filter in one string is counted before its header is read (one sub-filter); the check
    refuses a tally that did not reach the last byte, and takes the layout then if it has none."""
    tally = BitTally("f")
    tally.add(0, b"\x0f\x0f")
    tally.add(2, b"\x01")
    assert tally.counts == [9] and tally.ends is None
    tally.layout([sub(0, 3, items=1)])
    assert tally.counts == [9] and tally.ends == [3]
    tally.check([sub(0, 3, items=1)])

    short = BitTally("g")
    short.add(0, b"\x00\x00")
    with pytest.raises(DumpCorrupt, match=r"^g: the dump holds 2 of the 3 bytes of the filter's bits"):
        short.check([sub(0, 3)])
    assert short.ends == [3]
    over = BitTally("g")
    over.add(0, b"\x00" * 4)
    with pytest.raises(DumpCorrupt, match=r"holds 4 of the 3 bytes"):
        over.check([sub(0, 3)])


def limit(size: int, bits_set: int) -> float:
    """The most items a sub-filter of ``size`` bytes (7 hashes) with ``bits_set`` bits may count."""
    estimate, spread = estimated_items(8 * size, 7, bits_set)
    return estimate + max(8.0 * spread, 0.01 * estimate) + 3


@pytest.mark.parametrize(
    "size, ones",
    [
        pytest.param(1000, 0, id="empty: 3 items"),
        pytest.param(1000, 250, id="small: 8 sigmas"),
        pytest.param(1 << 20, 1 << 17, id="large: 1 percent"),
    ],
)
def test_the_count_guard_of_the_tally_at_its_boundary(size, ones):
    """The header may count up to the estimate plus 8 sigmas or 1% of it (the larger) plus 3
    items, not one more; fewer items than the bits hold always pass (a filter written while dumped)."""
    data = (b"\xff" + bytes(size // ones - 1)) * ones if ones else bytes(size)  # spread evenly, as bits are
    most = math.floor(limit(size, 8 * ones))
    if ones == 0:
        assert most == 3
    else:
        estimate, spread = estimated_items(8 * size, 7, 8 * ones)
        assert (8 * spread > 0.01 * estimate) == (size == 1000) and most != limit(size, 8 * ones)
    for items, accepted in ((0, True), (most, True), (most + 1, False)):
        tally = BitTally("f")
        tally.layout([sub(0, size, items)])
        tally.add(0, data)
        if accepted:
            tally.check([sub(0, size, items)])
        else:
            with pytest.raises(
                DumpCorrupt, match=rf"^f: its bits hold about [0-9,]+ items, its header counts {items:,}"
            ):
                tally.check([sub(0, size, items)])


def test_the_count_guard_names_the_sub_filter_of_a_chain():
    tally = BitTally("f")
    tally.layout([sub(0, 4, 0), sub(1, 4, 9)])
    tally.add(0, b"\xff" * 4)
    tally.add(4, bytes(4))
    with pytest.raises(DumpCorrupt, match=r"^f: its bits hold about 0 items in sub-filter 1, its header counts 9"):
        tally.check([sub(0, 4, 0), sub(1, 4, 9)])


# --- the dump file reader ----------------------------------------------------------------------

END = struct.Struct(">QQ32s")


def bitmap_header(*sizes: int) -> dict:
    return {"backend": "bitmap", "members": [{"size_bytes": size, "filters": 1} for size in sizes]}


EMPTY_CF = {"items": 0, "buckets": 512, "bucket_size": 2, "max_iterations": 20, "expansion": 1}


def dump_bytes(header: dict, chunks: list[Chunk]) -> bytes:
    out = io.BytesIO()
    dumpfile.write(out, header, iter(chunks))
    return out.getvalue()


def on_disk(tmp_path, data: bytes, pad: int = 0):
    path = tmp_path / "f.bfdump"
    path.write_bytes(data + bytes(pad))
    return path.open("rb")


def read_all(stream, name: str = "d") -> list[Chunk]:
    return list(Reader(stream, name).chunks())


def test_the_least_chunk_data_a_header_declares():
    """Each member's size less 64 bytes per sub-filter and one more; none for an empty cuckoo
    filter dumped without chunks; None for members a restore refuses."""
    assert declared_data(bitmap_header(1000)) == 1000 - 128
    assert declared_data(bitmap_header(1000, 500)) == 872 + 372
    assert declared_data({"backend": "redisbloom", "members": [{"size_bytes": 1000, "filters": 3}]}) == 1000 - 256
    assert declared_data(bitmap_header(100)) == 0 and declared_data(bitmap_header(0)) == 0
    assert declared_data(bitmap_header()) == 0
    cuckoo = {"backend": "redisbloom-cuckoo", "members": [{**EMPTY_CF, "size_bytes": 1100, "filters": 1}]}
    assert declared_data(cuckoo) == 0
    cuckoo["members"][0]["items"] = 1
    assert declared_data(cuckoo) == 1100 - 128
    assert declared_data({"backend": "bitmap", "members": [{"size_bytes": 1000, "filters": 0}]}) == 1000 - 64
    for bad in (
        {"backend": "bitmap", "members": {"size_bytes": 1000, "filters": 1}},
        {"backend": "bitmap", "members": 5},
        {"backend": "bitmap", "members": None},
        {"backend": "nope", "members": [{"size_bytes": 1000, "filters": 1}]},
        {"members": [{"size_bytes": 1000, "filters": 1}]},
        {"backend": "bitmap", "members": [{"size_bytes": -1, "filters": 1}]},
        {"backend": "bitmap", "members": [{"size_bytes": 1000, "filters": -1}]},
        {"backend": "bitmap", "members": [{"size_bytes": "1000", "filters": 1}]},
        {"backend": "bitmap", "members": [{"size_bytes": 1000, "filters": 1.0}]},
        {"backend": "bitmap", "members": [{"size_bytes": 1000}]},
        {"backend": "bitmap", "members": [[1000, 1]]},
        {"backend": "redisbloom-cuckoo", "members": [{"size_bytes": 1000, "filters": 1}]},
    ):
        assert declared_data(bad) is None, bad


def test_a_dump_reads_back_chunk_by_chunk_with_its_members(tmp_path):
    chunks = [Chunk(0, 1, b"\x01" * 300), Chunk(0, 2, b"\x02" * 600), Chunk(1, 7, b"\x03" * 400)]
    data = dump_bytes(bitmap_header(1028, 528), chunks)
    for stream in (io.BytesIO(data), on_disk(tmp_path, data)):
        reader = Reader(stream, "d")
        assert reader.header["members"][1] == {"size_bytes": 528, "filters": 1} and reader.header["format"]
        assert list(reader.chunks()) == chunks
        assert (reader.chunk_count, reader.bytes) == (3, 1300)
    assert on_disk(tmp_path, data).read(14) == dumpfile.MAGIC


def test_a_regular_file_must_hold_the_chunk_data_its_header_declares(tmp_path):
    """The file after the header (every byte of it), then the chunks' own lengths, at least what
    the header declares: exactly that much restores; one byte fewer is refused, naming which."""
    declared = 1000 - 128
    exact = dump_bytes(bitmap_header(1000), [Chunk(0, 0, b"\x05" * 500), Chunk(0, 1, b"\x06" * (declared - 500))])
    assert len(read_all(on_disk(tmp_path, exact))) == 2
    short = dump_bytes(bitmap_header(1000), [Chunk(0, 0, b"\x05" * 500), Chunk(0, 1, b"\x06" * (declared - 501))])
    with pytest.raises(
        DumpCorrupt, match=rf"^d is truncated or forged: .* least {declared} bytes, and its chunks hold {declared - 1}$"
    ):
        Reader(on_disk(tmp_path, short), "d")
    assert len(read_all(io.BytesIO(short))) == 2  # (a pipe is checked as it is read, by the restore)
    # a file whose bytes after the header are exactly the declared data, but not its chunks
    head = len(dump_bytes(bitmap_header(1000), [])) - 1 - END.size
    fill = declared - 1 - END.size - 17  # one chunk record and the end record: the file's declared bytes
    equal = dump_bytes(bitmap_header(1000), [Chunk(0, 0, b"\x07" * fill)])
    assert len(equal) - head == declared
    with pytest.raises(DumpCorrupt, match=rf"and its chunks hold {fill}$"):
        Reader(on_disk(tmp_path, equal), "d")
    with pytest.raises(DumpCorrupt, match=rf"least {declared} bytes, and {declared - 1} bytes follow it$"):
        Reader(on_disk(tmp_path, equal[:-1]), "d")


def test_bytes_after_the_end_record_are_refused_in_a_file_and_on_a_pipe(tmp_path):
    data = dump_bytes(bitmap_header(200), [Chunk(0, 0, b"\x01" * 72)])
    assert len(read_all(on_disk(tmp_path, data))) == 1
    with pytest.raises(DumpCorrupt, match=r"^d is corrupt: bytes follow its end$"):
        Reader(on_disk(tmp_path, data, pad=1), "d")
    with pytest.raises(DumpCorrupt, match=r"^d is corrupt: bytes follow its end$"):
        read_all(io.BytesIO(data + b"\x00"))


def raw_dump(body: bytes, records: bytes = b"", version: int = 1, crc: int | None = None) -> bytes:
    """A dump's bytes by hand: the header ``body`` (its CRC unless ``crc``), then ``records``."""
    crc = zlib.crc32(body) if crc is None else crc
    return dumpfile.MAGIC + struct.pack(">HI", version, len(body)) + body + struct.pack(">I", crc) + records


def test_a_dumps_header_is_checked_field_by_field():
    body = b'{"format": "bloomctl-dump"}'
    end = b"Z" + END.pack(0, 0, hashlib.sha256(raw_dump(body)).digest())
    assert read_all(io.BytesIO(raw_dump(body, end))) == []
    refused = {
        b"BLOOMCTL-DUMQ\n": r"^d is not a bloomctl dump \(it does not start with 'BLOOMCTL-DUMP'\)$",
        raw_dump(body, version=2): r"^d is format version 2; this bloomctl reads version 1",
        raw_dump(body, version=0): r"^d is format version 0;",
        raw_dump(body, crc=zlib.crc32(body) ^ 1): r"^d is corrupt: the header's checksum does not match$",
        raw_dump(b"{nope"): r"^d is corrupt: its header is not JSON$",
        raw_dump(b"[1]"): r"^d is corrupt: its header is not a bloomctl dump's$",
        raw_dump(b'{"format": "other"}'): r"^d is corrupt: its header is not a bloomctl dump's$",
        raw_dump(body)[:20]: r"^d is truncated: it ends inside the header \(after 20 bytes\)$",
        dumpfile.MAGIC + b"\x00": r"^d is truncated: it ends inside the version \(after 14 bytes\)$",
    }
    for data, message in refused.items():
        with pytest.raises(DumpCorrupt, match=message):
            Reader(io.BytesIO(data), "d")


def test_a_header_of_the_largest_size_is_read_and_one_byte_more_refused():
    most = dumpfile.MAX_HEADER
    assert most == 1 << 20
    body = b'{"format": "bloomctl-dump", "pad": "' + b"x" * (most - 38) + b'"}'
    assert len(body) == most and Reader(io.BytesIO(raw_dump(body)), "d").header["format"] == "bloomctl-dump"
    over = body[:-2] + b'x"}'
    with pytest.raises(DumpCorrupt, match=r"^d is corrupt: a header of 1,048,577 bytes$"):
        Reader(io.BytesIO(raw_dump(over)), "d")


def chunk_record(cursor: int, data: bytes, crc_delta: int = 0, length: int | None = None) -> bytes:
    head = struct.pack(">QI", cursor, len(data) if length is None else length)
    return b"C" + head + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(head[:8])) ^ crc_delta)


def test_a_dumps_records_are_checked_one_by_one():
    body = b'{"format": "bloomctl-dump"}'
    good = chunk_record(5, b"abc")
    refused = {
        good: r"^d is truncated: it ends after chunk 1, without its end record$",
        good + chunk_record(6, b"de", crc_delta=1): r"^d is corrupt: chunk 2's checksum does not match$",
        good[:6] + b"\x01" + good[7:]: r"^d is corrupt: chunk 1's checksum does not match$",  # the cursor counts
        good + b"X": r"^d is corrupt: an unknown record b'X'$",
        good + b"M\x00": r"^d is truncated: it ends inside a member record",
        good + b"C\x00": rf"^d is truncated: it ends inside a chunk \(after {len(raw_dump(body, good)) + 1} bytes\)$",
        good + b"Z\x00": r"^d is truncated: it ends inside its last record$",
        chunk_record(0, b"", length=dumpfile.MAX_CHUNK): r"^d is truncated: it ends inside a chunk",
        chunk_record(0, b"", length=dumpfile.MAX_CHUNK + 1): r"^d is corrupt: a chunk of 268,435,457 bytes$",
    }
    for records, message in refused.items():
        with pytest.raises(DumpCorrupt, match=message):
            read_all(io.BytesIO(raw_dump(body, records)))
    records = good + b"M\x00\x02" + chunk_record(9, b"fg")
    digest = hashlib.sha256(raw_dump(body, records)).digest()
    assert read_all(io.BytesIO(raw_dump(body, records + b"Z" + END.pack(2, 5, digest)))) == [
        Chunk(0, 5, b"abc"),
        Chunk(2, 9, b"fg"),
    ]
    for chunks, total, sha in ((1, 5, digest), (2, 4, digest), (2, 5, bytes(32))):
        with pytest.raises(DumpCorrupt, match=r"declares 1 chunks, holds 2|declares 2 chunks|SHA-256 does not match"):
            read_all(io.BytesIO(raw_dump(body, records + b"Z" + END.pack(chunks, total, sha))))


def test_a_chunk_for_an_empty_cuckoo_member_is_refused_and_only_for_it():
    members = [
        {**EMPTY_CF, "items": 3, "size_bytes": 1100, "filters": 1},
        {**EMPTY_CF, "size_bytes": 1100, "filters": 1},
    ]
    header = {"backend": "redisbloom-cuckoo", "members": members}
    reader = Reader(io.BytesIO(dump_bytes(header, [])), "d")
    assert [reader.chunkless(m) for m in (-1, 0, 1, 2)] == [False, False, True, False]
    assert read_all(io.BytesIO(dump_bytes(header, [Chunk(0, 0, b"x")]))) == [Chunk(0, 0, b"x")]
    with pytest.raises(DumpCorrupt, match=r"^d is forged: a chunk for member 1, an empty filter that has none$"):
        read_all(io.BytesIO(dump_bytes(header, [Chunk(1, 0, b"x")])))


# --- the recipe guard --------------------------------------------------------------------------


def test_the_recipe_guard_refuses_only_two_recorded_recipes_that_differ():
    """A standby built otherwise than the active filter is refused, naming both recipes; a filter
    (either one) without a recorded recipe passes, and so does the same recipe."""
    email = recipe_field({"source": "csv", "column": "email", "template": None, "prefix": "user:"})
    other = recipe_field({"source": "csv", "column": "email", "template": None, "prefix": "u:"})
    check_recipe({RECIPE: email, "state": "active"}, {RECIPE: email})
    check_recipe({}, {RECIPE: other})
    check_recipe({RECIPE: email}, {"state": "verified"})
    check_recipe({}, {})
    with pytest.raises(StateConflict) as refused:
        check_recipe({RECIPE: email}, {RECIPE: other})
    assert str(refused.value).startswith(
        "the standby's items are built differently from the active filter's (csv, column 'email', prefix 'u:', "
        "was csv, column 'email', prefix 'user:'): every lookup built the old way would miss"
    )
    assert describe_recipe("not json") == "'not json'" and describe_recipe("[1]") == "'[1]'"
    assert describe_recipe('{"template": "{a}"}') == "?, template '{a}'"


# --- the rebuild's verify step -----------------------------------------------------------------


def mexists_calls(client) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_bf.mexists", {}).get("calls", 0))


def test_verify_checks_at_most_a_thousand_items_a_call_and_waits_for_its_window(bloom):
    """Each BF.MEXISTS holds at most 1,000 items (a call is work the server does at once); with a
    window of w calls, the replies are read once w are queued, before the next batch is read."""
    from bloomctl import backends
    from bloomctl.rebuild.verify import verify
    from bloomctl.server.connection import connect, settings_from
    from bloomctl.sizing.bloom import plan

    client = connect(settings_from(bloom.url))
    backend = backends.get("redisbloom")
    items = [f"user:{i}".encode() for i in range(2001)]
    backend.reserve(client, b"users", plan(10_000, 0.01, None))
    backend.madd(client, b"users", items)
    for count, calls in ((1000, 1), (1001, 2), (2000, 2), (2001, 3)):
        client.config_resetstat()
        assert verify(client, backend, b"users", iter([items[:count]])) == count
        assert mexists_calls(client) == calls, count

    seen: list[int] = []

    def batches():
        for start in range(0, 2000, 500):
            seen.append(mexists_calls(client))
            yield items[start : start + 500]

    for window, expected in ((1, [0, 1, 2, 3]), (2, [0, 0, 2, 2]), (3, [0, 0, 0, 3])):
        client.config_resetstat()
        seen.clear()
        assert verify(client, backend, b"users", batches(), window=window) == 2000
        assert seen == expected and mexists_calls(client) == 4, (window, seen)

    from bloomctl.lifecycle.routing import route

    shards = [b"{s0}users", b"{s1}users"]  # two shards: each item looked up in its own
    for shard, group in zip(shards, route(items, 2), strict=True):
        backend.reserve(client, shard, plan(10_000, 0.01, None))
        backend.madd(client, shard, group)
    assert verify(client, backend, shards, iter([items])) == 2001


# --- the client build's compatibility probe ----------------------------------------------------


def probed(server, backend_name: str, monkeypatch) -> tuple[object, list[tuple[bytes, int, int]]]:
    """``probe.check`` on ``server``; each batch the probe sends as (key, its TTL, items so far)."""
    from bloomctl import backends
    from bloomctl.keys import KeyFamily
    from bloomctl.rebuild.build import probe
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(server.url))
    backend = backends.get(backend_name)
    sent: list[tuple[bytes, int, int]] = []
    real = backend.madd

    def spy(client, key, items):
        flags = real(client, key, items)
        sent.append((key, client.pttl(key), len(items)))
        return flags

    monkeypatch.setattr(backend, "madd", spy)
    return probe.check(client, backend, KeyFamily.of("users"), 0.01, None), sent


@pytest.mark.parametrize("fixture, backend_name", [("plain", "bitmap"), ("bloom", "redisbloom")])
def test_the_probe_matches_this_server_on_an_expiring_key_it_removes(request, monkeypatch, fixture, backend_name):
    server = request.getfixturevalue(fixture)
    verdict, sent = probed(server, backend_name, monkeypatch)
    assert verdict is None
    keys = {key for key, _ttl, _n in sent}
    assert len(keys) == 1 and next(iter(keys)).startswith(b"{users}:probe:")
    assert all(590_000 < ttl <= 600_000 for _key, ttl, _n in sent)
    assert sum(n for _key, _ttl, n in sent) == 1506 and server.client().keys("*") == []


def test_the_probe_names_the_bytes_and_the_count_that_differ(plain):
    """The client's bits or item count unlike the server's: said, with how many bytes differ."""
    from bloomctl import backends
    from bloomctl.rebuild.build import probe
    from bloomctl.server.connection import connect, settings_from
    from bloomctl.sizing.bloom import plan

    client = connect(settings_from(plain.url))
    backend = backends.get("bitmap")
    items = probe.probe_items()
    backend.reserve(client, b"p", backend.check_plan(plan(probe.PROBE_CAPACITY, 0.01, None)))
    backend.madd(client, b"p", items)
    assert probe._compare(client, "bitmap", b"p", items) is None
    head = client.getrange(b"p", 0, 63)
    count = struct.unpack_from(">q", head, 40)[0]
    client.setrange(b"p", 40, struct.pack(">q", count + 1))
    assert probe._compare(client, "bitmap", b"p", items) == f"the client counts {count} items, the server {count + 1}"
    nbytes = client.strlen(b"p") - 64
    first = client.getrange(b"p", 64, 64)[0]
    client.setrange(b"p", 64, bytes([first ^ 0x10]))
    assert probe._compare(client, "bitmap", b"p", items) == f"1 of {nbytes} bytes differ from the server's"
    last = client.getrange(b"p", -1, -1)[0]
    client.setrange(b"p", 63 + nbytes, bytes([last ^ 0x01]))
    assert probe._compare(client, "bitmap", b"p", items) == f"2 of {nbytes} bytes differ from the server's"


# --- the window's expiry -----------------------------------------------------------------------


@pytest.mark.parametrize("fixture, backend", [("plain", "module-free"), ("bloom", "redisbloom")])
def test_each_bucket_expires_when_it_leaves_the_window_and_strays_go_within_the_look_back(request, fixture, backend):
    """A bucket's EXPIREAT is the start of the bucket ``keep`` periods later; past buckets never
    made are missing (no expiry); the window's own filters from the newest name outside it back to
    STRAY_LOOKBACK names before are unlinked, not one further; a dry run reports and changes nothing."""
    from bloomctl import backends, window
    from bloomctl.server.capabilities import detect
    from bloomctl.server.connection import connect, settings_from
    from bloomctl.window.rotation import STRAY_LOOKBACK
    from bloomctl.window.settings import read_window

    server, cli = request.getfixturevalue(fixture), request.getfixturevalue(f"cli_{fixture}")
    client = connect(settings_from(server.url))
    args = ("window", "create", "w", "--type", "bloom", "--backend", backend, "-e", "1%", "-c", "1000")
    created = cli(*args, "--period", "1d", "--keep", "3", "--ahead", "1")
    assert created.exit_code == 0, created.stderr
    spec = read_window(client, "w")
    now = window.server_time(client, spec.name)
    current = spec.index(now)
    filters = backends.get(spec.backend)
    oldest = current - spec.keep  # the newest name outside the window
    strays = [oldest, oldest - 1, oldest - STRAY_LOOKBACK + 1, oldest - STRAY_LOOKBACK]
    for index in strays:
        filters.reserve(client, spec.key(index), spec.plan_for(1000))
    client.persist(spec.key(current))  # (``window create`` made it, with its expiry)

    dry = window.rotate(client, detect(client), "w", dry_run=True)
    assert [a.index for a in dry.actions if a.action == "expired"] == sorted(strays[:3])
    assert client.exists(*(spec.key(i) for i in strays)) == 4 and client.ttl(spec.key(current)) == -1

    report = window.rotate(client, detect(client), "w")
    buckets = {a.index: a for a in report.actions if a.action != "expired"}
    assert sorted(buckets) == list(range(current - 2, current + 2))
    for index, action in buckets.items():
        if index < current:
            assert (action.action, action.expire_at, client.exists(action.key)) == ("missing", None, 0)
        else:
            assert action.expire_at == spec.expire_at(index) == spec.start(index + 3)
            assert abs(client.ttl(action.key) - (spec.start(index + 3) - now)) < 5
    assert sorted(a.index for a in report.actions if a.action == "expired") == sorted(strays[:3])
    assert [client.exists(spec.key(i)) for i in strays] == [0, 0, 0, 1]
    assert client.ttl(spec.key(strays[3])) == -1


# --- the capacity guard of a filter that never grows -------------------------------------------


def test_the_loader_takes_a_bitmap_filter_to_its_capacity_and_not_one_item_past(plain):
    """A load with a limit (a bitmap standby's capacity) stops at the first reply that takes the
    key's new items past it; repeats count nothing, so the limit is on distinct items."""
    from bloomctl import backends
    from bloomctl.rebuild.loader import Loader
    from bloomctl.server.connection import connect, settings_from
    from bloomctl.sizing.bloom import plan

    client = connect(settings_from(plain.url))
    backend = backends.get("bitmap")
    items = [f"user:{i}".encode() for i in range(101)]
    backend.reserve(client, b"full", plan(100_000, 0.0001, None))
    stats = Loader(client, backend, b"full", limit=100, batch_size=10).load([items[:100], items[:50]])
    assert (stats.added, stats.duplicates) == (100, 50)
    backend.reserve(client, b"over", plan(100_000, 0.0001, None))
    with pytest.raises(StateConflict) as refused:
        Loader(client, backend, b"over", limit=100, batch_size=10).load([items])
    assert str(refused.value).startswith("the filter 'over' would hold 101+ items, over its capacity of 100: it never")
    backend.reserve(client, b"free", plan(100_000, 0.0001, None))
    assert Loader(client, backend, b"free", batch_size=10).load([items]).added == 101  # no limit: no check


def test_a_full_redisbloom_filter_stops_the_load_naming_its_capacity(bloom):
    from bloomctl import backends
    from bloomctl.rebuild.loader import Loader
    from bloomctl.server.connection import connect, settings_from
    from bloomctl.sizing.bloom import plan

    client = connect(settings_from(bloom.url))
    backend = backends.get("redisbloom")
    backend.reserve(client, b"full", backend.check_plan(plan(100, 0.0001, None)))
    with pytest.raises(StateConflict, match=r"^writing to 'full' failed: .*full.*: the filter reached its capacity"):
        Loader(client, backend, b"full", batch_size=10).load([[f"user:{i}".encode() for i in range(200)]])


def test_a_full_cuckoo_filter_stops_the_rebuild_naming_its_capacity_on_both_backends(cli_bloom, cli_plain, tmp_path):
    """RedisBloom's CF.INSERT answers a cuckoo filter at its most sub-filters with one error for the
    whole command, the module-free backend with -1 per item: both are the filter's capacity (exit
    5, what to raise), where RedisBloom's was a "server error" (exit 3) with no advice."""
    path = tmp_path / "ids.csv"
    path.write_text(
        "id\n" + "".join(f"{i}\n" for i in range(20_000))
    )  # more than sub-filters of 100 hold at their most
    tiny = ("--type", "cuckoo", "--from-csv", str(path), "-c", "100", "--bucket-size", "1", "--max-iterations", "2")
    for cli, more, said in (
        (cli_bloom, ("--expansion", "1"), "Maximum expansions reached"),
        (cli_plain, (), "the filter is full: no room"),
    ):
        result = cli("rebuild", "cq", *tiny, *more)
        assert result.exit_code == 5, result.stderr
        assert said in result.stderr and "the filter reached its capacity (raise --capacity" in result.stderr


def test_a_write_error_other_than_a_full_filter_is_not_called_its_capacity(bloom):
    import redis

    from bloomctl import backends
    from bloomctl.rebuild.loader import Loader
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(bloom.url))
    client.set(b"text", b"not a filter")
    with pytest.raises(redis.exceptions.ResponseError, match=r"^WRONGTYPE"):
        Loader(client, backends.get("redisbloom-cuckoo"), b"text", batch_size=10).load([[b"a", b"b"]])


def test_a_client_build_takes_a_filter_to_its_capacity_and_not_one_item_past(plain, bloom):
    """In the client: a bitmap filter (and a NONSCALING RedisBloom one) is refused one distinct
    item past its capacity, as the server refuses it; a scaling RedisBloom one goes to the server."""
    from bloomctl import backends
    from bloomctl.rebuild.build.client import Build, Overflow, scheme_for
    from bloomctl.server.connection import connect, settings_from
    from bloomctl.sizing.bloom import plan

    items = [f"user:{i}".encode() for i in range(1001)]
    for server, name, expansion, past in (
        (plain, "bitmap", None, r"^the filter 'users' would hold 1,001 items, over its capacity of 1,000: it never"),
        (bloom, "redisbloom", None, r"^writing to 'users' failed: non scaling filter is full"),
        (bloom, "redisbloom", 2, None),
    ):
        client = connect(settings_from(server.url))
        backend = backends.get(name)
        the_plan = plan(1000, 0.0001, expansion)
        backend.reserve(client, b"k", backend.check_plan(the_plan) if expansion is None else the_plan)
        layout = scheme_for(name).read_layout(client, b"k")
        assert layout.capacity == 1000, name
        client.delete(b"k")
        build = Build(name, [layout], ["users"])
        build.add(items[:1000])
        build.add(items[:10])
        assert build.count == 1000
        if past is None:
            with pytest.raises(Overflow, match=r"^'users': more than 1,000 distinct items"):
                build.add(items[1000:])
        else:
            with pytest.raises(StateConflict, match=past):
                build.add(items[1000:])


@pytest.mark.parametrize("build", ["server", "client"])
def test_a_rebuild_fills_a_bitmap_filter_to_its_capacity_and_warns_past_80_percent(plain, cli_plain, tmp_path, build):
    """Exactly ``capacity`` items are swapped in (with the warning); 800 of 1,000 are not warned
    about, 801 are."""
    path = tmp_path / "items.csv"
    for count, warned in ((1000, "100%"), (801, "80%"), (800, None)):
        path.write_text("id\n" + "".join(f"user:{i}\n" for i in range(count)))
        args = ("rebuild", "users", "--from-csv", str(path), "-c", "1000", "-e", "1%", "--backend", "bitmap")
        result = cli_plain(*args, "--swap", "--build", build)
        assert result.exit_code == 0, result.stderr
        warning = f"holds {count:,} items, {warned} of its capacity of 1,000: it never grows"
        assert (warning in result.stderr) == (warned is not None), result.stderr
        assert ("of its capacity of 1,000: it never grows" in result.stderr) == (warned is not None)


def test_a_redisbloom_filter_warns_only_where_it_never_grows_and_grows_past_its_capacity(cli_bloom, tmp_path):
    """RedisBloom: a NONSCALING filter 90% full is warned about; a scaling one 90% full is not (it
    grows), and one given more items than its capacity grows a sub-filter rather than being
    refused or cut at its capacity (the bitmap backend's limits are not RedisBloom's)."""
    path = tmp_path / "items.csv"
    path.write_text("id\n" + "".join(f"user:{i}\n" for i in range(900)))
    for key, extra, warned in (("fixed", ("--nonscaling",), True), ("grows", (), False)):
        args = ("rebuild", key, "--from-csv", str(path), "-c", "1000", "-e", "1%", "--swap", *extra)
        result = cli_bloom(*args, "--backend", "redisbloom", "--format", "json")
        assert result.exit_code == 0, result.stderr
        assert ("90% of its capacity of 1,000: it never grows" in result.stderr) == warned, result.stderr
    path.write_text("id\n" + "".join(f"user:{i}\n" for i in range(1500)))
    result = cli_bloom(
        "rebuild", "grows", "--from-csv", str(path), "-c", "1000", "-e", "1%", "--swap", "--format", "json"
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)  # (a few of the 1,500 are false positives: not counted)
    assert report["swapped"] and report["added"] > 1450 and "never grows" not in result.stderr, report


@pytest.mark.parametrize(
    ("fixture", "backend", "denied"), [("plain", "module-free", "fcall"), ("bloom", "redisbloom", "bf.reserve")]
)
def test_a_bucket_the_server_has_no_memory_for_is_said_so_and_other_refusals_are_not(request, fixture, backend, denied):
    """`window rotate` making a bucket on a server out of memory: one line saying which bucket and
    what to do (exit 3); a reserve refused for another reason (a user denied it) is that reason,
    never called a lack of memory."""
    from bloomctl import window
    from bloomctl.server.connection import connect, settings_from
    from bloomctl.window.settings import read_window

    server, cli = request.getfixturevalue(fixture), request.getfixturevalue(f"cli_{fixture}")
    client = connect(settings_from(server.url))
    for name, capacity in (("big", "5000000"), ("small", "1000")):
        args = ("window", "create", name, "--type", "bloom", "--backend", backend, "-e", "1%", "-c", capacity)
        assert cli(*args, "--period", "1d", "--keep", "3", "--ahead", "1").exit_code == 0
        spec = read_window(client, name)
        current = spec.index(window.server_time(client, spec.name))
        client.unlink(*(spec.key(index) for index in range(current - 3, current + 3)))  # rotate makes them
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", str(used + 1_000_000))
    try:
        result = cli("window", "rotate", "big")
    finally:
        client.config_set("maxmemory", "0")
    lines = [line for line in result.stderr.splitlines() if line.startswith("bloomctl: ")]
    assert result.exit_code == 3 and len(lines) == 1 and "out of memory" in lines[0], result.stderr
    assert "could not be made" in lines[0] and "rotate again" in lines[0]
    client.execute_command("ACL", "SETUSER", "nomake", "on", ">pw", "~*", "&*", "+@all", f"-{denied}")
    try:
        result = cli("window", "rotate", "small", url=server.url.replace("redis://", "redis://nomake:pw@", 1))
    finally:
        client.execute_command("ACL", "DELUSER", "nomake")
    assert result.exit_code == 3 and "out of memory" not in result.stderr, result.stderr
    assert denied in result.stderr.lower(), result.stderr
