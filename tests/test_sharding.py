"""Sharded filters on real servers: routing vectors, placement over masters, lifecycle, API vs loader."""

from __future__ import annotations

import json

import pytest

from bloomctl import backends
from bloomctl.filters.bloom import ShardedFilter, open_filter
from bloomctl.keys import KeyFamily
from bloomctl.lifecycle.manifest import is_member_name, read_manifest
from bloomctl.lifecycle.routing import shard_of
from bloomctl.server.topology import node_client
from tests.helpers.files import write_csv
from tests.helpers.hammer import Hammer

pytestmark = pytest.mark.matrix  # CI runs this module on every server of the matrix

# docs/sharding.md's routing test vectors: shard = CRC-32 (zlib / IEEE 802.3) of the item's bytes, mod N.
VECTORS = [
    (b"", 0, {3: 0, 16: 0}),
    (b"a", 3904355907, {3: 0, 16: 3}),
    (b"user:42", 1684999558, {3: 1, 16: 6}),
    (b"hello world", 222957957, {3: 0, 16: 5}),
    ("日本".encode(), 3350711756, {3: 2, 16: 12}),
    (b"\x00\xff", 1826356594, {3: 1, 16: 2}),
]


@pytest.mark.parametrize(("item", "crc", "shards"), VECTORS)
def test_routing_vectors(item, crc, shards):
    import zlib

    assert zlib.crc32(item) == crc
    for n, expected in shards.items():
        assert shard_of(item, n) == expected


def test_the_sharding_docs_list_the_vectors():
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "sharding.md").read_text(encoding="utf-8")
    for item, crc, shards in VECTORS:
        hex_cell = f" {item.hex()} " if item else " "
        assert f"|{hex_cell}| {crc} | {shards[3]} | {shards[16]} |" in page, item


def test_member_names_are_recognised():
    assert is_member_name(b"{1a2b}:users:shard:3")
    assert not is_member_name(b"{users}:standby")
    assert not is_member_name(b"users")


def build_sharded(target, path: str, *extra: str, shards: int = 3) -> None:
    """A first sharded rebuild with --swap, on the target's backend."""
    result = target.cli(
        "rebuild",
        "users",
        "--from-csv",
        path,
        "-e",
        "1%",
        "--shards",
        str(shards),
        "--swap",
        "--backend",
        target.backend.name,
        *extra,
    )
    assert result.exit_code == 0, result.stderr


def test_reserve_sharded_spreads_members(target):
    args = ["-c", "30000", "-e", "1%", "--backend", target.backend.name, "--shards", "6", "--format", "json"]
    if target.backend.name == "bitmap":
        args.append("--nonscaling")
    result = target.cli("reserve", "users", *args)
    assert result.exit_code == 0, result.stderr
    manifest = read_manifest(target.client, "users")
    assert manifest.shards == 6 and manifest.capacity == 5000 and manifest.backend == target.backend.name
    assert len({KeyFamily.of(m).slot for m in manifest.members}) == 6
    if target.cluster:  # round-robin over the three masters: two members each
        owners = [node_client(target.client, m).connection_pool.connection_kwargs["port"] for m in manifest.members]
        assert len(set(owners)) == 3 and all(owners.count(p) == 2 for p in set(owners))
    for member in manifest.members:
        assert backends.for_key(target.client, member) is target.backend
    again = target.cli("reserve", "users", *args)
    assert again.exit_code == 5
    info = json.loads(target.cli("info", "users", "--format", "json").stdout)
    assert info["sharded"] and info["shards"] == 6 and info["reserved_capacity"] == 30000
    assert info["missing_members"] == []


