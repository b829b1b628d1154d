"""A master dies in the middle of a rebuild (3 masters with a replica each, real processes).

Outcome, by design: the load aborts cleanly. The loader writes over one connection to the node
that owns the standby's slot; when that node dies the connection breaks, the rebuild stops with a
connection error before any swap, and the active filter - replicated before the failure - is
served by the promoted replica, intact. bloomctl does not retry a bulk load on the new master
(a half-written standby there is replaced by the next run).
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from bloomctl.errors import StateConflict
from bloomctl.filters.bloom import Filter
from bloomctl.keys import KeyFamily
from bloomctl.lifecycle import single
from bloomctl.lifecycle.guards import SwapGuards
from bloomctl.rebuild import RebuildOptions, rebuild
from bloomctl.server.capabilities import detect
from bloomctl.server.connection import connect, settings_from
from bloomctl.sources import CsvSource
from tests.servers import RedisCluster

pytestmark = [pytest.mark.cluster, pytest.mark.matrix]  # matrix: CI runs it on every server


@pytest.fixture(scope="module")
def replicated(workdir):
    cluster = RedisCluster(workdir, masters=3, replicas=1)
    yield cluster
    cluster.stop()


def _wait_for_failover(cluster, dead_port: int, timeout: float = 60.0) -> None:
    """Until a replica serves the dead master's slots. Redis promotes it by itself within a few
    seconds; on a loaded 2-core machine that can stall, so after 15 s the replica is told to take
    over (what an operator would do) - the test is about bloomctl, not about Redis's election."""
    started = time.monotonic()
    nudged = False
    while time.monotonic() - started < timeout:
        try:
            alive = [n for n in cluster.nodes if n.port != dead_port]
            healthy = all(n.client().execute_command("CLUSTER INFO").get("cluster_state") == "ok" for n in alive)
            # ... and a replica has taken the dead master's slots (before the failure is noticed the state is ok too)
            masters = {entry[2][1] for entry in alive[0].client().execute_command("CLUSTER SLOTS")}
            if healthy and dead_port not in masters:
                return
            if not nudged and time.monotonic() - started > 15:
                for node in alive:
                    role = node.client().execute_command("ROLE")
                    if role[0] in (b"slave", "slave") and int(role[2]) == dead_port:
                        node.client().execute_command("CLUSTER FAILOVER", "TAKEOVER")
                        nudged = True
        except redis.exceptions.RedisError:
            pass
        time.sleep(0.2)
    raise AssertionError("the cluster did not recover from the failover")


def test_a_master_dies_during_a_rebuild(replicated, tmp_path):
    path = tmp_path / "u.csv"
    path.write_text("id\n" + "".join(f"user:{i}\n" for i in range(20_000)))
    url = replicated.url
    client = connect(settings_from(url))
    server = detect(client)
    first = rebuild(
        client,
        server,
        "users",
        CsvSource(str(path)),
        RebuildOptions(capacity=50_000, error_rate=0.01, nonscaling=True, swap=True),
    )
    assert first.swapped
    owner = client.get_node_from_key(b"users")
    deadline = time.monotonic() + 30  # the replica has the active filter (WAIT answers how many replicas acked)
    while client.get_redis_connection(owner).execute_command("WAIT", 1, 5000) < 1:
        assert time.monotonic() < deadline, "the replica never acknowledged the active filter"
    victim = next(n for n in replicated.nodes if n.port == owner.port)

    class SlowSource(CsvSource):
        def batches(self, size):
            for batch in super().batches(size):
                time.sleep(0.05)
                yield batch

    outcome: list[object] = []

    def run() -> None:
        try:
            options = RebuildOptions(
                capacity=50_000, error_rate=0.01, nonscaling=True, swap=True, batch_size=500, build="server"
            )
            outcome.append(rebuild(client, server, "users", SlowSource(str(path)), options))
        except Exception as exc:  # the expected abort
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.6)  # the load is under way (40 batches take 2 s)
    victim.process.kill()
    worker.join(60)
    assert not worker.is_alive()
    _wait_for_failover(replicated, victim.port)

    result = outcome[0]
    print(f"failover outcome: {result!r}")  # shown with pytest -s
    fresh = connect(settings_from(next(n for n in replicated.nodes if n.port != victim.port).url))
    users = Filter(fresh, "users")
    if isinstance(result, Exception):  # aborted: a connection error, nothing swapped, the active intact
        assert isinstance(result, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError), repr(result)
        assert all(users.mexists([f"user:{i}" for i in range(0, 20_000, 11)]))
        assert users.backend.card(fresh, b"users") >= 19_990
        refused = single.prepare_swap  # the half-written standby on the new master is never swapped in
        with pytest.raises(StateConflict):
            refused(fresh, detect(fresh), "users", SwapGuards(allow_shrink=True))
    else:  # completed (the dead node was not the one written to): every member present
        assert result.swapped and all(users.mexists([f"user:{i}" for i in range(0, 20_000, 11)]))
    assert fresh.exists(KeyFamily.of("users").meta)
