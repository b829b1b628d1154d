"""Forged dumps that a reviewer wrote with bloomctl's own writer, every checksum valid, and that
restore took with exit 0: `--swap` then put in a filter missing most of the original's items, or
one that would grow a thousand times too fast. Each forgery leaves the file inconsistent with
itself (a header field against the dump's own header, a chunk sent twice, a stretch of bits far
emptier than the rest), and each is now refused (exit 8) with the active filter untouched. A
valid dump of some other filter stays undetectable by any check of the file alone."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from bloomctl.sizing.bloom import SubFilter
from bloomctl.transfer.dumpfile import Chunk
from bloomctl.transfer.scratch import estimated_items, popcount
from tests.fixtures.redis import Target
from tests.test_restore_trust import (
    BACKENDS,
    CUCKOO,
    MB,
    _own_server,
    cuckoo,
    dumped,
    live,
    make,
    peak,
    refused,
    restore,
    snapshot,
    written,
)

HEAD = struct.Struct("<QIII")  # RedisBloom's chain: items, sub-filters, options, growth
LINK = struct.Struct("<QQQddIQB")  # a sub-filter: bytes, bits, items, error, bits per item, hashes, capacity, n2
BITMAP = struct.Struct(">8sBBHIQQdq")  # magic, format, scheme, 0, hashes, bits, capacity, error rate, items


@pytest.fixture(params=BACKENDS)
def side(request: pytest.FixtureRequest, workdir: Path) -> Iterator[Target]:
    yield from _own_server(request, workdir)


@pytest.fixture(params=CUCKOO)
def cside(request: pytest.FixtureRequest, workdir: Path) -> Iterator[Target]:
    yield from _own_server(request, workdir)


def _chain(first: bytes) -> tuple[list, list[list]]:
    head = list(HEAD.unpack_from(first))
    return head, [list(LINK.unpack_from(first, HEAD.size + i * LINK.size)) for i in range(head[1])]


def _packed(head: list, links: list[list]) -> bytes:
    return HEAD.pack(*head) + b"".join(LINK.pack(*link) for link in links)


def _missing(target: Target, names: list[str], key: bytes = b"users") -> int:
    return sum(not found for found in target.backend.mexists(target.client, key, names))


@pytest.mark.parametrize("forgery", ["n2", "hashes", "growth", "never grows"])
def test_a_redisbloom_header_chunk_unlike_the_dumps_header_is_refused(side, tmp_path, forgery):
    """One field of RedisBloom's header chunk changed, the dump's own header left as it was:
    - n2 16: positions taken modulo 2**16, not modulo the bits (7,986 of 8,000 items missing);
    - capacity 8,498 and error 0.0019536: the same bits, 9 hashes for 8 (4,440 missing);
    - growth 1000: the next sub-filter a thousand times the size (15.6 MB after 2,500 more items);
    - the flag of a chain that never grows, on one the dump's header says grows."""
    if side.backend.name != "redisbloom":
        pytest.skip("RedisBloom's header chunk")
    names = make(side, "users", 10_000, 8_000, grow=True)  # (grow: a chain that may grow, one sub-filter now)
    header, chunks = dumped(side, "users")
    head, links = _chain(chunks[0].data)
    if forgery == "n2":
        links[0][7] = 16
    elif forgery == "hashes":
        forged = SubFilter.sized(0, 8_498, 0.0019536)
        assert (forged.bits, forged.hashes) == (links[0][1], links[0][5] + 1)  # the same bits, one hash more
        links[0][3], links[0][4], links[0][5], links[0][6] = forged.error_rate, forged.bits_per_item, 9, 8_498
        head[0] = links[0][2] = header["items"] = header["members"][0]["items"] = 7_000
    elif forgery == "growth":
        head[3] = 1000
    else:
        head[2] |= 8
    forged_chunks = [Chunk(0, chunks[0].cursor, _packed(head, links)), *chunks[1:]]
    before = live(side)
    result = restore(side, written(header, forged_chunks), tmp_path, "pipe", "users")
    refused(side, result, before, "header chunk is inconsistent")
    assert _missing(side, names) == 0  # the active filter as it was
    assert restore(side, written(header, chunks), tmp_path, "pipe", "copy").exit_code == 0


@pytest.mark.parametrize("forgery", ["one more hash", "capacity and error rate", "format"])
def test_a_bitmap_strings_header_unlike_the_dumps_header_is_refused(side, tmp_path, forgery):
    """The module-free string's own header changed: k raised by one (items lowered to 6,947 so that
    the count passed; 4,346 of 8,000 missing), a capacity of 10**9 at a 50% error rate (fill
    alerts blind), another format number."""
    if side.backend.name != "bitmap":
        pytest.skip("the module-free filter's string header")
    names = make(side, "users", 10_000, 8_000)
    header, chunks = dumped(side, "users")
    fields = list(BITMAP.unpack_from(chunks[0].data))
    if forgery == "one more hash":
        fields[4] += 1
        fields[8] = header["items"] = header["members"][0]["items"] = 6_947
    elif forgery == "capacity and error rate":
        fields[6], fields[7] = 10**9, 0.5
    else:
        fields[1] = 2
    first = BITMAP.pack(*fields) + chunks[0].data[BITMAP.size :]
    before = live(side)
    result = restore(side, written(header, [Chunk(0, 0, first), *chunks[1:]]), tmp_path, "pipe", "users")
    refused(side, result, before, "header is inconsistent")
    assert _missing(side, names) == 0
    assert restore(side, written(header, chunks), tmp_path, "pipe", "copy").exit_code == 0