def test_sharded_rebuild_swap_rollback_and_fill_ratio(target, tmp_path):
    path = write_csv(tmp_path / "u.csv", 12_000)
    first = target.cli(
        "rebuild",
        "users",
        "--from-csv",
        path,
        "-e",
        "1%",
        "--shards",
        "3",
        "--swap",
        "--backend",
        target.backend.name,
        "--format",
        "json",
    )
    assert first.exit_code == 0, first.stderr
    data = json.loads(first.stdout)
    assert data["shards"] == 3 and data["swapped"] and data["verified"] == 10_000
    filt = ShardedFilter(target.client, "users")
    assert all(filt.mexists([f"user:{i}" for i in range(0, 12_000, 3)]))
    per_shard = [target.backend.card(target.client, m) for m in filt.manifest.members]
    assert sum(per_shard) >= 11_990 and min(per_shard) > 3000  # crc32 spreads the items evenly

    # a second rebuild keeps the shard count, keeps the old members for rollback
    more = write_csv(tmp_path / "v.csv", 15_000)
    second = target.cli("rebuild", "users", "--from-csv", more, "--swap", "--keep-old", "300")
    assert second.exit_code == 0, second.stderr
    assert filt.exists("user:14999")
    wrong = target.cli("rebuild", "users", "--from-csv", more, "--shards", "4")
    assert wrong.exit_code == 2 and "never changes" in wrong.stderr
    assert target.cli("rollback", "users", "--yes").exit_code == 0
    assert [target.backend.card(target.client, m) for m in filt.manifest.members] == per_shard  # the first build
    assert all(filt.mexists([f"user:{i}" for i in range(0, 12_000, 7)]))

    report = target.cli("fill-ratio", "*", "--format", "json")
    keys = [f["key"] for f in json.loads(report.stdout)["filters"]]
    assert keys == ["users"]  # members and companions are reported through the manifest only
    assert json.loads(report.stdout)["filters"][0]["shards"] == 3


def test_api_agrees_with_the_cli_loader_bit_for_bit(target, tmp_path):
    path = write_csv(tmp_path / "u.csv", 6000)
    extra = ["--nonscaling"] if target.backend.name == "bitmap" else []
    assert (
        target.cli(
            "rebuild",
            "a",
            "--from-csv",
            path,
            "-c",
            "20000",
            "-e",
            "1%",
            "--shards",
            "3",
            "--swap",
            "--backend",
            target.backend.name,
            *extra,
        ).exit_code
        == 0
    )
    assert (
        target.cli(
            "reserve", "b", "-c", "20000", "-e", "1%", "--shards", "3", "--backend", target.backend.name, *extra
        ).exit_code
        == 0
    )
    api = ShardedFilter(target.client, "b")
    items = [f"user:{i}" for i in range(6000)]
    for start in range(0, len(items), 700):
        api.madd(items[start : start + 700])
    a, b = read_manifest(target.client, "a"), read_manifest(target.client, "b")
    for member_a, member_b in zip(a.members, b.members, strict=True):
        assert _bits(target, member_a) == _bits(target, member_b)
    assert api.mexists(items[:50]) == [True] * 50
    assert isinstance(open_filter(target.client, "b"), ShardedFilter)


def _bits(target, key: bytes) -> bytes:
    return target.dump(key, header=False)


def test_readers_see_no_false_negative_during_a_sharded_cutover(target, tmp_path):
    from bloomctl.server.connection import connect, settings_from

    path = write_csv(tmp_path / "u.csv", 5000)
    args = ["--from-csv", path, "-e", "1%", "--swap", "--quiet"]
    assert target.cli("rebuild", "users", *args, "--shards", "3", "--backend", target.backend.name).exit_code == 0
    reader = ShardedFilter(connect(settings_from(target.url)), "users")
    known = [f"user:{i}" for i in range(0, 5000, 97)]
    with Hammer(reader, lambda f: f.mexists(known), lambda answer: all(answer)) as hammer:
        for _ in range(4):
            assert target.cli("rebuild", "users", *args).exit_code == 0
    assert hammer.calls > 4 and hammer.bad == []


