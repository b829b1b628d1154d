"""Load one dumped member into its scratch key, and check what was loaded against the dump's header.

A restore never writes into the standby itself: a dual write landing between two chunks would be
overwritten by the next. The chunks go to a scratch key of the member's (with a TTL, so that a
killed restore leaves nothing for long): through the backend's load command, or for a filter kept
in one string as one SET whose value streams from here. The backend checks the first chunk
against the dump's header as it arrives; ``check`` compares the loaded filter with it at the end.

A header is only a claim: a Bloom filter's set bits are counted as its chunks pass (``BitTally``)
and must hold about the items its header counts, a cuckoo filter's fingerprints exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bloomctl.backends import Backend
from bloomctl.backends.base import DumpMismatch, SubFilterState
from bloomctl.backends.chunks import chunk_start
from bloomctl.backends.strings import HEADER_BYTES
from bloomctl.defaults import COUNT_TOLERANCE
from bloomctl.errors import UnsupportedServer, VerifyFailed
from bloomctl.keys import KeyFamily
from bloomctl.lifecycle.standby import is_out_of_memory
from bloomctl.server.client import NodeClient, RedisClient
from bloomctl.server.topology import node_client
from bloomctl.transfer.dumpfile import Chunk, DumpCorrupt

SCRATCH_TTL_MS = 3_600_000  # a killed restore's scratch key drops itself after an hour
# A sub-filter whose bits hold fewer items than its header counts by more than this many standard
# deviations of the estimate, plus a few items for the smallest filters, is refused: far beyond the
# spread measured on honest dumps of both Bloom backends (docs/dump-format.md), far below what one
# chunk without its bits takes away.
TOLERANCE_SIGMAS = 8.0
TOLERANCE_ITEMS = 3


def popcount(data: bytes) -> int:
    """The set bits of ``data``: numpy 2 counts 16 MiB in 5 ms where Python takes 35, but is optional."""
    try:
        from numpy import bitwise_count, frombuffer, uint64
    except ImportError:  # (numpy before 2.0 has no bitwise_count)
        return int.from_bytes(data, "little").bit_count()
    words = len(data) // 8
    tail = int.from_bytes(data[words * 8 :], "little").bit_count()
    return int(bitwise_count(frombuffer(data, uint64, words)).sum()) + tail


WINDOW_BYTES = 4096  # the stretch of bits whose fill is compared with its sub-filter's
WINDOW_SIGMAS = 8.0  # a stretch this many standard deviations emptier than its sub-filter is refused


def sparsest_window(data: bytes) -> tuple[int, int] | None:
    """The fewest set bits in a whole ``WINDOW_BYTES`` stretch of ``data`` (from its start), and
    where that stretch begins; None when ``data`` holds no whole stretch."""
    windows = len(data) // WINDOW_BYTES
    if not windows:
        return None
    try:
        from numpy import bitwise_count, frombuffer, uint64
    except ImportError:  # (numpy before 2.0 has no bitwise_count)
        counts = [
            int.from_bytes(data[i * WINDOW_BYTES : (i + 1) * WINDOW_BYTES], "little").bit_count()
            for i in range(windows)
        ]
        least = min(range(windows), key=counts.__getitem__)
        return counts[least], least * WINDOW_BYTES
    words = frombuffer(data, uint64, windows * WINDOW_BYTES // 8).reshape(windows, WINDOW_BYTES // 8)
    sums = bitwise_count(words).sum(axis=1, dtype="int64")
    least = int(sums.argmin())
    return int(sums[least]), least * WINDOW_BYTES


def estimated_items(bits: int, hashes: int, bits_set: int) -> tuple[float, float]:
    """The items a Bloom sub-filter of ``bits`` and ``hashes`` holds, from its ``bits_set`` X:
    n = -(m/k) ln(1 - X/m), and the standard deviation of that estimate, sqrt(m (e^l - 1 - l)) / k
    with l = -ln(1 - X/m) (Swamidass and Baldi, 2007). A saturated one could hold any number."""
    if bits_set >= bits:
        return math.inf, math.inf
    fill = abs(math.log1p(-bits_set / bits))
    return bits * fill / hashes, math.sqrt(bits * max(math.expm1(fill) - fill, 0.0)) / hashes


class BitTally:
    """A Bloom filter's set bits per sub-filter, counted as its data passes on its way to the
    server, in order and to its last byte; ``check`` then compares them with the items the loaded
    filter counts. A header with no data, or a chunk zeroed, claims items whose bits are not there:
    a swap would trust that count, and every one of those items would be missing."""

    def __init__(self, name: str, *, count_bits: bool = True) -> None:
        self.name = name
        self.count_bits = count_bits  # False: only where each chunk lands (a cuckoo filter's slots)
        self.offset = 0  # the next byte of the data
        self.ends: list[int] | None = None  # each sub-filter's end in the data, once the header is loaded
        self.counts = [0]
        self.sparsest: list[tuple[int, int] | None] = [None]  # per sub-filter: (set bits, byte) of its emptiest stretch
        self.current = 0

    def layout(self, subs: Sequence[SubFilterState]) -> None:
        """The sub-filters as the loaded header declares them (a filter in one string has one)."""
        self.layout_sizes([sub.bytes for sub in subs])

    def layout_sizes(self, sizes: Sequence[int]) -> None:
        """Each sub-filter's bytes, in order."""
        self.ends = []
        for size in sizes:
            self.ends.append((self.ends[-1] if self.ends else 0) + size)
        self.counts += [0] * (len(self.ends) - len(self.counts))  # (a string's bits were counted before)
        self.sparsest += [None] * (len(self.ends) - len(self.sparsest))

    def add(self, start: int, data: bytes) -> None:
        """The data at byte ``start`` of the filter's bits: the next, inside one sub-filter."""
        end = start + len(data)
        if start != self.offset:
            raise DumpCorrupt(
                "%s: a chunk at byte %s of the filter's bits where %s was next", self.name, start, self.offset
            )
        if self.ends is not None:
            while self.current < len(self.ends) and start >= self.ends[self.current]:
                self.current += 1
            if self.current == len(self.ends) or end > self.ends[self.current]:
                raise DumpCorrupt(
                    "%s: a chunk at byte %s of the filter's bits runs past its sub-filters (%s bytes)",
                    self.name,
                    f"{start:,}",
                    f"{self.ends[-1] if self.ends else 0:,}",
                )
        if self.count_bits:
            self.counts[self.current] += popcount(data)
            window = sparsest_window(data)
            known = self.sparsest[self.current]
            if window is not None and (known is None or window[0] < known[0]):
                self.sparsest[self.current] = (window[0], start + window[1])
        self.offset = end

    def check(self, subs: Sequence[SubFilterState]) -> None:
        """Every byte of the sub-filters arrived, and each one's bits hold about the items it counts
        (fewer by more than the estimate's spread allows is refused; more is a filter that took
        items while it was dumped, or is past its capacity)."""
        if self.ends is None:
            self.layout(subs)
        self.covered()
        self.check_counts(subs)

    def covered(self) -> None:
        """Every byte of the sub-filters arrived, each once (a chunk sent twice in place of another
        is refused as it arrives: it does not start where the last one ended)."""
        assert self.ends is not None
        total = self.ends[-1] if self.ends else 0
        if self.offset != total:
            raise DumpCorrupt(
                "%s: the dump holds %s of the %s bytes of the filter's bits: it is truncated or forged",
                self.name,
                f"{self.offset:,}",
                f"{total:,}",
            )

    def check_counts(self, subs: Sequence[SubFilterState]) -> None:
        """Each sub-filter's bits hold about the items it counts, and none of its stretches is far
        emptier than the whole: an item's bits are spread over its sub-filter, so a stretch zeroed
        with the count lowered to match loses most items, while the estimate sees a smaller filter."""
        for sub, bits_set in zip(subs, self.counts, strict=True):
            estimate, spread = estimated_items(sub.bits, sub.hashes, bits_set)
            # (the share a parallel build may leave, so that a dump of any filter bloomctl built restores)
            if sub.items - estimate > max(TOLERANCE_SIGMAS * spread, COUNT_TOLERANCE * estimate) + TOLERANCE_ITEMS:
                raise DumpCorrupt(
                    "%s: its bits hold about %s items%s, its header counts %s: the dump is damaged or forged "
                    "(those items would be missing); dump the filter again (a filter whose count is above its "
                    "bits for another reason, such as items counted twice: rebuild it, then dump it)",
                    self.name,
                    f"{estimate:,.0f}",
                    f" in sub-filter {sub.index}" if len(subs) > 1 else "",
                    f"{sub.items:,}",
                )
        for sub, bits_set, sparsest in zip(subs, self.counts, self.sparsest, strict=True):
            self._check_sparsest(sub, bits_set, sparsest, len(subs))

    def _check_sparsest(self, sub: SubFilterState, bits_set: int, sparsest: tuple[int, int] | None, subs: int) -> None:
        if sparsest is None or not sub.bits:
            return
        fill = bits_set / sub.bits
        width = WINDOW_BYTES * 8
        spread = math.sqrt(width * fill * (1 - fill))
        floor = width * fill - WINDOW_SIGMAS * spread - 16  # (16: near a full fill, the few unset bits)
        if sparsest[0] < floor:
            raise DumpCorrupt(
                "%s: %s bytes of its bits at byte %s%s hold %s set bits, where its fill (%.1f%%) gives about %s: "
                "the dump is damaged or forged (those items would be missing); dump the filter again",
                self.name,
                f"{WINDOW_BYTES:,}",
                f"{sparsest[1]:,}",
                f" (sub-filter {sub.index})" if subs > 1 else "",
                f"{sparsest[0]:,}",
                fill * 100,
                f"{width * fill:,.0f}",
            )