def test_a_sparse_file_without_its_end_record_is_refused_before_anything_is_reserved(side, tmp_path):
    """The header and its first chunk, then a sparse run of zeros as long as the declared data in
    place of the other chunks and the end record (4 KiB on disk): the walk of the records stopped
    at the first unknown one and the file's length passed, so the server reserved the filter
    (30.8 MB at peak for one of 27.5 MB) before the reader refused the zeros."""
    make(side, "users", 2_000_000, 10_000)  # 2.4 MB of bits: more than one chunk
    header, chunks = dumped(side, "users")
    path = tmp_path / "sparse.bfdump"
    data = written(header, chunks[:1])
    path.write_bytes(data[: len(data) - 1 - struct.calcsize(">QQ32s")])  # without its end record
    os.truncate(path, path.stat().st_size + int(header["members"][0]["size_bytes"]))
    before, memory = live(side), peak(side)
    result = side.cli("restore", "live", "-i", str(path), "--swap", "--allow-shrink")
    assert peak(side) - memory < MB
    refused(side, result, before, "truncated or forged", "its chunks hold")


def test_a_cuckoo_chunk_sent_twice_in_place_of_another_is_refused(cside, tmp_path):
    """A RedisBloom cuckoo filter's slots cut where half its fingerprints lie before, that half
    sent twice at the same cursor and the rest left out: the fingerprints add up to the header's
    count, and 2,498 of 5,000 items were missing. Each chunk must start where the last one ended."""
    if cside.backend.name != "redisbloom-cuckoo":
        pytest.skip("a module-free cuckoo filter is one string, whose slices are checked in order")
    names = cuckoo(cside, "users", 20_000, 5_000)
    header, chunks = dumped(cside, "users")
    slots = b"".join(chunk.data for chunk in chunks[1:])
    assert len(chunks) == 2  # the header, and every slot in one chunk
    taken = [i for i, slot in enumerate(slots) if slot]
    assert len(taken) == 5_000  # (one fingerprint an item: two halves add up to the count)
    cut = taken[len(taken) // 2]
    half = Chunk(0, cut + 1, slots[:cut])  # (a chunk's cursor: its end in the slots, plus one)
    forged = [chunks[0], half, half]
    before = snapshot(cside)
    result = restore(cside, written(header, forged), tmp_path, "pipe", "copy")
    refused(cside, result, before, "where", "was next")
    assert restore(cside, written(header, chunks), tmp_path, "pipe", "copy").exit_code == 0
    assert _missing(cside, names, b"copy") == 0


def test_a_stretch_of_bits_zeroed_with_the_count_lowered_to_match_is_refused(side, tmp_path):
    """A third of the bits zeroed and the count set to what the rest estimate: the count check
    sees a smaller filter, but an item's bits are spread over the whole, so 93% of the items were
    missing after the swap. No stretch of an honest filter's bits is far emptier than the whole."""
    names = make(side, "users", 100_000, 80_000)
    header, chunks = dumped(side, "users")
    skip = 0 if side.backend.name == "redisbloom" else 64  # (the bitmap string's header)
    where = 1 if side.backend.name == "redisbloom" else 0
    bits = chunks[where].data[skip:]
    zeroed = bytes(len(bits) // 3) + bits[len(bits) // 3 :]
    forged = list(chunks)
    forged[where] = Chunk(0, chunks[where].cursor, chunks[where].data[:skip] + zeroed)
    state = side.backend.info(side.client, b"users")
    estimate, _spread = estimated_items(state.subfilters[0].bits, state.subfilters[0].hashes, popcount(zeroed))
    items = int(estimate)
    header["items"] = header["members"][0]["items"] = items
    first = bytearray(forged[0].data)
    if side.backend.name == "redisbloom":
        struct.pack_into("<Q", first, 0, items)
        struct.pack_into("<Q", first, HEAD.size + 16, items)
    else:
        struct.pack_into(">q", first, 40, items)
    forged[0] = Chunk(0, forged[0].cursor, bytes(first))
    before = live(side)
    result = restore(side, written(header, forged), tmp_path, "pipe", "users", "--min-ratio", "0.1")
    refused(side, result, before, "set bits, where its fill", "damaged or forged")
    assert _missing(side, names) == 0


def test_the_stretch_check_passes_even_bits_and_refuses_an_empty_stretch():
    """The check itself: bits spread evenly pass at any fill; one empty stretch among full ones is
    named with its place."""
    from bloomctl.backends.base import SubFilterState
    from bloomctl.transfer.dumpfile import DumpCorrupt
    from bloomctl.transfer.scratch import WINDOW_BYTES, BitTally

    size = 64 * WINDOW_BYTES
    for pattern in (b"\x01", b"\x55", b"\xfe"):  # a fill of 1/8, 1/2 and 7/8
        data = pattern * size
        tally = BitTally("f")
        tally.layout([SubFilterState(0, 10**9, 0, 0.01, 7, size * 8, size)])
        tally.add(0, data)
        tally.check([SubFilterState(0, 10**9, 0, 0.01, 7, size * 8, size)])
    data = b"\x55" * (5 * WINDOW_BYTES) + bytes(WINDOW_BYTES) + b"\x55" * (size - 6 * WINDOW_BYTES)
    tally = BitTally("f")
    tally.layout([SubFilterState(0, 10**9, 0, 0.01, 7, size * 8, size)])
    tally.add(0, data)
    with pytest.raises(DumpCorrupt, match=rf"^f: 4,096 bytes of its bits at byte {5 * WINDOW_BYTES:,} hold 0 set bits"):
        tally.check([SubFilterState(0, 10**9, 0, 0.01, 7, size * 8, size)])
