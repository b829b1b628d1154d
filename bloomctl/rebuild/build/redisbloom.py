"""Client-side build for RedisBloom: the module's bits computed here, uploaded with BF.LOADCHUNK.

The layout (bits, hashes, capacity, options) is read from the standby the rebuild reserved, so it
is the server's own, whatever its line (Redis 8 caps error rates, for one). Positions are
RedisBloom's: MurmurHash64A twice (``bloom_calc_hash64``), bit ``(a + i*b) mod bits``, least
significant bit first (``bloom.c``); one link, sized by the plan.

Cutover into the standby, with dual writes in mind: the application may be adding items to the
standby (``BF.INSERT ... NOCREATE``) all along. The built bits go to a companion key of this run
(``build:<generation>``) created from the standby's own header; the standby's bits are read and
ORed in (unless its count is 0: no bits); then one script renames the companion onto the standby
only if BF.CARD of the standby has not changed since it was read (an unchanged count means
unchanged bits: every add that sets a bit counts). When dual writes keep changing it, the
reading is repeated a few times and then the build gives up (``MergeBusy``): the caller finishes
on the server path, which loses nothing.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from bloomctl.errors import StateConflict
from bloomctl.keys import KeyFamily, to_display
from bloomctl.rebuild.build.bits import BitArray, with_dual_writes
from bloomctl.rebuild.build.items import buffers
from bloomctl.rebuild.build.murmur import hash_pair
from bloomctl.server.client import RedisClient

HEADER = struct.Struct("<QIII")  # items, nfilters, options, growth
LINK = struct.Struct("<QQQddIQB")  # bytes, bits, items, error, bpe, hashes, capacity (entries), n2
OPT_NOROUND, OPT_FORCE64, OPT_NO_SCALING = 1, 4, 8
SERVER_COMMANDS = ("bf.scandump", "bf.loadchunk", "bf.card")  # what the layout, the upload and the cutover use
UPLOADS_A_COPY = True  # the bits go to a companion key first: the node holds two copies until the cutover
UPLOAD_CHUNK = 4 << 20  # bytes per BF.LOADCHUNK: ~1 ms on the server (16 MiB: up to 4.5 ms)
MERGE_ROUNDS = 8
BUILD_TTL_MS = 3_600_000  # the build's own key expires: a killed run leaves no full-size copy behind

# KEYS: standby, build companion, standby metadata. ARGV: the standby's BF.CARD when it was read,
# this rebuild's generation. The build replaces the standby only if neither changed since.
CUTOVER_LUA = """
if redis.call('HGET', KEYS[3], 'generation') ~= ARGV[2] then return -1 end
if redis.call('TYPE', KEYS[1])['ok'] ~= 'MBbloom--' or redis.call('TYPE', KEYS[2])['ok'] ~= 'MBbloom--' then
  return -1
