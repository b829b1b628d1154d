"""Copy: a filter from one server to another, its dump's chunks restored as they are read."""

from __future__ import annotations

from typing import Any

from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.transfer.dump import read_filter
from bloomctl.transfer.restore import RestoreReport, restore

# The two halves of a copy too, for a caller that runs them apart: the command line reads the
# source first, so that its errors name the source.
__all__ = ["copy", "read_filter", "restore"]


def copy(
    source: RedisClient,
    source_server: ServerInfo,
    key: str | bytes,
    target: RedisClient,
    target_server: ServerInfo,
    target_key: str | bytes,
    **options: Any,
) -> RestoreReport:
    """Dump ``key`` from one server and restore it as ``target_key`` on another, chunk by chunk."""
    dump = read_filter(source, source_server, key)
    return restore(target, target_server, target_key, dump.header, dump.chunks, **options)
