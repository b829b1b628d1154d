"""The lifecycle suite: reserve, info, swap and rollback end to end through the CLI (fill-ratio: test_fill_ratio.py).

Runs on every backend and topology (``target``): the bitmap backend on plain Redis 7
(standalone and a 3-master Cluster) everywhere, RedisBloom wherever the module is given.
"""

from __future__ import annotations

import json

import pytest

from bloomctl.keys import KeyFamily
from bloomctl.lifecycle import front as lifecycle
from bloomctl.lifecycle.metadata import read_metadata
from bloomctl.server.capabilities import detect
from bloomctl.sizing.bloom import plan
from tests.helpers.hammer import Hammer
from tests.helpers.matrix import SIGNALS_LOCKS_ERRORS
from tests.helpers.redis import active_and_standby

pytestmark = pytest.mark.matrix  # CI runs this module on every server of the matrix

AWKWARD_KEYS = ["users", "bf:{users}", "a}b", "ünï code"]


def expansion_args(target) -> list[str]:
    return [] if target.backend.name == "redisbloom" else ["--nonscaling"]


# --- reserve --------------------------------------------------------------------------------


def test_reserve_creates_the_planned_filter_with_metadata(target):
    cli = target.cli
    result = cli("reserve", "users", "-c", "100k", "-e", "0.1%", "--backend", target.backend.name, "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["created"] is True and data["filter"]["backend"] == target.backend.name
    expected = plan(100_000, 0.001, 2 if target.backend.name == "redisbloom" else None)
    assert data["filter"]["size_bytes"] == target.backend.size_bytes(expected) == data["plan"]["size_bytes"]
    assert data["filter"]["subfilters"][0]["hashes"] == expected.first.hashes
    assert data["filter"]["subfilters"][0]["error_rate"] == pytest.approx(expected.first.error_rate)
    meta = read_metadata(target.client, KeyFamily.of("users").meta)
    assert meta["backend"] == target.backend.name and float(meta["error_rate"]) == 0.001
    assert meta["created_by"].startswith("bloomctl ")


def test_reserve_guards(target):
    cli = target.cli
    args = ["-c", "1000", "-e", "1%", "--backend", target.backend.name, *expansion_args(target)]
    assert cli("reserve", "users", *args).exit_code == 0
    again = cli("reserve", "users", *args)
    assert again.exit_code == 5 and "already exists" in again.stderr and again.stdout == ""
    same = cli("reserve", "users", *args, "--if-not-exists", "--format", "table")
    assert same.exit_code == 0 and "nothing to do" in same.stdout
    same = cli("reserve", "users", *args, "--if-not-exists", "--format", "json")
    assert same.exit_code == 0 and json.loads(same.stdout)["created"] is False
    other = cli(
        "reserve",
        "users",
        "-c",
        "2000",
        "-e",
        "1%",
        "--backend",
        target.backend.name,
        *expansion_args(target),
        "--if-not-exists",
    )
    assert other.exit_code == 5 and "different parameters" in other.stderr
    target.client.set("taken", "precious")
    taken = cli("reserve", "taken", *args)
    assert taken.exit_code == 5 and "string" in taken.stderr
    assert target.client.get("taken") == b"precious"
    dry = cli("reserve", "fresh", *args, "--dry-run", "--format", "json")
    assert dry.exit_code == 0 and json.loads(dry.stdout)["key_exists"] is False
    assert not target.client.exists("fresh")


@pytest.mark.parametrize("key", AWKWARD_KEYS)
def test_awkward_key_names(target, key):
    assert target.cli("reserve", key, "-c", "100", "-e", "1%", "--backend", target.backend.name).exit_code == 0
    target.add(key, [b"x", "ÿ", b"\x00\xff"])
    data = json.loads(target.cli("info", key, "--format", "json").stdout)
    assert data["key"] == key and data["items"] == 3
    assert data["metadata"]["backend"] == target.backend.name


# --- info -----------------------------------------------------------------------------------


def test_info_json_and_table(target):
    target.reserve("users", 1000)
    target.add("users", [f"user:{i}" for i in range(600)])
    target.client.expire("users", 3600)
    target.reserve(KeyFamily.of("users").standby, 1000)
    data = json.loads(target.cli("info", "users", "--format", "json").stdout)
    assert data["backend"] == target.backend.name
    assert 590 <= data["items"] <= 600  # an add that finds every bit already set (a false positive) is not counted
    assert data["items"] == target.card("users")
    assert data["fill_ratio"] == pytest.approx(data["items"] / 1000)
    assert 0 < data["estimated_fpr"] < 0.01
    assert data["companions"]["standby"]["exists"] is True and data["companions"]["old"]["exists"] is False
    assert 3500 < data["ttl_seconds"] <= 3600
    assert data["slot"] == KeyFamily.of("users").slot
    assert (data["node"] is not None) == target.cluster
    table = target.cli("info", "users", "--format", "table")
    assert table.exit_code == 0 and "{users}:standby  (exists)" in table.stdout


def test_info_exact_measures_the_bits(target):
    target.reserve("users", 2000)
    target.add("users", [f"u{i}" for i in range(1500)])
    data = json.loads(target.cli("info", "users", "--exact", "--format", "json").stdout)
    assert data["exact"] is True
    sub = data["subfilters"][0]
    assert 0 < sub["bits_set"] <= 1500 * sub["hashes"]
    assert sub["estimated_fpr"] == pytest.approx((sub["bits_set"] / sub["bits"]) ** sub["hashes"])
    # the measured fill is close to its expectation 1 - e^(-kn/m)
    estimate = json.loads(target.cli("info", "users", "--format", "json").stdout)["subfilters"][0]["bit_fill"]
    assert sub["bit_fill"] == pytest.approx(estimate, rel=0.03)


def test_info_errors(target):
    missing = target.cli("info", "nope")
    assert missing.exit_code == 5 and "does not exist" in missing.stderr and missing.stdout == ""
    target.client.hset("h", "a", "b")
    wrong = target.cli("info", "h")
    assert wrong.exit_code == 5 and "holds a hash" in wrong.stderr


# --- swap and rollback ----------------------------------------------------------------------


@pytest.fixture
def pair(target):
    """An active filter with 1000 items and a standby with 1200 (a superset), with metadata."""
    family = KeyFamily.of("users")
    target.reserve(family.active, 5000)
    target.reserve(family.standby, 5000)
    target.add(family.active, [f"u{i}" for i in range(1000)])
    target.add(family.standby, [f"u{i}" for i in range(1200)])
    target.client.hset(family.meta, mapping={"generation": "1", "created_by": "bloomctl 0.1.0"})
    target.client.hset(family.standby_meta, mapping={"generation": "2", "created_by": "bloomctl 0.1.0"})
    return target, family


def test_swap_then_rollback(pair):
    target, family = pair
    before_active, before_standby = target.card("users"), target.card(family.standby)
    result = target.cli("swap", "users", "--keep-old", "600", "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["replaced"] is True and (data["items"], data["previous_items"]) == (before_standby, before_active)
    assert target.card("users") == before_standby
    assert target.client.hget(family.meta, "generation") == b"2"
    assert 0 < target.client.ttl(family.old) <= 600
    assert not target.client.exists(family.standby)

    back = target.cli("rollback", "users", "--yes")
    assert back.exit_code == 0, back.stderr
    assert target.card("users") == before_active
    assert target.client.hget(family.meta, "generation") == b"1"
    assert target.card(family.standby) == before_standby
    assert target.client.ttl("users") == -1


def test_swap_without_keep_old(pair):
    target, family = pair
    result = target.cli("swap", "users", "--yes", "--keep-old", "0")
    assert result.exit_code == 0 and "unlinked" in result.stdout
    assert not target.client.exists(family.old)
    nothing = target.cli("rollback", "users", "--yes")
    assert nothing.exit_code == 5 and "--keep-old" in nothing.stderr


def test_swap_guards_change_nothing(pair):
    target, family = pair
    active_items = target.card("users")
    target.client.delete(family.standby)
    missing = target.cli("swap", "users", "--yes")
    assert missing.exit_code == 5 and "does not exist" in missing.stderr
    target.client.set(family.standby, "not a filter")
    wrong = target.cli("swap", "users", "--yes")
    assert wrong.exit_code == 5 and "string" in wrong.stderr
    target.client.delete(family.standby)
    target.reserve(family.standby, 5000)
    target.add(family.standby, ["a", "b"])
    shrink = target.cli("swap", "users", "--yes")
    assert shrink.exit_code == 5 and "--allow-shrink" in shrink.stderr
    assert target.card("users") == active_items
    allowed = target.cli("swap", "users", "--yes", "--allow-shrink")
    assert allowed.exit_code == 0 and target.card("users") == 2


def test_swap_custom_standby_must_share_the_slot_on_a_cluster(pair):
    target, _ = pair
    target.reserve("users:v2", 100) if not target.cluster else target.reserve("{users}:v2", 100)
    standby = "{users}:v2" if target.cluster else "users:v2"
    result = target.cli("swap", "users", "--standby", standby, "--allow-shrink", "--yes")
    assert result.exit_code == 0, result.stderr
    assert target.card("users") == 0 and not target.client.exists(standby)
    if target.cluster:
        target.reserve("elsewhere", 100)
        crossed = target.cli("swap", "users", "--standby", "elsewhere", "--yes")
        assert crossed.exit_code == 5 and "hash tag" in crossed.stderr


def test_swap_asks_on_a_terminal(pair, monkeypatch):
    import bloomctl.cli.confirm as confirm

    target, _ = pair
    before = target.card("users")
    monkeypatch.setattr(confirm, "stdin_is_tty", lambda: True)
    refused = target.cli("swap", "users", input="n\n")
    assert refused.exit_code == 5 and "not confirmed" in refused.stderr
    assert target.card("users") == before
    assert target.cli("swap", "users", input="y\n").exit_code == 0
    assert target.card("users") != before


@pytest.mark.parametrize("key", AWKWARD_KEYS)
def test_readers_see_every_member_through_many_swaps(target, key):
    """`exists` from another connection, for a member of both filters, never errs and never says no."""
    from bloomctl.server.connection import connect, settings_from

    server = detect(target.client)
    family = KeyFamily.of(key)
    target.reserve(family.active, 1000)
    target.add(family.active, ["member"])
    reader = connect(settings_from(target.url))
    backend = target.backend

    def probe(client):
        return backend.mexists(client, family.active, ["member"])

    with Hammer(reader, probe, lambda answer: answer == [True]) as hammer:
        for _ in range(60):
            target.reserve(family.standby, 1000)
            target.add(family.standby, ["member"])
            lifecycle.swap(target.client, server, key)
    assert hammer.calls > 60
    assert hammer.bad == []


def test_swap_refuses_a_companion_as_standby(pair):
    target, family = pair
    target.reserve(family.old, 100)
    before = target.card("users")
    result = target.cli("swap", "users", "--standby", family.old.decode(), "--yes", "--allow-shrink")
    assert result.exit_code == 5 and "companion" in result.stderr
    assert target.card("users") == before and target.client.exists(family.old) and target.client.exists(family.standby)


def test_swap_keep_old_limits(pair):
    target, family = pair
    huge = target.cli("swap", "users", "--yes", "--keep-old", "1e14")
    assert huge.exit_code == 2
    nan = target.cli("swap", "users", "--yes", "--keep-old", "nan")
    assert nan.exit_code == 2
    assert target.client.exists(family.standby)  # nothing moved
    tiny = target.cli("swap", "users", "--yes", "--keep-old", "0.0001", "--format", "json")
    assert tiny.exit_code == 0
    data = json.loads(tiny.stdout)
    # what it reports; that 0.0001 s really becomes PEXPIRE 1 (not 0, which would unlink) is
    # test_swap_atomic.py::test_keep_old_bounds's job: a 1 ms key cannot be observed reliably from here
    assert data["old"] == family.old.decode() and data["keep_old_seconds"] == 0.0001


@pytest.mark.parametrize("key", ["x[/b]", "[red]hi", "tab\there"])
def test_table_output_prints_keys_and_metadata_literally(target, key):
    assert target.cli("reserve", key, "-c", "100", "-e", "1%", "--backend", target.backend.name).exit_code == 0
    target.client.hset(KeyFamily.of(key).meta, "note", "[/x] oops")
    result = target.cli("info", key, "--format", "table")
    assert result.exit_code == 0, result.stderr
    assert key.split("\t")[0] in result.stdout and "[/x] oops" in result.stdout


def test_reserve_dry_run_makes_the_same_checks(target):
    target.client.set("taken", "precious")
    dry = target.cli("reserve", "taken", "-c", "100", "-e", "1%", "--backend", target.backend.name, "--dry-run")
    assert dry.exit_code == 5 and "string" in dry.stderr


def test_reserve_refuses_a_filter_bigger_than_free_memory(target):
    from bloomctl.server.topology import node_client

    node = node_client(target.client, b"big")
    node.config_set("maxmemory", "50mb")
    try:
        args = ["-c", "70M", "-e", "1%", "--backend", target.backend.name, *expansion_args(target)]  # ~84-96 MB
        result = target.cli("reserve", "big", *args)
        assert result.exit_code == 5 and "--force" in result.stderr and "maxmemory" in result.stderr
        assert not target.client.exists("big")
    finally:
        node.config_set("maxmemory", "0")
    too_big = target.cli(
        "reserve", "big", "-c", "1e11", "-e", "1%", "--backend", target.backend.name, *expansion_args(target)
    )
    # RedisBloom 2.x: more than the machine's memory (5); Redis 8: over its 2**30 capacity per filter (2);
    # bitmap: over the 512 MB string limit (2)
    line = detect(target.client).line if target.backend.name == "redisbloom" else "bitmap"
    assert too_big.exit_code == (5 if line == "redisbloom2" else 2), too_big.stderr
    if line == "redis8":
        assert "at most 1,073,741,824" in too_big.stderr
    assert not target.client.exists("big")


def test_reserve_refuses_a_metadata_key_of_another_type(target):
    target.client.set(KeyFamily.of("users").meta, "not a hash")
    result = target.cli("reserve", "users", "-c", "100", "-e", "1%", "--backend", target.backend.name)
    assert result.exit_code == 5 and "not bloomctl metadata" in result.stderr
    assert not target.client.exists("users")


@SIGNALS_LOCKS_ERRORS
def test_a_swap_keeps_the_replaced_filter_for_rollback_by_default(target):
    """(#10 item 15) The replaced filter was unlinked unless --keep-old was given: a bad swap could not be
    rolled back. It is kept for an hour by default; `--keep-old 0` drops it."""
    active_and_standby(target, 1000, 900)
    swapped = target.cli("swap", "users", "--yes")
    assert swapped.exit_code == 0, swapped.stderr
    old = KeyFamily.of("users").old
    assert target.card(old) == 1000 and 3500 < target.client.ttl(old) <= 3600
    assert target.cli("rollback", "users", "--yes").exit_code == 0 and target.card("users") == 1000
    again = target.cli("swap", "users", "--yes", "--keep-old", "0")  # the rolled-back filter is the standby
    assert again.exit_code == 0 and target.card("users") == 900 and not target.client.exists(old)