def test_sharded_swap_needs_every_standby(target, tmp_path):
    path = write_csv(tmp_path / "u.csv", 900)
    build_sharded(target, path)
    assert target.cli("rebuild", "users", "--from-csv", path).exit_code == 0  # standbys only
    manifest = read_manifest(target.client, "users")
    target.client.unlink(KeyFamily.of(manifest.members[1]).standby)
    result = target.cli("swap", "users", "--yes")
    assert result.exit_code == 5 and "does not exist" in result.stderr
    # nothing moved: shard 0 still has its standby (guards run before the first swap)
    assert target.client.exists(KeyFamily.of(manifest.members[0]).standby)
    with_standby = target.cli("swap", "users", "--standby", "x", "--yes")
    assert with_standby.exit_code == 2


def test_plan_shards(cli):
    result = cli("plan", "-c", "3M", "-e", "1%", "--shards", "3", "--format", "json")
    data = json.loads(result.stdout)
    assert data["capacity_per_shard"] == 1_000_000 and data["shard_bytes"] == 1_378_568
    assert data["total_bytes"] == 3 * 1_378_568
    suggested = json.loads(cli("plan", "-c", "3M", "-e", "1%", "--max-shard-memory", "1M", "--format", "json").stdout)
    assert suggested["suggested_shards"] == suggested["shards"] == 5
    assert suggested["shard_bytes"] <= 1_000_000