class StreamedSet:
    """``SET key value`` sent in pieces on a connection of its own: the value is never whole in the
    client, and the server executes the command once its last byte has arrived."""

    def __init__(self, node: NodeClient, key: bytes, size: int) -> None:
        self.pool = node.connection_pool
        try:
            self.connection = self.pool.get_connection()
        except TypeError:  # redis-py 5: the command name is a required argument
            self.connection = self.pool.get_connection("SET")
        self.size, self.sent = size, 0
        try:
            head = b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(key), key, size)
            self.connection.send_packed_command([head])
        except BaseException:
            self.abort()
            raise

    def send(self, data: bytes) -> None:
        try:
            self.connection.send_packed_command([data], check_health=False)
        except BaseException:
            self.abort()
            raise
        self.sent += len(data)

    def finish(self) -> None:
        if self.sent != self.size:
            self.abort()
            raise DumpCorrupt("the dump holds %s bytes of a bitmap filter of %s", f"{self.sent:,}", f"{self.size:,}")
        try:
            ttl = str(SCRATCH_TTL_MS).encode()  # SET ... PX: the scratch key is never without its TTL
            self.connection.send_packed_command(
                [b"\r\n$2\r\nPX\r\n$%d\r\n%s\r\n" % (len(ttl), ttl)], check_health=False
            )
            self.connection.read_response()
        except BaseException:
            self.abort()
            raise
        self.pool.release(self.connection)

    def abort(self) -> None:
        """Close the connection: the server drops the unfinished command with it."""
        self.connection.disconnect()
        self.pool.release(self.connection)


