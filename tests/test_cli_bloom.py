"""The commands end to end on a real RedisBloom server (RedisBloom tier)."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bloomctl import backends
from bloomctl.keys import KeyFamily
from bloomctl.lifecycle import read_metadata
from bloomctl.planner import plan
from tests.bloom_model import ModelChain

rb = backends.get("redisbloom")

pytestmark = pytest.mark.redisbloom


def madd(client, key, items):
    for start in range(0, len(items), 1000):
        client.execute_command("BF.MADD", key, *items[start : start + 1000])


# --- reserve --------------------------------------------------------------------------------


def test_reserve_creates_the_planned_filter_and_metadata(cli_bloom, bloom):
    result = cli_bloom("reserve", "users", "-c", "100k", "-e", "0.1%", "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["created"] is True
    client = bloom.client()
    assert rb.info_field(client, b"users", "size") == plan(100_000, 0.001).size_bytes == data["filter"]["size_bytes"]
    meta = read_metadata(client, KeyFamily.of("users").meta)
    assert float(meta["error_rate"]) == 0.001
    assert meta["expansion"] == "2" and meta["capacity"] == "100000"
    assert meta["created_by"].startswith("bloomctl ") and meta["created_at"].endswith("Z")
    assert result.stderr == ""


def test_reserve_nonscaling_and_expansion(cli_bloom, bloom):
    assert cli_bloom("reserve", "a", "-c", "1000", "-e", "1%", "--nonscaling").exit_code == 0
    assert cli_bloom("reserve", "b", "-c", "1000", "-e", "1%", "--expansion", "4").exit_code == 0
    client = bloom.client()
    assert rb.info(client, b"a").nonscaling
    assert rb.info(client, b"b").expansion == 4
    assert read_metadata(client, KeyFamily.of("a").meta)["expansion"] == "nonscaling"


def test_reserve_refuses_an_existing_key(cli_bloom, bloom):
    assert cli_bloom("reserve", "users", "-c", "1000", "-e", "1%").exit_code == 0
    again = cli_bloom("reserve", "users", "-c", "1000", "-e", "1%")
    assert again.exit_code == 5
    assert "already exists" in again.stderr and "--if-not-exists" in again.stderr
    same = cli_bloom("reserve", "users", "-c", "1000", "-e", "1%", "--if-not-exists")
    assert same.exit_code == 0 and "nothing to do" in same.stdout
    different = cli_bloom("reserve", "users", "-c", "2000", "-e", "1%", "--if-not-exists")
    assert different.exit_code == 5 and "different parameters" in different.stderr
    other_error = cli_bloom("reserve", "users", "-c", "1000", "-e", "2%", "--if-not-exists")
    assert other_error.exit_code == 5
    assert rb.info_field(bloom.client(), b"users", "capacity") == 1000


def test_reserve_refuses_a_key_of_another_type(cli_bloom, bloom):
    bloom.client().set("users", "precious")
    result = cli_bloom("reserve", "users", "-c", "1000", "-e", "1%")
    assert result.exit_code == 5
    assert "holds a string" in result.stderr
    assert bloom.client().get("users") == b"precious"


def test_reserve_dry_run_creates_nothing(cli_bloom, bloom):
    result = cli_bloom("reserve", "users", "-c", "1M", "-e", "1%", "--dry-run", "--format", "table")
    assert result.exit_code == 0
    assert "1,378,568" in result.stdout
    assert "dry run" in result.stderr
    assert not bloom.client().exists("users")


# --- info -----------------------------------------------------------------------------------


def test_info_reports_subfilters_from_the_scandump_header(cli_bloom, bloom):
    client = bloom.client()
    client.execute_command("BF.RESERVE", "users", "0.01", 100, "EXPANSION", 2)
    items = [f"user:{i}".encode() for i in range(500)]
    madd(client, "users", items)
    result = cli_bloom("info", "users", "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    expected = plan(100, 0.01, 2, items=data["items"])
    assert data["filters"] == len(expected.chain) == len(data["subfilters"])
    assert [s["error_rate"] for s in data["subfilters"]] == pytest.approx([s.error_rate for s in expected.chain])
    assert [s["hashes"] for s in data["subfilters"]] == [s.hashes for s in expected.chain]
    assert sum(s["items"] for s in data["subfilters"]) == data["items"] == client.execute_command("BF.CARD", "users")
    assert data["reserved_capacity"] == 100 and data["capacity"] == sum(s.capacity for s in expected.chain)
    assert data["fill_ratio"] == pytest.approx(data["items"] / 100)
    assert 0 < data["estimated_fpr"] < 0.01
    assert data["exact"] is False
    assert data["companions"]["standby"] == {"key": "{users}:standby", "exists": False}
    assert data["ttl_seconds"] is None


def test_info_exact_matches_an_independent_model_bit_for_bit(cli_bloom, bloom):
    client = bloom.client()
    client.execute_command("BF.RESERVE", "users", "0.01", 200, "EXPANSION", 3)
    model = ModelChain(200, 0.01, 3)
    items = [f"u{i}".encode() for i in range(2500)]
    madd(client, "users", items)
    for item in items:
        model.add(item)
    data = json.loads(cli_bloom("info", "users", "--exact", "--format", "json").stdout)
    assert data["exact"] is True
    assert [s["bits_set"] for s in data["subfilters"]] == model.bits_set()
    assert [s["items"] for s in data["subfilters"]] == model.items()
    for sub in data["subfilters"]:
        assert sub["estimated_fpr"] == pytest.approx((sub["bits_set"] / sub["bits"]) ** sub["hashes"])


def test_info_table_shows_ttl_companions_and_metadata(cli_bloom, bloom):
    assert cli_bloom("reserve", "users", "-c", "1000", "-e", "1%").exit_code == 0
    client = bloom.client()
    client.expire("users", 3600)
    client.execute_command("BF.RESERVE", "{users}:standby", "0.01", 1000)
    result = cli_bloom("info", "users", "--format", "table")
    assert result.exit_code == 0
    out = result.stdout
    assert "{users}:standby  (exists)" in out
    assert "{users}:old  (absent)" in out
    assert "meta error_rate" in out
    assert "3600s" in out or "3599s" in out


def test_info_missing_and_wrong_type(cli_bloom, bloom):
    missing = cli_bloom("info", "nope")
    assert missing.exit_code == 5 and "does not exist" in missing.stderr and missing.stdout == ""
    bloom.client().hset("h", "a", "b")
    wrong = cli_bloom("info", "h")
    assert wrong.exit_code == 5 and "holds a hash" in wrong.stderr


# --- fill-ratio -----------------------------------------------------------------------------


@pytest.fixture
def filled(bloom):
    """Three filters at 10%, 85% and 120% of capacity, plus a standby and a non-filter key."""
    client = bloom.client()
    for key, n in (("bf:a", 100), ("bf:b", 850), ("bf:c", 1200)):
        client.execute_command("BF.RESERVE", key, "0.01", 1000)
        madd(client, key, [f"{key}:{i}".encode() for i in range(n)])
    client.execute_command("BF.RESERVE", "bf:{a}:standby", "0.01", 1000)
    client.set("bf:string", "x")
    return client


def test_fill_ratio_text_exit_codes(cli_bloom, filled):
    ok = cli_bloom("fill-ratio", "bf:a", "--format", "text")
    assert ok.exit_code == 0
    assert ok.stdout.startswith("bf:a OK fill=0.")
    over = cli_bloom("fill-ratio", "bf:*", "--format", "text")
    assert over.exit_code == 1
    lines = over.stdout.strip().splitlines()
    assert [line.split()[:2] for line in lines] == [["bf:a", "OK"], ["bf:b", "WARN"], ["bf:c", "OVER"]]
    assert "1 of 3 filters over the limit: bf:c" in over.stderr
    relaxed = cli_bloom("fill-ratio", "bf:*", "--max", "1.5", "--format", "text")
    assert relaxed.exit_code == 0


def test_fill_ratio_max_fpr(cli_bloom, filled):
    assert cli_bloom("fill-ratio", "bf:a", "--max-fpr", "0.5").exit_code == 0
    result = cli_bloom("fill-ratio", "bf:b", "--max-fpr", "1e-9", "--format", "json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["filters"][0]["status"] == "over"


def test_fill_ratio_json(cli_bloom, filled):
    result = cli_bloom("fill-ratio", "bf:b", "bf:a", "--format", "json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert [f["key"] for f in data["filters"]] == ["bf:b", "bf:a"]
    assert data["filters"][0]["status"] == "warn"
    assert data["thresholds"] == {"warn": 0.8, "max": 1.0, "max_fpr": None}


def test_fill_ratio_prometheus_is_valid_exposition(cli_bloom, filled):
    result = cli_bloom("fill-ratio", "bf:*", "--exact", "--max", "2", "--format", "prometheus")
    assert result.exit_code == 0, result.stderr
    families = {f.name: f for f in text_string_to_metric_families(result.stdout)}
    fill = {s.labels["key"]: s.value for s in families["bloomctl_fill_ratio"].samples}
    assert set(fill) == {"bf:a", "bf:b", "bf:c"}
    assert fill["bf:a"] == pytest.approx(0.1, abs=0.005)
    assert {s.labels["subfilter"] for s in families["bloomctl_bit_fill"].samples} == {"0", "1"}
    assert families["bloomctl_estimated_fpr"].type == "gauge"


def test_prometheus_labels_are_escaped(cli_bloom, bloom):
    weird = 'we"ird\\key'
    bloom.client().execute_command("BF.RESERVE", weird, "0.01", 100)
    result = cli_bloom("fill-ratio", weird, "--format", "prometheus")
    families = {f.name: f for f in text_string_to_metric_families(result.stdout)}
    assert families["bloomctl_items"].samples[0].labels["key"] == weird


def test_fill_ratio_exact_reports_bit_fill(cli_bloom, filled):
    result = cli_bloom("fill-ratio", "bf:b", "--exact", "--format", "json")
    sub = json.loads(result.stdout)["filters"][0]["subfilters"][0]
    model = ModelChain(1000, 0.01, 2)
    for i in range(850):
        model.add(f"bf:b:{i}".encode())
    assert sub["bits_set"] == model.bits_set()[0]


def test_fill_ratio_missing_key_or_empty_pattern(cli_bloom, filled):
    assert cli_bloom("fill-ratio", "nope").exit_code == 5
    nothing = cli_bloom("fill-ratio", "zz:*")
    assert nothing.exit_code == 5 and "no Bloom filter matches" in nothing.stderr


# --- swap and rollback ----------------------------------------------------------------------


@pytest.fixture
def pair(bloom):
    """An active filter with 1000 items and a standby with 1200 (a superset)."""
    client = bloom.client()
    family = KeyFamily.of("users")
    client.execute_command("BF.RESERVE", family.active, "0.01", 5000)
    client.execute_command("BF.RESERVE", family.standby, "0.01", 5000)
    madd(client, family.active, [f"u{i}" for i in range(1000)])
    madd(client, family.standby, [f"u{i}" for i in range(1200)])
    client.hset(family.meta, "generation", "1")
    client.hset(family.standby_meta, "generation", "2")
    return client, family


def test_swap_then_rollback(cli_bloom, pair):
    client, family = pair
    result = cli_bloom("swap", "users", "--keep-old", "600", "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["replaced"] is True and data["items"] == 1200 and data["previous_items"] == 1000
    assert client.execute_command("BF.CARD", "users") == 1200
    assert client.hget(family.meta, "generation") == b"2"
    assert 0 < client.ttl(family.old) <= 600
    assert not client.exists(family.standby)

    back = cli_bloom("rollback", "users", "--yes")
    assert back.exit_code == 0, back.stderr
    assert client.execute_command("BF.CARD", "users") == 1000
    assert client.hget(family.meta, "generation") == b"1"
    assert client.execute_command("BF.CARD", family.standby) == 1200
    assert client.ttl("users") == -1


def test_swap_without_keep_old_frees_the_old_filter(cli_bloom, pair):
    client, family = pair
    result = cli_bloom("swap", "users", "--yes")
    assert result.exit_code == 0
    assert "unlinked" in result.stdout
    assert not client.exists(family.old)
    nothing = cli_bloom("rollback", "users", "--yes")
    assert nothing.exit_code == 5 and "--keep-old" in nothing.stderr


def test_swap_guards_change_nothing(cli_bloom, pair):
    client, family = pair
    client.delete(family.standby)
    missing = cli_bloom("swap", "users", "--yes")
    assert missing.exit_code == 5 and "does not exist" in missing.stderr
    client.set(family.standby, "not a filter")
    wrong = cli_bloom("swap", "users", "--yes")
    assert wrong.exit_code == 5 and "holds a string" in wrong.stderr
    client.delete(family.standby)
    client.execute_command("BF.RESERVE", family.standby, "0.01", 5000)
    madd(client, family.standby, ["a", "b"])
    shrink = cli_bloom("swap", "users", "--yes")
    assert shrink.exit_code == 5 and "--allow-shrink" in shrink.stderr
    assert client.execute_command("BF.CARD", "users") == 1000
    low_guard = cli_bloom("swap", "users", "--yes", "--min-ratio", "0.001")
    assert low_guard.exit_code == 0
    assert client.execute_command("BF.CARD", "users") == 2


def test_swap_allow_shrink_and_custom_standby(cli_bloom, pair):
    client, _ = pair
    client.execute_command("BF.RESERVE", "users:v2", "0.01", 100)
    result = cli_bloom("swap", "users", "--standby", "users:v2", "--allow-shrink", "--yes")
    assert result.exit_code == 0, result.stderr
    assert client.execute_command("BF.CARD", "users") == 0
    assert not client.exists("users:v2")


def test_swap_asks_on_a_terminal(cli_bloom, pair, monkeypatch):
    import bloomctl.cli.cutover as cutover

    client, _ = pair
    monkeypatch.setattr(cutover, "stdin_is_tty", lambda: True)
    refused = cli_bloom("swap", "users", input="n\n")
    assert refused.exit_code == 5 and "not confirmed" in refused.stderr
    assert client.execute_command("BF.CARD", "users") == 1000
    accepted = cli_bloom("swap", "users", input="y\n")
    assert accepted.exit_code == 0
    assert client.execute_command("BF.CARD", "users") == 1200


def test_readers_see_every_member_through_many_swaps(bloom):
    """BF.EXISTS from another connection, for a member of both filters, never errs and never says 0."""
    from bloomctl import lifecycle
    from bloomctl.server import detect
    from tests.hammer import Hammer

    client = bloom.client()
    server = detect(client)
    family = KeyFamily.of("users")
    client.execute_command("BF.RESERVE", family.active, "0.01", 1000)
    client.execute_command("BF.ADD", family.active, "member")
    reader = bloom.client()
    with Hammer(reader, lambda c: c.execute_command("BF.EXISTS", "users", "member"), lambda v: v == 1) as hammer:
        for _ in range(200):
            client.execute_command("BF.RESERVE", family.standby, "0.01", 1000)
            client.execute_command("BF.ADD", family.standby, "member")
            lifecycle.swap(client, lifecycle.prepare_swap(client, server, "users"))
    assert hammer.calls > 200
    assert hammer.bad == []


def test_swap_on_a_cluster_with_awkward_keys(bcluster):
    from bloomctl import lifecycle
    from bloomctl.connection import connect, settings_from
    from bloomctl.server import detect

    client = connect(settings_from(bcluster.url))
    server = detect(client)
    assert server.cluster and server.has_bloom
    for key in ("users", "bf:{users}", "a}b", "ünï code"):
        family = KeyFamily.of(key)
        client.execute_command("BF.RESERVE", family.active, "0.01", 100)
        client.execute_command("BF.RESERVE", family.standby, "0.01", 100)
        client.execute_command("BF.ADD", family.standby, "x")
        lifecycle.swap(client, lifecycle.prepare_swap(client, server, key, allow_shrink=True), keep_old_seconds=60)
        assert client.execute_command("BF.EXISTS", family.active, "x") == 1
        lifecycle.rollback(client, key)
        assert client.execute_command("BF.EXISTS", family.active, "x") == 0
        description = lifecycle.describe(client, key)
        assert description.node is not None and description.slot == family.slot


def test_fill_ratio_glob_scans_every_cluster_master(bcluster):
    from bloomctl.connection import connect, settings_from
    from bloomctl.fill import Thresholds, fill_ratio

    client = connect(settings_from(bcluster.url))
    keys = [f"bf:{i}" for i in range(30)]
    for key in keys:
        client.execute_command("BF.RESERVE", key, "0.01", 100)
    owners = {client.get_node_from_key(key).port for key in keys}
    assert len(owners) == 3  # the keys really are spread over all masters
    reports = fill_ratio(client, ["bf:*"], Thresholds())
    assert sorted(r.key.decode() for r in reports) == sorted(keys)
