"""Filters the server dumps and loads in chunks: RedisBloom's SCANDUMP and LOADCHUNK commands.

SCANDUMP answers the filter's header first, then its data in chunks of at most 16 MiB that never
span sub-filters; LOADCHUNK takes them back in the same order. A data chunk's iterator is its end
position plus one: RedisBloom's SBChain_LoadEncodedChunk takes the position as the iterator minus
the length, and CF.SCANDUMP's chunks work the same way. So a large chunk can be loaded in pieces,
each at its own position, and no one command holds the server for long.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bloomctl.backends.base import Backend
from bloomctl.server.client import RedisClient

LOADCHUNK_PIECE = 1 << 20  # bytes per LOADCHUNK: under 1 ms on the server


def scandump(client: RedisClient, key: bytes, command: str) -> Iterator[tuple[int, bytes]]:
    """SCANDUMP's (cursor, data) chunks: the header, then the data. An empty cuckoo filter answers
    (0, nil) at once and has no chunks; its restore reserves it anew."""
    cursor = 0
    while True:
        cursor, data = client.execute_command(command, key, cursor)
        if not cursor:
            return
        yield int(cursor), data if isinstance(data, bytes) else bytes(data or b"")


def chunk_start(cursor: int, length: int) -> int:
    """Where a data chunk of ``length`` bytes that came with ``cursor`` starts in the filter's data
    (its sub-filters' bytes end to end): the iterator is the chunk's end position plus one."""
    return cursor - length - 1


def pieces(cursor: int, data: bytes) -> Iterator[tuple[int, bytes]]:
    """A data chunk of SCANDUMP, up to 16 MiB and 7-10 ms of LOADCHUNK on the server, as pieces of
    at most LOADCHUNK_PIECE bytes: a piece ending ``b`` bytes into the chunk carries the iterator
    ``cursor - length + b``."""
    length = len(data)
    if length <= LOADCHUNK_PIECE:
        yield cursor, data
        return
    start = cursor - length
    view = memoryview(data)
    for a in range(0, length, LOADCHUNK_PIECE):
        b = min(a + LOADCHUNK_PIECE, length)
        yield start + b, bytes(view[a:b])


class ChunkedBackend(Backend):
    """A backend whose filters the server reads with ``dump_command`` and writes with ``load_command``."""

    dump_command: str
    load_command: str

    def dump_chunks(self, client: RedisClient, key: bytes, size_bytes: int) -> Iterator[tuple[int, bytes]]:
        return scandump(client, key, self.dump_command)

    def load_commands(self, key: bytes, cursor: int, data: bytes) -> list[tuple[Any, ...]]:
        """The commands that load one data chunk, in pieces."""
        return [(self.load_command, key, at, piece) for at, piece in pieces(cursor, data)]
