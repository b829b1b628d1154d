"""A server short of memory (maxmemory, noeviction): a load that runs out gives its memory back, a
sharded swap that runs out keeps the standbys it has not swapped yet, a rebuild that cannot
fit names the filter kept for rollback that holds the memory, and a client build refused for
memory leaves no standby behind."""

from __future__ import annotations

import pytest

from bloomctl.keys import KeyFamily
from tests.helpers.matrix import SIGNALS_LOCKS_ERRORS


@SIGNALS_LOCKS_ERRORS
def test_out_of_memory_mid_load_gives_the_memory_back(target, tmp_path):
    """(#10 item 2) maxmemory + noeviction, a scaling standby growing past the limit: the run exits 3 and
    says so, and removes its standby, so the application's own writes work again."""
    if target.backend.name != "redisbloom" or target.cluster:
        pytest.skip("a RedisBloom chain grows while it loads; one node's memory")
    client = target.client
    target.reserve("users", 1000)
    target.add("users", ["user:0", "user:1"])
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(300_000)))
    used = client.info("memory")["used_memory"]
    client.config_set("maxmemory", str(used + 400_000))  # a 1000-capacity standby fits; its growth does not
    try:
        result = target.cli(
            "rebuild", "users", "--from-csv", str(csv), "-c", "1000", "-e", "1%", "--build", "server", "--swap"
        )
        assert result.exit_code == 3, result.stderr
        assert "out of memory" in result.stderr and "was removed to give the memory back" in result.stderr
        family = KeyFamily.of("users")
        assert not client.exists(family.standby) and not client.exists(family.standby_meta)
        assert client.set("app:key", "the application writes again")
        assert target.card("users") == 2 and not client.exists(family.lock)
    finally:
        client.config_set("maxmemory", "0")


@SIGNALS_LOCKS_ERRORS
def test_memory_running_out_during_a_sharded_swap_keeps_the_pending_standbys(target, tmp_path, monkeypatch):
    """(#10 item 2, review) A sharded `rebuild --swap` that hit maxmemory after its first member was swapped
    deleted the other members' verified standbys (no way to finish or roll back) and said nothing
    was swapped. The memory discard covers the load and the verification only."""
    import bloomctl.lifecycle.sharded as sharded

    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(900)))
    args = ["rebuild", "users", "--from-csv", str(csv), "-c", "3000", "-e", "1%", "--shards", "3", "--swap"]
    if target.backend.name == "bitmap":
        args.append("--nonscaling")
    assert target.cli(*args).exit_code == 0
    original, calls = sharded.swap_under, []
    nodes = [target.client] if not target.cluster else list(target.client.get_primaries())

    def swap_then_fill_up(*a, **k):
        out = original(*a, **k)
        calls.append(1)
        if len(calls) == 1:  # another writer takes the server over maxmemory after the first member
            for node in nodes:
                (node if not target.cluster else target.client.get_redis_connection(node)).config_set("maxmemory", "1")
        return out

    monkeypatch.setattr(sharded, "swap_under", swap_then_fill_up)
    try:
        stopped = target.cli(*args)
    finally:
        for node in nodes:
            (node if not target.cluster else target.client.get_redis_connection(node)).config_set("maxmemory", "0")
    assert stopped.exit_code != 0 and "was removed" not in stopped.stderr, stopped.stderr
    monkeypatch.setattr(sharded, "swap_under", original)
    finished = target.cli("swap", "users", "--yes")
    assert finished.exit_code == 0, finished.stderr


@SIGNALS_LOCKS_ERRORS
def test_a_rebuild_short_of_memory_names_the_filter_kept_for_rollback(target, tmp_path):
    """(#10 item 15) With the replaced filter kept an hour by default, a second rebuild within that hour
    may not fit under maxmemory: the refusal says which kept filter holds the memory."""
    if target.cluster:
        pytest.skip("maxmemory set on one server")
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(2000)))
    args = ["rebuild", "users", "--from-csv", str(csv), "-c", "200000", "-e", "0.1%", "--swap"]
    assert target.cli(*args).exit_code == 0
    assert target.cli(*args).exit_code == 0  # the first rebuild's filter is now kept as {users}:old
    used = int(target.client.info("memory")["used_memory"])
    target.client.config_set("maxmemory", str(used + 100_000))  # less than one more filter
    try:
        refused = target.cli(*args)
    finally:
        target.client.config_set("maxmemory", "0")
    assert refused.exit_code == 5, refused.stderr
    assert "still kept for rollback ('{users}:old', expiring in" in refused.stderr
    assert "--keep-old 0" in refused.stderr and target.card("users") == 2000


