"""Topology: standalone or Cluster, the node that holds a key, and the primaries to fan out to.

The one place that asks "is this a cluster client": everything that needs a node's own
connection (pipelines to one node, SCAN, per-node memory) goes through here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

from bloomctl.keys import SLOTS
from bloomctl.server.client import NodeClient, RedisClient


def is_cluster(client: RedisClient) -> bool:
    """Whether ``client`` is a redis-py Cluster client (it routes keys to nodes itself)."""
    return hasattr(client, "get_node_from_key") and hasattr(client, "get_primaries")


def node_client(client: RedisClient, key: bytes) -> NodeClient:
    """The client of the node that holds ``key`` (the client itself when standalone)."""
    if is_cluster(client):
        cluster: Any = client
        return cluster.get_redis_connection(cluster.get_node_from_key(key))
    return cast("NodeClient", client)  # a standalone server's client is its one node's


def node_address(client: RedisClient, key: bytes) -> str | None:
    """``host:port`` of the node that holds ``key`` on a cluster, None when standalone."""
    if not is_cluster(client):
        return None
    owner = client.get_node_from_key(key)  # type: ignore[attr-defined]
    return f"{owner.host}:{owner.port}"


def primaries(client: RedisClient) -> list[NodeClient]:
    """A client per primary (every master of a cluster; the client itself when standalone)."""
    if is_cluster(client):
        cluster: Any = client
        return [cluster.get_redis_connection(node) for node in cluster.get_primaries()]
    return [cast("NodeClient", client)]


def node_name(node: NodeClient) -> str:
    """``host:port`` (or the socket path) of one node's client."""
    kwargs = node.connection_pool.connection_kwargs
    return f"{kwargs['host']}:{kwargs['port']}" if "host" in kwargs else str(kwargs.get("path"))


def masters(client: RedisClient) -> list[tuple[str, set[int]]]:
    """Each master ("host:port") with the slots it owns; one entry with every slot when standalone."""
    if not is_cluster(client):
        return [("standalone", set(range(SLOTS)))]
    owners: dict[str, set[int]] = {}
    for slot, nodes in client.nodes_manager.slots_cache.items():  # type: ignore[attr-defined]
        primary = nodes[0]
        owners.setdefault(f"{primary.host}:{primary.port}", set()).add(slot)
    return sorted(owners.items())


def default_node(client: RedisClient) -> dict[str, Any]:
    """Keyword arguments that send a keyless command to one node (every node runs the same build)."""
    return {"target_nodes": client.get_default_node()} if is_cluster(client) else {}  # type: ignore[attr-defined]


def scan_type(
    node: NodeClient, kind: str | bytes, *, match: bytes | None = None, count: int = 1000, calls: int | None = None
) -> Iterator[bytes]:
    """The keys of one node that SCAN ... TYPE ``kind`` finds (at most ``calls`` SCAN calls when
    given). A type the server does not know has no keys: Valkey refuses a module's type name while
    the module is not loaded ("unknown type name"), where Redis answers an empty page."""
    from redis.exceptions import ResponseError

    cursor, done = 0, 0
    while True:
        try:
            cursor, found = node.scan(cursor=cursor, match=match, count=count, _type=kind)
        except ResponseError as exc:
            if "unknown type name" in str(exc).lower():
                return
            raise
        yield from found
        done += 1
        if not cursor or (calls is not None and done >= calls):
            return