class ScratchWriter:
    """Writes one member's chunks into its scratch key."""

    def __init__(
        self, client: RedisClient, backend: Backend, family: KeyFamily, member: dict[str, Any], name: str
    ) -> None:
        self.client, self.backend, self.family, self.member, self.name = client, backend, family, member, name
        self.scratch = family.companion("restore")
        self.scratch_meta = family.companion("restore:meta")
        self.started = False
        self.offset = 0
        self.streamed: StreamedSet | None = None
        self.fingerprints = 0  # a cuckoo filter's taken slots, counted as the chunks pass
        self.counted_items: int | None = None  # and the item count its own header holds
        self.tally = BitTally(name) if backend.kind == "bloom" else None  # a Bloom filter's set bits
        self.slots: BitTally | None = None  # where a chunked cuckoo filter's chunks land: each slot once

    def write(self, chunk: Chunk) -> None:
        import redis

        command = self.backend.load_command
        if command is None:
            self._write_slice(chunk)
            self.started = True
            return
        if not self.started:
            self.counted_items = self._check_first(chunk)
            sizes = self.backend.data_sizes(self.member)
            if sizes is not None:
                self.slots = BitTally(self.name, count_bits=False)
                self.slots.layout_sizes(sizes)
        else:
            self.fingerprints += self._fingerprints(chunk)
            for tally in (self.tally, self.slots):
                if tally is not None:
                    tally.add(chunk_start(chunk.cursor, len(chunk.data)), chunk.data)
        try:
            if not self.started:  # the header creates the key: with its TTL, in one MULTI
                pipe = self.client.pipeline(transaction=True)
                pipe.execute_command(command, self.scratch, chunk.cursor, chunk.data)
                pipe.pexpire(self.scratch, SCRATCH_TTL_MS)
                pipe.execute()
            else:
                for load in self.backend.load_commands(self.scratch, chunk.cursor, chunk.data):
                    self.client.execute_command(*load)
        except redis.exceptions.ResponseError as exc:
            if is_out_of_memory(exc):
                raise
            raise UnsupportedServer(
                "the server cannot load chunk at %s of %s (%s): rebuild the filter from the source",
                chunk.cursor,
                self.name,
                str(exc),
            ) from None
        if not self.started and self.tally is not None:  # the sub-filters' sizes, from the header just loaded
            self.tally.layout(self.backend.info(self.client, self.scratch).subfilters)
        self.started = True

    def _check_first(self, chunk: Chunk) -> int | None:
        """The backend's check of the member's first chunk against the dump's header."""
        try:
            return self.backend.check_first_chunk(chunk.data, self.member)
        except DumpMismatch as exc:
            raise DumpCorrupt("%s: %s", self.name, str(exc)) from None

    def _fingerprints(self, chunk: Chunk) -> int:
        try:
            return self.backend.fingerprints_in(chunk.data, chunk.cursor, self.member)
        except DumpMismatch as exc:
            raise DumpCorrupt(str(exc)) from None

    def _reserve_empty(self, reserve: tuple[Any, ...]) -> None:
        """A member whose dump holds no chunks is reserved anew, with the scratch key's TTL, in one MULTI."""
        pipe = self.client.pipeline(transaction=True)
        pipe.execute_command(*reserve)
        pipe.pexpire(self.scratch, SCRATCH_TTL_MS)
        pipe.execute()
        self.started = True

    def _write_slice(self, chunk: Chunk) -> None:
        """A filter kept in one string arrives as one SET whose value streams from here as the slices
        come: the server reads it between other clients' commands and stores it without a copy, so
        no command of the restore blocks it (slices written with SETRANGE cost one allocation of the
        whole string, 82 ms for 120 MB, or reallocations as it grew). Until the last byte, nothing
        exists; a failure closes the connection and the server drops the partial command."""
        size = int(self.member["size_bytes"])
        if chunk.cursor != self.offset or self.offset + len(chunk.data) > size:
            raise DumpCorrupt(
                "%s: a slice at byte %s where %s was next, of %s", self.name, chunk.cursor, self.offset, size
            )
        if not self.started:
            self.counted_items = self._check_first(chunk)
            self.streamed = StreamedSet(node_client(self.client, self.scratch), self.scratch, size)
        self.fingerprints += self._fingerprints(chunk)
        if self.tally is not None:  # the string's bits follow its header
            skip = max(HEADER_BYTES - chunk.cursor, 0)
            self.tally.add(chunk.cursor + skip - HEADER_BYTES, chunk.data[skip:])
        assert self.streamed is not None
        self.streamed.send(chunk.data)
        self.offset += len(chunk.data)

    def finish(self) -> None:
        """The end of a streamed string: the server stores it now, with its TTL."""
        if self.streamed is not None:
            streamed, self.streamed = self.streamed, None
            streamed.finish()

    def abort(self) -> None:
        if self.streamed is not None:
            streamed, self.streamed = self.streamed, None
            streamed.abort()

    def check(self) -> None:
        """The loaded scratch key is the filter the dump's header describes (its size and layout; at
        least its items)."""
        member = self.member
        if not self.started:
            reserve = self.backend.reserve_like(self.scratch, member)
            if reserve is None:
                raise DumpCorrupt("%s: the dump holds no chunks for it", self.name)
            self._reserve_empty(reserve)
            return
        if self.slots is not None:
            self.slots.covered()
        if self.counted_items is not None and self.counted_items != self.fingerprints:
            # every fingerprint is one item a filter counted: a dump that says otherwise is forged, or was
            # read while the filter changed (a restored filter with a wrong count could not be dumped again)
            raise DumpCorrupt(
                "%s: the cuckoo filter holds %s fingerprints, its header counts %s items: the dump is inconsistent",
                self.name,
                f"{self.fingerprints:,}",
                f"{self.counted_items:,}",
            )
        self.backend.check_loaded(self.client, self.scratch, member, self.name)
        state = self.backend.info(self.client, self.scratch, with_header=self.tally is not None)
        # the items may have grown while the member was dumped (its chunks then hold them too); a
        # filter that deletes items may hold fewer
        fewer = state.items < member["items"] and not self.backend.removes_items
        if (state.size_bytes, state.filters) != (member["size_bytes"], member["filters"]) or fewer:
            raise VerifyFailed(
                "%s: the restored filter has %s items in %s bytes, the dump says %s items (or more) in %s bytes",
                self.name,
                f"{state.items:,}",
                f"{state.size_bytes:,}",
                f"{member['items']:,}",
                f"{member['size_bytes']:,}",
            )
        if self.tally is not None:
            self.tally.check(state.subfilters)