def _client_build(target, tmp_path) -> list[str]:
    """A swapped-in 1.2 MB filter of 20,000 items, and the `rebuild --build client` that replaces it."""
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(20_000)))
    args = ["rebuild", "users", "--from-csv", str(csv), "-c", "1M", "-e", "1%", "--nonscaling", "--swap"]
    assert target.cli(*args).exit_code == 0
    return [*args, "--build", "client"]


def _assert_nothing_left(target, before: bytes) -> None:
    """No standby, metadata or upload copy stays behind, and the active filter is the one before."""
    family, client = KeyFamily.of("users"), target.client
    assert not client.exists(family.standby), (client.pttl(family.standby), client.hgetall(family.standby_meta))
    assert not client.exists(family.standby_meta)
    assert list(client.scan_iter(match="{users}:build*")) == []
    assert target.dump("users") == before and target.card("users") == 20_000


@SIGNALS_LOCKS_ERRORS
@pytest.mark.parametrize("short", ["server", "client"])
def test_a_client_build_refused_for_memory_leaves_no_standby(target, tmp_path, short):
    """(#24 item 5) `--build client` refused for memory (the node has no room for the upload's second
    copy; the build's bits exceed `--client-memory`) left its reserved, empty standby, marked failed
    and without TTL, on a server already short of memory. It exits 4 as documented, in one line, and
    removes the standby; the active filter is untouched."""
    if target.cluster:
        pytest.skip("maxmemory set on one server")
    if short == "server" and target.backend.name != "redisbloom":
        pytest.skip("only RedisBloom's upload makes a second copy (the bitmap's ORs into the standby)")
    args = _client_build(target, tmp_path)
    before, client = target.dump("users"), target.client
    if short == "client":
        refused, expected = target.cli(*args, "--client-memory", "1M"), "more than the client memory limit"
    else:
        used = client.info("memory")["used_memory"]
        client.config_set("maxmemory", str(used + 1_800_000))  # the 1.2 MB standby fits, a second copy does not
        try:
            refused, expected = target.cli(*args), "no room for the upload's second copy"
        finally:
            client.config_set("maxmemory", "0")
    assert refused.exit_code == 4, refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.startswith("bloomctl: ")]
    assert len(lines) == 1 and "cannot build in the client" in lines[0] and expected in lines[0], refused.stderr
    assert refused.stdout == ""
    _assert_nothing_left(target, before)


@SIGNALS_LOCKS_ERRORS
def test_a_client_build_refused_by_an_oom_reply_to_its_upload_leaves_no_standby(target, tmp_path, monkeypatch):
    """(#24 item 5) The upload (BF.LOADCHUNK, or the bitmap's SETRANGE script) refused with OOM, as
    another writer took the server over maxmemory: exit 3, one line, and the standby removed."""
    from bloomctl.rebuild.build import client as client_build

    if target.cluster:
        pytest.skip("maxmemory set on one server")
    args = _client_build(target, tmp_path)
    before, client = target.dump("users"), target.client
    scheme = client_build.scheme_for(target.backend.name)
    real_finish = scheme.finish

    def finish(*a, **k):
        client.config_set("maxmemory", "1")  # another writer took the server over its limit
        return real_finish(*a, **k)

    monkeypatch.setattr(scheme, "finish", finish)
    try:
        refused = target.cli(*args)
    finally:
        client.config_set("maxmemory", "0")
    assert refused.exit_code == 3, refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.startswith("bloomctl: ")]
    assert len(lines) == 1 and "out of memory" in lines[0] and "was removed" in lines[0], refused.stderr
    _assert_nothing_left(target, before)
