"""Filters kept in one plain Redis string: the bitmap Bloom filter and the module-free cuckoo filter.

Both strings open with a 64-byte header naming their format and layout, and their length follows
from it, so a filter is recognised from its first bytes and its length, never from the word it
starts with alone. A dump reads the string in slices at their byte offsets; a restore writes it
back whole.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from typing import Any

from bloomctl.backends.base import DumpMismatch, changed_while_dumped
from bloomctl.backends.library import LuaBackend
from bloomctl.errors import VerifyFailed
from bloomctl.server.client import RedisClient

HEADER_BYTES = 64
SLICE = 1 << 20  # bytes per GETRANGE of a dump


class StringBackend(LuaBackend):
    """A backend whose filter is one string the function library reads and writes."""

    redis_type = b"string"
    grows = False
    module_free = True
    needs_library = True

    @abstractmethod
    def recognise(self, head: bytes, length: int) -> bool:
        """Whether a string's first 64 bytes and its length are those of a filter of this backend."""

    def owns(self, client: RedisClient, key: bytes, kind: bytes) -> bool:
        return kind == self.redis_type and bool(self.select(client, [key]))

    def select(self, node: RedisClient, keys: list[bytes]) -> list[bytes]:
        """Strings whose header is this backend's and whose length matches the layout it declares:
        a note that merely starts with the right word is not taken for a filter."""
        if not keys:
            return []
        pipe = node.pipeline(transaction=False)
        for key in keys:
            pipe.getrange(key, 0, HEADER_BYTES - 1)
            pipe.strlen(key)
        replies = pipe.execute()
        return [
            key
            for key, head, length in zip(keys, replies[::2], replies[1::2], strict=True)
            if self.recognise(head, length)
        ]

    def dump_chunks(self, client: RedisClient, key: bytes, size_bytes: int) -> Iterator[tuple[int, bytes]]:
        """The string in slices, each at its byte offset; a short slice means it changed meanwhile."""
        for offset in range(0, size_bytes, SLICE):
            data = client.getrange(key, offset, min(offset + SLICE, size_bytes) - 1)  # type: ignore[attr-defined]
            if len(data) != min(SLICE, size_bytes - offset):
                raise changed_while_dumped(key)
            yield offset, data

    def not_the_header(self) -> DumpMismatch:
        return DumpMismatch(f"the first slice is not the header of the {self.name} filter the dump describes")

    def check_loaded(self, client: RedisClient, key: bytes, member: dict[str, Any], name: str) -> None:
        head = client.getrange(key, 0, HEADER_BYTES - 1)  # type: ignore[attr-defined]
        length = int(client.strlen(key))  # type: ignore[attr-defined]
        if length != member["size_bytes"] or not self.recognise(head, length):
            raise VerifyFailed(
                "%s: the restored bitmap filter is %s bytes, the dump says %s", name, length, member["size_bytes"]
            )
