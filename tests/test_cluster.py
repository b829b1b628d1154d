"""Cluster specifics: a slot that moves under a long-lived client (MOVED, and ASK while it migrates)."""

from __future__ import annotations

import pytest

from bloomctl.filters.bloom import Filter
from bloomctl.keys import KeyFamily, key_slot
from bloomctl.lifecycle import front as lifecycle
from bloomctl.lifecycle.fill import Thresholds, fill_ratio
from bloomctl.server.capabilities import detect
from bloomctl.server.connection import connect, settings_from
from bloomctl.sizing.bloom import plan

pytestmark = [pytest.mark.cluster, pytest.mark.matrix]  # matrix: CI runs it on every server


def _node(cluster, port):
    return next(n for n in cluster.nodes if n.port == port)


def _move_slot(cluster, slot: int, src, dst, *, finish: bool = True) -> None:
    """Migrate ``slot`` the way redis-cli --cluster reshard does: IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE."""
    src_client, dst_client = src.client(), dst.client()
    src_id = src_client.execute_command("CLUSTER MYID").decode()
    dst_id = dst_client.execute_command("CLUSTER MYID").decode()
    dst_client.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
    src_client.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    keys = src_client.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
    if keys:
        src_client.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys)
    if finish:
        for node in cluster.nodes:
            node.client().execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)


def test_commands_follow_a_slot_that_moved(cluster):
    client = connect(settings_from(cluster.url))
    server = detect(client)
    lifecycle.reserve(client, server, "users", plan(1000, 0.01, None), backend="bitmap")
    users = Filter(client, "users")
    users.madd(["a", "b"])
    family = KeyFamily.of("users")
    slot = key_slot("users")
    owner = client.get_node_from_key(b"users")
    src = _node(cluster, owner.port)
    dst = next(n for n in cluster.nodes if n.port != owner.port)

    _move_slot(cluster, slot, src, dst)  # the client's slot map is now stale: MOVED on the next command

    assert users.mexists(["a", "b", "c"])[:2] == [True, True]
    description = lifecycle.describe(client, "users")
    assert description.state.items == 2 and description.node == f"127.0.0.1:{dst.port}"
    assert [r.key for r in fill_ratio(client, ["users"], Thresholds())] == [b"users"]
    lifecycle.reserve(client, server, family.standby, plan(1000, 0.01, None), backend="bitmap")
    Filter(client, family.standby).madd(["a", "b", "c"])
    assert lifecycle.swap(client, server, "users", keep_old_seconds=60).replaced == [True]
    assert users.exists("c")


def test_a_slot_in_migration_answers_ask(cluster):
    """While the slot migrates, keys already moved answer ASK from the old owner: redis-py follows it."""
    client = connect(settings_from(cluster.url))
    server = detect(client)
    lifecycle.reserve(client, server, "users", plan(1000, 0.01, None), backend="bitmap")
    Filter(client, "users").madd(["a"])
    owner = client.get_node_from_key(b"users")
    src = _node(cluster, owner.port)
    dst = next(n for n in cluster.nodes if n.port != owner.port)
    _move_slot(cluster, key_slot("users"), src, dst, finish=False)  # keys moved, slot still MIGRATING
    try:
        assert Filter(client, "users").exists("a")
        assert lifecycle.describe(client, "users").state.items == 1
    finally:
        dst_id = dst.client().execute_command("CLUSTER MYID").decode()
        for node in cluster.nodes:
            node.client().execute_command("CLUSTER SETSLOT", key_slot("users"), "NODE", dst_id)


def test_a_cluster_user_without_info_is_still_recognised(cluster, cli):
    """An ACL user denied INFO: bloomctl asks a keyed command instead and takes the MOVED reply
    (which redis-py parses into MovedError, the word MOVED removed) as the sign of a Cluster."""
    from bloomctl.server.connection import connect, settings_from

    for node in cluster.nodes:
        node.client().execute_command("ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "+@all", "-info")
    try:
        url = f"redis://noinfo:pw@127.0.0.1:{cluster.nodes[0].port}/0"
        client = connect(settings_from(url))
        assert type(client).__name__ == "RedisCluster"
        result = cli("reserve", "users", "-c", "1000", "-e", "1%", "--backend", "bitmap", url=url)
        assert result.exit_code == 0, result.stderr
        client.close()
    finally:
        for node in cluster.nodes:
            node.client().execute_command("ACL", "DELUSER", "noinfo")
