"""The portable dump file: one filter (or every member of a sharded one), streamed in constant memory.

Layout (integers big-endian), documented in docs/dump-format.md::

    b"BLOOMCTL-DUMP\\n"                    14 bytes, the magic
    u16 version                           1
    u32 n, n bytes of header JSON, u32 CRC-32 of those n bytes
    records, each starting with one byte:
      b"M"  u16 member                    the chunks that follow belong to member `member` (0 unless sharded)
      b"C"  u64 cursor, u32 n, n bytes, u32 CRC-32 of (cursor and bytes)
                                          one chunk: BF.SCANDUMP's iterator and data, or for the bitmap
                                          backend the byte offset of a slice of the string
      b"Z"  u64 chunks, u64 bytes, 32 bytes SHA-256 of everything before this b"Z"
                                          the end; nothing may follow it

A reader checks each chunk's CRC before handing it on and the SHA-256 at the end, so a restore
refuses a corrupt or truncated file having written nothing but its scratch key, which it removes.
Reading a regular file, it also checks at once that the file holds the bytes its header declares:
a server reserves a filter's whole size when it loads the filter's header.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from bloomctl.errors import BloomctlError, SourceError

MAGIC = b"BLOOMCTL-DUMP\n"
VERSION = 1
FORMAT = "bloomctl-dump"
MAX_HEADER = 1 << 20  # a header is a few hundred bytes: more means the file is not what it says
MAX_CHUNK = 1 << 28  # SCANDUMP sends sub-filters in chunks of at most 16 MiB; bitmap slices are 1 MiB

# A filter's reported size counts its structs, which its dump does not carry: RedisBloom's are 32
# bytes, and 64 per sub-filter, more than its header chunk; a cuckoo filter's fewer.
SIZE_BEYOND_DATA = 64  # bytes per member, and per sub-filter

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_CHUNK = struct.Struct(">QI")  # cursor, length
_END = struct.Struct(">QQ32s")  # chunks, bytes, sha256


class DumpCorrupt(SourceError):
    """The dump file is not a bloomctl dump, is of a later version, or fails a checksum or its length."""


@dataclass(frozen=True)
class Chunk:
    member: int
    cursor: int
    data: bytes


class _Hashing:
    """A binary stream that hashes every byte written or read through it."""

    def __init__(self, stream: IO[bytes], name: str = "the dump") -> None:
        self.stream = stream
        self.name = name
        self.sha = hashlib.sha256()
        self.count = 0

    def write(self, data: bytes) -> None:
        self.stream.write(data)
        self.sha.update(data)

    def read(self, size: int, what: str) -> bytes:
        data = self.stream.read(size)
        if len(data) != size:
            raise DumpCorrupt("%s is truncated: it ends inside %s (after %s bytes)", self.name, what, f"{self.count:,}")
        self.sha.update(data)
        self.count += size
        return data


def write(out: IO[bytes], header: dict[str, Any], chunks: Iterator[Chunk]) -> tuple[int, int]:
    """Write the dump of ``header`` and ``chunks`` to ``out``; returns (chunks, bytes of chunk data)."""
    stream = _Hashing(out)
    body = json.dumps({"format": FORMAT, "version": VERSION, **header}, sort_keys=True).encode()
    stream.write(MAGIC + _U16.pack(VERSION) + _U32.pack(len(body)) + body + _U32.pack(zlib.crc32(body)))
    member, count, total = 0, 0, 0
    for chunk in chunks:
        if chunk.member != member:
            stream.write(b"M" + _U16.pack(chunk.member))
            member = chunk.member
        head = _CHUNK.pack(chunk.cursor, len(chunk.data))
        stream.write(b"C" + head)  # three writes: a 16 MiB chunk is not copied into one buffer
        stream.write(chunk.data)
        stream.write(_U32.pack(zlib.crc32(chunk.data, zlib.crc32(head[:8]))))
        count, total = count + 1, total + len(chunk.data)
    out.write(b"Z" + _END.pack(count, total, stream.sha.digest()))  # the digest covers what came before
    return count, total


def _bytes_left(stream: IO[bytes]) -> int | None:
    """The bytes from the stream's position to its end when it is a regular file; None for a pipe,
    a terminal, a socket, or a stream without a file."""
    try:
        info = os.fstat(stream.fileno())
        return info.st_size - stream.tell() if stat.S_ISREG(info.st_mode) else None
    except (AttributeError, OSError, ValueError):  # (io.UnsupportedOperation is both of the last two)
        return None


def _chunk_bytes(stream: IO[bytes], left: int, name: str) -> int | None:
    """The bytes of chunk data the records after the header hold, walked by their headers (each
    chunk's data skipped with a seek), up to the end record, or to where the walk breaks (a record
    the reader will refuse with its own words, a chunk past the file's end): only the chunks before
    it can be loaded, and a sparse run of zeros in place of data and end record holds none. None
    where the stream cannot seek. Bytes after the end record are refused here. The stream is put
    back where it was."""
    try:
        start = stream.tell()
    except (AttributeError, OSError, ValueError):
        return None
    end, total = start + left, 0
    try:
        while True:
            kind = stream.read(1)
            if kind == b"M":
                stream.seek(_U16.size, os.SEEK_CUR)
            elif kind == b"C":
                head = stream.read(_CHUNK.size)
                if len(head) != _CHUNK.size:
                    return total
                length = _CHUNK.unpack(head)[1]
                if stream.tell() + length + _U32.size > end:
                    return total  # its data runs past the file's end
                total += length
                stream.seek(length + _U32.size, os.SEEK_CUR)
            elif kind == b"Z":
                if stream.tell() + _END.size < end:
                    raise DumpCorrupt("%s is corrupt: bytes follow its end", name)
                return total
            else:
                return total
            if stream.tell() > end:
                return total
    except (OSError, ValueError):
        return total
    finally:
        stream.seek(start)


def declared_data(header: dict[str, Any]) -> int | None:
    """The least number of bytes of chunk data a dump of ``header``'s members holds (each member's
    size less its structs; none for an empty filter that the server dumps without chunks, which
    a restore reserves anew); None for a header without well-formed members (a restore refuses it)."""
    from bloomctl import backends

    members = header.get("members")
    if not isinstance(members, list) or header.get("backend") not in backends.names():
        return None
    total = 0
    for member in members:
        size, filters = (member.get("size_bytes"), member.get("filters")) if isinstance(member, dict) else (None, None)
        if not (isinstance(size, int) and isinstance(filters, int) and size >= 0 and filters >= 0):
            return None  # (a bool is refused with the rest of the header)
        chunkless = _chunkless(header, member)
        if chunkless is None:  # a malformed member: refused later
            return None
        total += 0 if chunkless else max(size - SIZE_BEYOND_DATA * (filters + 1), 0)
    return total


def _chunkless(header: dict[str, Any], member: Any) -> bool | None:
    """Whether a member is an empty filter the server dumps without chunks (reserved anew by a
    restore); None for a malformed one."""
    from bloomctl import backends

    try:
        return backends.get(header["backend"]).reserve_like(b"", member) is not None
    except (BloomctlError, LookupError, TypeError, ValueError):
        return None


class Reader:
    """Reads a dump: ``header`` at once, then ``chunks()`` one at a time, each checked; the end
    (counts and SHA-256) is checked when the last chunk has been handed on."""

    def __init__(self, stream: IO[bytes], name: str = "the dump") -> None:
        self.name = name
        self.stream = _Hashing(stream, name)
        magic = stream.read(len(MAGIC))
        if magic != MAGIC:
            raise DumpCorrupt("%s is not a bloomctl dump (it does not start with %r)", name, MAGIC.decode().strip())
        self.stream.sha.update(magic)
        self.stream.count = len(magic)
        (version,) = _U16.unpack(self.stream.read(2, "the version"))
        if version != VERSION:
            raise DumpCorrupt(
                "%s is format version %s; this bloomctl reads version %s (upgrade bloomctl)", name, version, VERSION
            )
        (length,) = _U32.unpack(self.stream.read(4, "the header"))
        if length > MAX_HEADER:
            raise DumpCorrupt("%s is corrupt: a header of %s bytes", name, f"{length:,}")
        body = self.stream.read(length, "the header")
        (crc,) = _U32.unpack(self.stream.read(4, "the header"))
        if zlib.crc32(body) != crc:
            raise DumpCorrupt("%s is corrupt: the header's checksum does not match", name)
        try:
            header = json.loads(body)
        except ValueError:
            raise DumpCorrupt("%s is corrupt: its header is not JSON", name) from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise DumpCorrupt("%s is corrupt: its header is not a bloomctl dump's", name)
        self.header: dict[str, Any] = header
        self.chunk_count = 0
        self.bytes = 0
        self.file_bytes = _bytes_left(stream)  # what follows the header, in a regular file; else None
        declared = declared_data(header)
        if self.file_bytes is not None and declared is not None and self.file_bytes < declared:
            raise DumpCorrupt(
                "%s is truncated or forged: its header declares filters of at least %s bytes, and %s bytes follow it",
                name,
                f"{declared:,}",
                f"{self.file_bytes:,}",
            )
        # The file's length counts any bytes, a (sparse) tail of zeros after the end record too: the
        # chunks' own lengths are what a restore loads, read from their headers before anything is
        # reserved on the server.
        held = _chunk_bytes(stream, self.file_bytes, name) if self.file_bytes is not None else None
        if held is not None and declared is not None and held < declared:
            raise DumpCorrupt(
                "%s is truncated or forged: its header declares filters of at least %s bytes, and its chunks hold %s",
                name,
                f"{declared:,}",
                f"{held:,}",
            )

    def chunkless(self, member: int) -> bool:
        members = self.header.get("members")
        return (
            isinstance(members, list)
            and 0 <= member < len(members)
            and _chunkless(self.header, members[member]) is True
        )

    def chunks(self) -> Iterator[Chunk]:
        member = 0
        while True:
            kind = self.stream.stream.read(1)  # hashed below unless it is the end, which the digest excludes
            if not kind:
                raise DumpCorrupt(
                    "%s is truncated: it ends after chunk %s, without its end record",
                    self.name,
                    f"{self.chunk_count:,}",
                )
            if kind != b"Z":
                self.stream.sha.update(kind)
                self.stream.count += 1
            if kind == b"M":
                (member,) = _U16.unpack(self.stream.read(2, "a member record"))
            elif kind == b"C":
                if self.chunkless(member):  # its filter is made anew: a chunk could only make it another size
                    raise DumpCorrupt(
                        "%s is forged: a chunk for member %s, an empty filter that has none", self.name, member
                    )
                head = self.stream.read(_CHUNK.size, "a chunk")
                cursor, length = _CHUNK.unpack(head)
                if length > MAX_CHUNK:
                    raise DumpCorrupt("%s is corrupt: a chunk of %s bytes", self.name, f"{length:,}")
                data = self.stream.read(length, "a chunk")
                (crc,) = _U32.unpack(self.stream.read(4, "a chunk's checksum"))
                if zlib.crc32(data, zlib.crc32(head[:8])) != crc:
                    raise DumpCorrupt(
                        "%s is corrupt: chunk %s's checksum does not match", self.name, f"{self.chunk_count + 1:,}"
                    )
                self.chunk_count += 1
                self.bytes += length
                yield Chunk(member, cursor, data)
            elif kind == b"Z":
                raw = self.stream.stream.read(_END.size)
                if len(raw) != _END.size:
                    raise DumpCorrupt("%s is truncated: it ends inside its last record", self.name)
                chunks, total, expected = _END.unpack(raw)
                if expected != self.stream.sha.digest():
                    raise DumpCorrupt("%s is corrupt: its SHA-256 does not match", self.name)
                if (chunks, total) != (self.chunk_count, self.bytes):
                    raise DumpCorrupt(
                        "%s is corrupt: it declares %s chunks, holds %s", self.name, chunks, self.chunk_count
                    )
                if self.stream.stream.read(1):
                    raise DumpCorrupt("%s is corrupt: bytes follow its end", self.name)
                return
            else:
                raise DumpCorrupt("%s is corrupt: an unknown record %r", self.name, kind)
