"""Client-side build for the bitmap backend: format-1 bits computed here, ORed into the standby.

Positions are hash scheme 1 (``bloomctl.backends.bitmap.positions``): SHA-1 of the item, two
48-bit halves, ``(h1 + i*h2) mod m``; bit ``p`` of the filter is string bit ``512 + p`` (Redis's
bit order). The standby is a plain string, so the upload needs no rename: each chunk of bits is
ORed into it by one short script (SET a scratch key, BITOP OR, SETRANGE), atomically, so a dual
write (``FCALL bloomctl_add``) that lands between two chunks is never overwritten. The items
field of the header then grows by this build's count, in one script too.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from bloomctl.backends.bitmap import HEADER, HEADER_BYTES, MAGIC
from bloomctl.errors import StateConflict
from bloomctl.keys import KeyFamily, to_display
from bloomctl.rebuild.build.bits import BitArray, with_dual_writes
from bloomctl.server.client import RedisClient
from bloomctl.sources.base import item_list

SERVER_COMMANDS: tuple[str, ...] = ()  # the function library's, or plain string commands: every server has them
UPLOADS_A_COPY = False  # each chunk is ORed into the standby in place
UPLOAD_CHUNK = 1 << 18  # bytes ORed per script (GETRANGE, BITOP, SETRANGE): 256 KiB ~1-1.7 ms, 1 MiB up to 6.7 ms
ITEMS_OFFSET = 40  # the header's i64 item count

# KEYS: standby, scratch a, scratch b, standby metadata. ARGV: generation, byte offset in the
# string, the chunk. ORs the chunk into the standby's bytes at that offset.
OR_CHUNK_LUA = """
if redis.call('HGET', KEYS[4], 'generation') ~= ARGV[1] then return -1 end
if redis.call('GETRANGE', KEYS[1], 0, 7) ~= 'bloomctl' then return -1 end
local offset = tonumber(ARGV[2])
redis.call('SET', KEYS[2], ARGV[3])
redis.call('SET', KEYS[3], redis.call('GETRANGE', KEYS[1], offset, offset + #ARGV[3] - 1))
redis.call('BITOP', 'OR', KEYS[3], KEYS[3], KEYS[2])
redis.call('SETRANGE', KEYS[1], offset, redis.call('GET', KEYS[3]))
redis.call('DEL', KEYS[2], KEYS[3])
return 1
"""

# KEYS: standby, standby metadata. ARGV: generation, items to add to the header's count.
ADD_COUNT_LUA = """
if redis.call('HGET', KEYS[2], 'generation') ~= ARGV[1] then return -1 end
local raw = redis.call('GETRANGE', KEYS[1], 40, 47)
if #raw ~= 8 then return -1 end
local items = struct.unpack('>i8', raw)
redis.call('SETRANGE', KEYS[1], 40, struct.pack('>i8', items + tonumber(ARGV[2])))
return items + tonumber(ARGV[2])
"""


class Unsuitable(Exception):
    """This filter cannot be built in the client (the reason is the message)."""


@dataclass(frozen=True)
class Layout:
    nbytes: int
    bits: int
    hashes: int
    capacity: int
    nonscaling: bool = True  # a bitmap filter never grows

    @classmethod
    def parse(cls, head: bytes) -> Layout:
        if len(head) < HEADER_BYTES or not head.startswith(MAGIC):
            raise Unsuitable("the standby is not a bloomctl bitmap filter")
        _magic, fmt, scheme, _pad, k, m, capacity, _error, _items = HEADER.unpack_from(head)
        if fmt != 1 or scheme != 1 or m % 64 or k < 1:
            raise Unsuitable(f"the standby's format {fmt} / hash scheme {scheme} is not the client build's")
        return cls(m // 8, m, k, capacity)


def positions(layout: Layout, batch: Any) -> np.ndarray[Any, Any]:
    """Scheme 1 positions of every item (one row per item), SHA-1 computed one item at a time."""
    items = item_list(batch)
    digests = np.frombuffer(b"".join([hashlib.sha1(item).digest() for item in items]), dtype=np.uint8)
    digests = digests.reshape(len(items), 20)[:, :12].astype(np.uint64)
    weights = np.uint64(256) ** np.arange(5, -1, -1, dtype=np.uint64)  # big-endian 6-byte integers
    h1 = (digests[:, :6] * weights).sum(axis=1, dtype=np.uint64)
    h2 = (digests[:, 6:] * weights).sum(axis=1, dtype=np.uint64)
    m = np.uint64(layout.bits)
    start = h1 % m
    step = h2 % m
    step[step == 0] = 1
    offsets = np.arange(layout.hashes, dtype=np.uint64)[None, :] * step[:, None]
    return (start[:, None] + offsets) % m


def native_add(native: ModuleType, layout: Layout, bits: np.ndarray[Any, Any], data: Any, offsets: Any) -> int:
    """Set the scheme-1 bits of a batch (its buffer and int64 offsets) with the native kernel;
    returns how many items set a new bit."""
    return int(native.bitmap_add(data, offsets, 8, bits, layout.bits, layout.hashes))


def new_array(layout: Layout) -> BitArray:
    return BitArray(layout.nbytes, msb_first=True)


def read_layout(client: RedisClient, key: bytes) -> Layout:
    return Layout.parse(client.getrange(key, 0, HEADER_BYTES - 1))  # type: ignore[attr-defined]


def read_bits(client: RedisClient, key: bytes, layout: Layout) -> np.ndarray[Any, Any]:
    out = np.zeros(layout.nbytes, dtype=np.uint8)
    for start in range(0, layout.nbytes, UPLOAD_CHUNK):
        end = min(start + UPLOAD_CHUNK, layout.nbytes)
        raw = client.getrange(key, HEADER_BYTES + start, HEADER_BYTES + end - 1)  # type: ignore[attr-defined]
        out[start : start + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return out


def finish(client: RedisClient, family: KeyFamily, layout: Layout, array: BitArray, generation: str, check: Any) -> int:
    """OR the built bits into the standby, chunk by chunk, then add the count. Returns bytes sent."""
    scratch = [family.companion("build"), family.companion("build:or")]
    or_chunk = client.register_script(OR_CHUNK_LUA)
    sent = 0
    for start in range(0, layout.nbytes, UPLOAD_CHUNK):
        chunk = array.data[start : start + UPLOAD_CHUNK]
        if not chunk.any():
            continue
        check()
        done = or_chunk(
            keys=[family.standby, *scratch, family.standby_meta],
            args=[generation, HEADER_BYTES + start, chunk.tobytes()],
        )
        if int(done) != 1:
            raise StateConflict("the standby %r was replaced by another run", to_display(family.standby))
        sent += len(chunk)
    check()
    # the application's dual writes counted ``theirs``; where items both built and written make
    # the sum pass what the bits hold, the count is settled against the standby's bits, which hold
    # both now (writes after the count was read are added as they come)
    theirs = server_count(client, family.standby)
    count = array.count + theirs
    if theirs:
        union = read_bits(client, family.standby, layout)
        count = with_dual_writes(array.count, theirs, union, layout.bits, layout.hashes, layout.capacity)
    added = client.register_script(ADD_COUNT_LUA)(
        keys=[family.standby, family.standby_meta], args=[generation, count - theirs]
    )
    if int(added) < 0:
        raise StateConflict("the standby %r was replaced by another run", to_display(family.standby))
    return sent


def header_count(head: bytes) -> int:
    return int(struct.unpack_from(">q", head, ITEMS_OFFSET)[0])


def server_count(client: RedisClient, key: bytes) -> int:
    """The items the header of the filter at ``key`` counts."""
    return header_count(client.getrange(key, 0, HEADER_BYTES - 1))  # type: ignore[attr-defined]