def test_a_failed_first_sharded_build_leaves_no_manifest(target, tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("id\n")
    result = target.cli(
        "rebuild",
        "sk",
        "--from-csv",
        str(empty),
        "-c",
        "1000",
        "-e",
        "1%",
        "--shards",
        "3",
        "--backend",
        target.backend.name,
    )
    assert result.exit_code == 8
    assert read_manifest(target.client, "sk") is None and not target.client.exists("sk")
    path = write_csv(tmp_path / "u.csv", 900)
    again = target.cli(
        "rebuild", "sk", "--from-csv", path, "-e", "1%", "--shards", "4", "--swap", "--backend", target.backend.name
    )
    assert again.exit_code == 0, again.stderr
    assert read_manifest(target.client, "sk").shards == 4


def test_an_interrupted_sharded_swap_can_be_finished(target, tmp_path, monkeypatch):
    """The third member's swap never reaches the server (a dropped connection): bloomctl looks, says
    how many members are swapped (exit 3: the server's side failed), and a second swap finishes."""
    from bloomctl.lifecycle import single

    path = write_csv(tmp_path / "u.csv", 3000)
    build_sharded(target, path)
    more = write_csv(tmp_path / "v.csv", 3300)
    assert target.cli("rebuild", "users", "--from-csv", more).exit_code == 0  # verified standbys, not swapped
    real_swap, calls = single.swap, []

    def failing_third(client, prepared, **kw):
        calls.append(prepared.family.active)
        if len(calls) == 3:
            raise redis_error()
        return real_swap(client, prepared, **kw)

    monkeypatch.setattr(single, "swap", failing_third)
    stopped = target.cli("swap", "users", "--yes")
    assert stopped.exit_code == 3 and "stopped after 2 of 3 shards" in stopped.stderr, stopped.stderr
    assert "it was NOT applied" in stopped.stderr
    monkeypatch.setattr(single, "swap", real_swap)
    filt = ShardedFilter(target.client, "users")
    assert all(filt.mexists([f"user:{i}" for i in range(0, 3000, 13)]))  # every shard answers meanwhile
    finished = target.cli("swap", "users", "--yes")
    assert finished.exit_code == 0, finished.stderr
    assert filt.exists("user:3299") and all(filt.mexists([f"user:{i}" for i in range(3000, 3300, 7)]))


def redis_error():
    import redis

    return redis.exceptions.ConnectionError("simulated: the node went away")


def test_sharded_memory_is_added_up_per_node(target):
    if target.cluster:
        nodes = [target.client.get_redis_connection(n) for n in target.client.get_primaries()]
    else:
        nodes = [target.client]
    for node in nodes:
        used = node.info("memory")["used_memory"]
        node.config_set("maxmemory", str(used + 2_700_000))  # room for one ~1.9 MB shard, with margin both ways
    try:
        # 6 shards of ~1.9 MB: each fits alone, but two on one node (cluster) or six (standalone) do not
        args = ["-c", "8M", "-e", "1%", "--shards", "6", "--backend", target.backend.name]
        if target.backend.name == "bitmap":
            args.append("--nonscaling")
        result = target.cli("reserve", "mm", *args)
        assert result.exit_code == 5 and "on one node" in result.stderr, (result.stdout, result.stderr)
        assert not target.client.exists("mm")
        assert not any(target.client.exists(m) for m in sharding_members(target, "mm", 6))
    finally:
        for node in nodes:
            node.config_set("maxmemory", "0")


def test_reserve_sharded_if_not_exists_compares_parameters(target):
    args = ["-c", "3000", "-e", "1%", "--shards", "3", "--backend", target.backend.name]
    if target.backend.name == "bitmap":
        args.append("--nonscaling")
    assert target.cli("reserve", "users", *args).exit_code == 0
    same = target.cli("reserve", "users", *args, "--if-not-exists", "--format", "table")
    assert same.exit_code == 0 and "already exists with 3 shards: nothing to do" in same.stdout
    dry = target.cli("reserve", "users", *args, "--if-not-exists", "--dry-run", "--format", "json")
    assert dry.exit_code == 0 and json.loads(dry.stdout) == {"created": False, "key": "users", "shards": 3}
    different = [a if a != "3000" else "6000" for a in args]
    assert target.cli("reserve", "users", *different, "--if-not-exists").exit_code == 5


def sharding_members(target, key: str, shards: int) -> list[bytes]:
    from bloomctl.lifecycle.manifest import member_keys

    return member_keys(target.client, key.encode(), shards)


def test_dual_writes_reach_the_standby_first_and_never_create_one(target, tmp_path):
    from bloomctl.filters.bloom import Filter

    path = write_csv(tmp_path / "u.csv", 500)
    extra = ["--backend", target.backend.name]
    assert target.cli("rebuild", "single", "--from-csv", path, "-e", "1%", "--swap", *extra).exit_code == 0
    assert (
        target.cli("rebuild", "sharded", "--from-csv", path, "-e", "1%", "--shards", "3", "--swap", *extra).exit_code
        == 0
    )
    single, sharded = Filter(target.client, "single"), ShardedFilter(target.client, "sharded")
    # no rebuild running: nothing is created beside the filters
    single.madd(["new-1"], dual_write=True)
    sharded.madd(["new-1", "new-2", "new-3"], dual_write=True)
    assert not target.client.exists(KeyFamily.of("single").standby)
    assert not any(target.client.exists(KeyFamily.of(m).standby) for m in sharded.manifest.members)
    assert single.exists("new-1") and sharded.mexists(["new-1", "new-2", "new-3"]) == [True] * 3
    # a rebuild left verified standbys: dual writes reach them, so the next swap keeps the new items
    assert target.cli("rebuild", "single", "--from-csv", path).exit_code == 0
    assert target.cli("rebuild", "sharded", "--from-csv", path).exit_code == 0
    single.madd(["late"], dual_write=True)
    sharded.madd(["late-a", "late-b"], dual_write=True)
    assert target.cli("swap", "single", "--yes").exit_code == 0
    assert target.cli("swap", "sharded", "--yes").exit_code == 0
    assert single.exists("late") and sharded.mexists(["late-a", "late-b"]) == [True, True]


def test_a_sharded_swap_is_not_finished_with_standbys_of_another_rebuild(target, tmp_path):
    path = write_csv(tmp_path / "u.csv", 900)
    build_sharded(target, path)
    assert target.cli("rebuild", "users", "--from-csv", path).exit_code == 0  # standbys of generation G2
    manifest = read_manifest(target.client, "users")
    first = KeyFamily.of(manifest.members[0])
    target.client.unlink(first.standby)  # as if shard 0 had been swapped ...
    target.client.hset(first.meta, "generation", "G1-some-other-run")  # ... by a different rebuild
    result = target.cli("swap", "users", "--yes")
    assert result.exit_code == 5 and "does not exist" in result.stderr
    assert all(target.client.exists(KeyFamily.of(m).standby) for m in manifest.members[1:])  # nothing moved