end
if tostring(redis.call('BF.CARD', KEYS[1])) ~= ARGV[1] then return 0 end
redis.call('UNLINK', KEYS[1])
redis.call('RENAME', KEYS[2], KEYS[1])
redis.call('PERSIST', KEYS[1])
redis.call('HDEL', KEYS[3], 'build')
return 1
"""


# KEYS: standby metadata. ARGV: generation, the build's key: recorded, so that the next run removes
# it should this one be killed before it could.
MARK_BUILD_LUA = """
if redis.call('HGET', KEYS[1], 'generation') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'build', ARGV[2])
return 1
"""


class MergeBusy(Exception):
    """Dual writes kept changing the standby while its bits were being merged."""


class Unsuitable(Exception):
    """This filter cannot be built in the client (the reason is the message)."""


@dataclass(frozen=True)
class Layout:
    """One RedisBloom link, as the server laid it out (from a SCANDUMP header)."""

    header: bytes
    nbytes: int
    bits: int
    hashes: int
    capacity: int
    nonscaling: bool

    @classmethod
    def parse(cls, header: bytes) -> Layout:
        if len(header) < HEADER.size:
            raise Unsuitable("the standby's SCANDUMP header is too short")
        _items, nfilters, options, _growth = HEADER.unpack_from(header)
        if nfilters != 1 or len(header) != HEADER.size + LINK.size:
            raise Unsuitable(f"the standby has {nfilters} sub-filters (the client builds one)")
        if not options & OPT_FORCE64 or not options & OPT_NOROUND:
            raise Unsuitable(f"the standby's options {options} are not FORCE64|NOROUND")
        nbytes, bits, _size, _error, _bpe, hashes, capacity, n2 = LINK.unpack_from(header, HEADER.size)
        if n2 != 0 or bits != nbytes * 8 or hashes < 1:
            raise Unsuitable("the standby's link is not laid out as bloomctl expects")
        return cls(bytes(header), nbytes, bits, hashes, capacity, bool(options & OPT_NO_SCALING))

    def with_count(self, count: int) -> bytes:
        """The header of this layout holding ``count`` items (in the chain and in its one link)."""
        patched = bytearray(self.header)
        struct.pack_into("<Q", patched, 0, count)
        struct.pack_into("<Q", patched, HEADER.size + 16, count)  # the link's size: after bytes, bits
        return bytes(patched)


def positions(layout: Layout, batch: Any) -> np.ndarray[Any, Any]:
    """The k bit positions of every item of ``batch`` (one row per item)."""
    data, offsets = buffers(batch)
    a, b = hash_pair(data, offsets)
    steps = np.arange(layout.hashes, dtype=np.uint64)
    return (a[:, None] + steps[None, :] * b[:, None]) % np.uint64(layout.bits)


def native_add(native: ModuleType, layout: Layout, bits: np.ndarray[Any, Any], data: Any, offsets: Any) -> int:
    """Set the bits of a batch (its buffer and int64 offsets) with the native kernel; returns
    how many items set a new bit."""
    return int(native.redisbloom_add(data, offsets, 8, bits, layout.bits, layout.hashes))


def new_array(layout: Layout) -> BitArray:
    return BitArray(layout.nbytes, msb_first=False)


def server_count(client: RedisClient, key: bytes) -> int:
    """The items the server counts in the filter at ``key``."""
    return int(client.execute_command("BF.CARD", key))


def read_layout(client: RedisClient, key: bytes) -> Layout:
    _cursor, header = client.execute_command("BF.SCANDUMP", key, 0)
    return Layout.parse(header)


def read_bits(client: RedisClient, key: bytes, layout: Layout) -> np.ndarray[Any, Any]:
    """The filter's bit array, read with BF.SCANDUMP (chunks of at most 16 MiB)."""
    out = np.zeros(layout.nbytes, dtype=np.uint8)
    offset, cursor = 0, 1
    while True:
        cursor, chunk = client.execute_command("BF.SCANDUMP", key, cursor)
        if cursor == 0:
            break
        if offset + len(chunk) > layout.nbytes:
            raise StateConflict("filter %r changed shape while it was read", to_display(key))
        out[offset : offset + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
        offset += len(chunk)
    if offset != layout.nbytes:
        raise StateConflict("filter %r gave %s bytes, expected %s", to_display(key), offset, layout.nbytes)
    return out


def upload_chunks(client: RedisClient, key: bytes, data: np.ndarray[Any, Any], starts: list[int]) -> int:
    """BF.LOADCHUNK the chunks of ``data`` that begin at ``starts``; returns the bytes sent."""
    sent = 0
    pipe = client.pipeline(transaction=False)
    for start in starts:
        chunk = data[start : start + UPLOAD_CHUNK].tobytes()
        pipe.execute_command("BF.LOADCHUNK", key, 1 + start + len(chunk), chunk)
        sent += len(chunk)
        if len(pipe) >= 4:
            pipe.execute()
    pipe.execute()
    return sent


def nonzero_chunks(data: np.ndarray[Any, Any]) -> list[int]:
    """Starts of the upload chunks that hold a set bit (a new filter is all zeros already)."""
    return [start for start in range(0, len(data), UPLOAD_CHUNK) if data[start : start + UPLOAD_CHUNK].any()]


def merge_read(array: BitArray, read: np.ndarray[Any, Any]) -> list[int]:
    """OR bits read back from the standby into ``array``; returns the starts of the upload chunks
    that gained a bit (without a second copy of the array)."""
    changed = []
    for start in range(0, len(read), UPLOAD_CHUNK):
        ours, theirs = array.data[start : start + UPLOAD_CHUNK], read[start : start + UPLOAD_CHUNK]
        if np.any(theirs & ~ours):
            np.bitwise_or(ours, theirs, out=ours)
            changed.append(start)
    return changed


def finish(client: RedisClient, family: KeyFamily, layout: Layout, array: BitArray, generation: str, check: Any) -> int:
    """Put the built bits into the standby (``family.standby``), merging what dual writes put there.
    ``check`` raises when the run lost its lock. Returns the bytes uploaded.

    The build's own key (``build:<generation>``, expiring, so no other run can touch it and a
    killed run leaves nothing for long) is filled first; then each attempt reads the standby's
    count, reads its bits only if the count moved since the last merge (a count of 0: no bits),
    uploads the chunks that gained bits, and cuts over if the count still has not moved. The
    header counts this build's items plus the standby's own when the upload began (dual writes,
    as the bitmap backend counts them; where items both built and written make the sum pass what
    the merged bits hold, what a server counts for those bits: ``with_dual_writes``)."""
    build = family.companion(f"build:{generation}")
    try:
        if not int(client.register_script(MARK_BUILD_LUA)(keys=[family.standby_meta], args=[generation, build])):
            raise StateConflict("the standby %r was replaced by another run", to_display(family.standby))
        # the standby's count, then its bits (see the rounds below): merged first, so that the
        # count the header records is settled against both
        card = int(client.execute_command("BF.CARD", family.standby))
        if card:
            merge_read(array, read_bits(client, family.standby, layout))
        count = with_dual_writes(array.count, card, array.data, layout.bits, layout.hashes, layout.capacity)
        client.execute_command("BF.LOADCHUNK", build, 1, layout.with_count(count))
        client.pexpire(build, BUILD_TTL_MS)  # type: ignore[attr-defined]
        sent = upload_chunks(client, build, array.data, nonzero_chunks(array.data))
        script = client.register_script(CUTOVER_LUA)
        merged = card  # the standby's count when its bits were last merged (0: nothing to merge)
        for _round in range(MERGE_ROUNDS):
            check()
            seen = int(client.execute_command("BF.CARD", family.standby))  # before the read: see above
            if seen != merged:
                sent += upload_chunks(
                    client, build, array.data, merge_read(array, read_bits(client, family.standby, layout))
                )
                merged = seen
            done = int(script(keys=[family.standby, build, family.standby_meta], args=[seen, generation]))
            if done == 1:
                return sent
            if done < 0:
                raise StateConflict("the standby %r was replaced by another run", to_display(family.standby))
        raise MergeBusy(f"dual writes changed {to_display(family.standby)!r} during {MERGE_ROUNDS} merges")
    finally:
        client.unlink(build)  # gone already after a cutover; else what a failed upload left
