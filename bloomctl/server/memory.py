"""Memory guard: refuse new filters bigger than what their nodes have left.

Redis would otherwise start evicting keys or get killed by the OOM killer. Sizes are added up
per node, since several members of a sharded filter can share one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bloomctl.errors import StateConflict
from bloomctl.keys import to_display
from bloomctl.server.client import NodeClient, RedisClient
from bloomctl.server.topology import node_client


def check_memory(
    client: RedisClient,
    planned: list[tuple[bytes, int]],
    kept: Sequence[bytes] = (),
    advice: str = "lower `capacity` or raise `error_rate`, or pass `force`",
) -> None:
    """Refuse when the ``(key, bytes)`` pairs, added up per node, exceed what each node has left
    (maxmemory, else the machine's memory). Skipped for a node that does not tell (an ACL user
    without INFO, a managed service hiding it). ``kept``: old filters an earlier swap may still
    keep for rollback, named in the refusal when one exists."""
    per_node: dict[int, tuple[Any, int]] = {}
    for key, size in planned:
        node = node_client(client, key)
        _, total = per_node.get(id(node), (node, 0))
        per_node[id(node)] = (node, total + size)
    for node, size in per_node.values():
        try:
            memory = node.info("memory")
        except Exception:  # no permission, or a server without these fields: nothing to compare
            continue
        used = int(memory.get("used_memory", 0))
        limit = int(memory.get("maxmemory", 0)) or int(memory.get("total_system_memory", 0))
        if limit and size > limit - used:
            source = "maxmemory" if int(memory.get("maxmemory", 0)) else "the machine's memory"
            old = _kept_old(node, [key for key in kept if node_client(client, key) is node])
            raise StateConflict(
                "the new filter(s) need %s bytes on one node but it has %s left (%s %s, used %s): "
                + advice
                + (KEPT_OLD_HINT if old else ""),
                f"{size:,}",
                f"{max(limit - used, 0):,}",
                source,
                f"{limit:,}",
                f"{used:,}",
                *old,
            )


KEPT_OLD_HINT = (
    "; the filter an earlier swap replaced is still kept for rollback (%r%s): UNLINK it if no rollback "
    "is needed, and swap with `keep_old` 0 where memory is this tight"
)


def _kept_old(node: NodeClient, olds: Sequence[bytes]) -> tuple[str, ...]:
    """The values of KEPT_OLD_HINT for the first of ``olds`` that exists; () when none does."""
    for old in olds:
        try:
            if not node.exists(old):
                continue
            ttl = node.ttl(old)
        except Exception:
            return ()
        return (to_display(old), f", expiring in {ttl:,}s" if ttl and ttl > 0 else "")
    return ()
