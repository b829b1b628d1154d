"""Routing: which shard of a sharded filter holds an item.

``crc32(item bytes) mod N``, with CRC-32 as zlib, Java and Go compute it, so an application in
any language routes the same way (test vectors in docs/sharding.md).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from bloomctl.keys import to_bytes

ROUTING = "crc32-mod-n"


def shard_of(item: bytes | str, shards: int) -> int:
    """The shard of one item: CRC-32 (IEEE, zlib's) of its bytes, modulo the shard count."""
    return zlib.crc32(to_bytes(item)) % shards


def route(items: Sequence[bytes], shards: int) -> list[list[bytes]]:
    """Items grouped by shard, in their order within each group."""
    groups: list[list[bytes]] = [[] for _ in range(shards)]
    crc = zlib.crc32
    for item in items:
        groups[crc(item) % shards].append(item)
    return groups


def route_positions(items: Sequence[bytes], shards: int) -> tuple[list[list[bytes]], list[list[int]]]:
    """Items grouped by shard, and each group's positions in ``items`` (to put answers back in order)."""
    groups: list[list[bytes]] = [[] for _ in range(shards)]
    positions: list[list[int]] = [[] for _ in range(shards)]
    crc = zlib.crc32
    for position, item in enumerate(items):
        shard = crc(item) % shards
        groups[shard].append(item)
        positions[shard].append(position)
    return groups, positions
