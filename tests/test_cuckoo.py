"""Cuckoo filters: the module-free backend's format and semantics, plan against CF.INFO, reserve, info,
fill-ratio and metrics, on both cuckoo backends (``ctarget``: the module-free one on plain Redis,
standalone and Cluster; RedisBloom's CF.* where the module is given).
"""

from __future__ import annotations

import json
import math
import struct

import pytest

from bloomctl.backends import get
from bloomctl.backends.cuckoo_lua import LUA_HEADER, LUA_MAGIC, LuaCuckoo, lua_positions, parse_lua_header
from bloomctl.backends.library import SCRIPT
from bloomctl.errors import KeyMissing, StateConflict, UsageError, WrongType
from bloomctl.filters.bloom import Filter
from bloomctl.keys import KeyFamily
from bloomctl.sizing.cuckoo import FULL_LOAD, cuckoo_plan, full_load, lookup_fpr
from tests.helpers.redis import backend_choice

pytestmark = pytest.mark.matrix  # CI runs this module on every server of the matrix

ITEMS = [b"", b"\x00", b"\xff\xfe\x00binary", "ünïcødé".encode(), b"a" * 1000, b"user:42"]


def lua_plan(capacity: int, **kwargs):
    return cuckoo_plan(capacity, engine="lua", expansion=None, **kwargs)


@pytest.fixture(params=["functions", "script"])
def lua(request, plain):
    """The module-free cuckoo backend in both modes (Functions, and EVALSHA for servers before Redis 7)."""
    return LuaCuckoo(mode=request.param), plain.client()


# --- the module-free format ----------------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 16, 32])
def test_module_free_layout_is_the_documented_one(lua, bits):
    backend, client = lua
    p = lua_plan(1000, bucket_size=4, max_iterations=50, fingerprint_bits=bits)
    backend.reserve(client, b"c", p)
    raw = client.get("c")
    assert len(raw) == 64 + p.buckets * 4 * bits // 8 == backend.size_bytes(p)
    assert raw.startswith(LUA_MAGIC) and raw[56:64] == bytes(8)
    header = parse_lua_header(raw)
    assert header == {
        "format": 1,
        "scheme": 1,
        "fingerprint_bits": bits,
        "bucket_size": 4,
        "max_iterations": 50,
        "buckets": p.buckets,
        "capacity": 1000,
        "items": 0,
        "deletes": 0,
        "error_rate": p.error_rate,
    }
    assert backend.madd(client, b"c", [b"x", b"y", b"x"]) == [True] * 3
    backend.mdelete(client, b"c", [b"y"])
    raw = client.get("c")
    assert struct.unpack(">qq", raw[32:48]) == (2, 1)  # items and deletes, where the doc says
    # the reference positions: item "x" sits twice in its two buckets, with its fingerprint
    width = bits // 8
    fp, i1, i2 = lua_positions(b"x", p.buckets, bits)
    assert i1 ^ ((fp * 0x5BD1E995) % 2**32 % p.buckets) == i2 and i2 ^ ((fp * 0x5BD1E995) % 2**32 % p.buckets) == i1

    def slots(bucket):
        start = 64 + bucket * 4 * width
        return [int.from_bytes(raw[start + j * width : start + (j + 1) * width], "big") for j in range(4)]

    found = slots(i1) + (slots(i2) if i2 != i1 else [])
    assert found.count(fp) == 2
    occupied = sum(1 for b in range(p.buckets) for v in slots(b) if v)
    assert occupied == 2


def test_module_free_operations(lua):
    backend, client = lua
    backend.reserve(client, b"c", lua_plan(10_000))
    assert backend.madd(client, b"c", ITEMS) == [True] * len(ITEMS)
    assert backend.mexists(client, b"c", ITEMS) == [True] * len(ITEMS)
    assert backend.mexists(client, b"c", [b"absent", b"other"]) == [False, False]
    assert backend.count(client, b"c", b"user:42") == 1
    backend.madd(client, b"c", [b"user:42"])
    assert backend.count(client, b"c", b"user:42") == 2
    assert backend.mdelete(client, b"c", [b"user:42", b"never added"]) == [True, False]
    assert backend.mexists(client, b"c", [b"user:42"]) == [True]  # one copy left
    assert backend.mdelete(client, b"c", [b"user:42"]) == [True]
    assert backend.mexists(client, b"c", [b"user:42"]) == [False]
    state = backend.info(client, b"c")
    assert (state.items, state.deletes, state.kind) == (len(ITEMS) - 1, 2, "cuckoo")
    # the library's single-item and NX forms
    cmd = backend.command(client, "cf_addnx", b"c", b"user:1")
    assert client.execute_command(*cmd) == 1 and client.execute_command(*cmd) == 0
    assert client.execute_command(*backend.command(client, "cf_exists", b"c", b"user:1", read_only=True)) == 1
    assert client.execute_command(*backend.command(client, "cf_del", b"c", b"user:1")) == 1


def test_module_free_errors(lua):
    backend, client = lua
    with pytest.raises(KeyMissing):
        backend.madd(client, b"missing", [b"x"])  # never creates a filter
    assert client.exists("missing") == 0
    client.set("note", "a string")
    with pytest.raises(WrongType):
        backend.mexists(client, b"note", [b"x"])
    backend.reserve(client, b"c", lua_plan(100))
    with pytest.raises(StateConflict, match="already exists"):
        backend.reserve(client, b"c", lua_plan(100))
    with pytest.raises(UsageError, match="never grows"):
        cuckoo_plan(100, engine="lua", expansion=2)
    bloom = get("bitmap")
    with pytest.raises(UsageError):
        bloom.reserve(client, b"b", lua_plan(100))


def test_a_failed_insert_changes_nothing(lua):
    """Relocation is kept in memory and written only when it ends in a free slot: an insert into a
    full filter leaves every byte as it was (RedisBloom rolls its kicks back the same way)."""
    backend, client = lua
    backend.reserve(client, b"c", lua_plan(64, bucket_size=2, max_iterations=10, fingerprint_bits=8))
    failures = 0
    for i in range(400):
        before = client.get("c")
        reply = client.execute_command(*backend.command(client, "cf_madd", b"c", b"i:%d" % i))
        if reply == [-1]:
            failures += 1
            assert client.get("c") == before
    assert failures > 0
    with pytest.raises(StateConflict, match="no room"):
        backend.madd(client, b"c", [b"one more %d" % i for i in range(20)])


def test_module_free_false_positives_and_full_load_are_within_the_documented_bounds(plain):
    """130k+ inserts of distinct items until the first failure, then 100k lookups of absent ones:
    the failure load is at least the table's, and the false-positive rate what the load predicts."""
    backend, client = LuaCuckoo(), plain.client()
    p = lua_plan(1 << 17, bucket_size=4, max_iterations=20, fingerprint_bits=8)
    backend.reserve(client, b"c", p)
    inserted, failed_at = 0, None
    while failed_at is None:
        batch = [b"in:%d" % (inserted + j) for j in range(500)]
        reply = client.execute_command(*backend.command(client, "cf_madd", b"c", *batch))
        if -1 in reply:
            failed_at = inserted + reply.index(-1)
        inserted += len(batch)
    load = backend.info(client, b"c").items / p.slots
    assert failed_at / p.slots >= full_load(4, 20, "lua")
    assert load <= 1.0
    absent = [b"out:%d" % i for i in range(100_000)]
    hits = sum(sum(backend.mexists(client, b"c", absent[i : i + 2000])) for i in range(0, len(absent), 2000))
    expected = lookup_fpr(load, 4, 8)
    assert 0.8 * expected <= hits / len(absent) <= 1.2 * expected
    assert all(backend.mexists(client, b"c", [b"in:%d" % i for i in range(0, failed_at, 97)]))  # no false negative


def test_the_library_runs_without_functions(plain):
    backend = LuaCuckoo(mode=SCRIPT)
    client = plain.client()
    backend.reserve(client, b"c", lua_plan(1000))
    assert backend.madd(client, b"c", [b"a"]) == [True] and backend.mexists(client, b"c", [b"a", b"b"]) == [True, False]


# --- plan -------------------------------------------------------------------------------------


def test_plan_rounds_buckets_and_expansion_as_the_module_does():
    p = cuckoo_plan(1000)  # CF.RESERVE's defaults
    assert (p.bucket_size, p.max_iterations, p.expansion, p.buckets, p.slots) == (2, 20, 1, 512, 1024)
    assert p.size_bytes == 40 + 16 + 1024 == 1080
    assert cuckoo_plan(100_000, bucket_size=3, expansion=2).size_bytes == 196_664
    assert cuckoo_plan(77, bucket_size=1).size_bytes == 184
    assert cuckoo_plan(1000, expansion=3).growth == 4
    assert cuckoo_plan(2**20 + 1, bucket_size=2).buckets == 2**19  # integer division, then rounding up
    with pytest.raises(UsageError, match="twice"):
        cuckoo_plan(3, bucket_size=2)
    with pytest.raises(UsageError):
        cuckoo_plan(1000, bucket_size=256)


def test_plan_projects_growth_from_the_measured_full_load():
    p = cuckoo_plan(1_000_000, bucket_size=4, items=900_000)
    assert p.usable_capacity == math.floor(p.slots * FULL_LOAD["redisbloom"][4][1])
    assert len(p.chain) == 2 and p.total_memory_bytes == 40 + 2 * (16 + p.slots)
    assert any("grow this filter to 2 sub-filters" in w for w in p.warnings())
    assert cuckoo_plan(1_000_000, bucket_size=4, items=700_000).warnings() == []


def test_plan_advises_a_smaller_bucket_size_for_a_target_rate():
    p = cuckoo_plan(1_000_000, bucket_size=4, error_rate=0.01)
    assert p.error_rate > 0.01
    assert any("use `bucket_size` 2" in w for w in p.warnings())
    impossible = cuckoo_plan(1_000_000, bucket_size=2, error_rate=0.001)
    assert any("no smaller bucket size reaches it" in w and "16-bit" in w for w in impossible.warnings())
    wide = cuckoo_plan(1_000_000, engine="lua", expansion=None, error_rate=0.001)
    assert wide.fingerprint_bits == 16 and wide.error_rate <= 0.001 and wide.warnings() == []


def test_full_load_takes_the_lower_measured_neighbour():
    assert full_load(2, 20) == 0.40
    assert full_load(3, 499) == full_load(3, 200) < full_load(3, 500)
    assert full_load(7, 20) == full_load(4, 20)  # between measured bucket sizes: the smaller one's
    assert full_load(255, 65535) == FULL_LOAD["redisbloom"][8][500]


def test_plan_command_prints_a_cuckoo_plan(cli):
    result = cli("plan", "--type", "cuckoo", "-c", "1M", "--bucket-size", "4", "--items", "900k", "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["type"] == "cuckoo" and data["size_bytes"] == 1_048_632 and data["filters"] == 2
    assert "grow this filter" in result.stderr
    lua = cli("plan", "--type", "cuckoo", "-c", "1M", "-e", "0.01%", "--backend", "module-free", "--format", "json")
    assert json.loads(lua.stdout)["fingerprint_bits"] == 16
    bad = cli("plan", "-c", "1M", "--bucket-size", "4")
    assert bad.exit_code == 2 and "--type cuckoo" in bad.stderr and bad.stdout == ""
    missing = cli("plan", "-c", "1M")
    assert missing.exit_code == 2 and "--error-rate" in missing.stderr


# --- reserve, info, fill-ratio on both backends -------------------------------------------------


def reserve_args(ctarget, *extra: str) -> list[str]:
    return ["reserve", "cf", "--type", "cuckoo", "--backend", backend_choice(ctarget), *extra]


def test_reserve_and_info(ctarget):
    cli = ctarget.cli
    result = cli(*reserve_args(ctarget, "-c", "10000", "--bucket-size", "4", "--format", "json"))
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["created"] and data["filter"]["type"] == "cuckoo" and data["filter"]["backend"] == ctarget.backend.name
    assert data["filter"]["size_bytes"] == data["plan"]["size_bytes"]
    assert data["filter"]["buckets"] == 4096 and data["filter"]["bucket_size"] == 4
    again = cli(*reserve_args(ctarget, "-c", "10000", "--bucket-size", "4", "--if-not-exists", "--format", "json"))
    assert again.exit_code == 0 and json.loads(again.stdout)["created"] is False
    other = cli(*reserve_args(ctarget, "-c", "10000", "--bucket-size", "2", "--if-not-exists"))
    assert other.exit_code == 5 and "different parameters" in other.stderr
    Filter(ctarget.client, "cf").madd([b"item:%d" % i for i in range(3000)])
    Filter(ctarget.client, "cf").mdelete([b"item:1", b"item:2"])
    info = json.loads(cli("info", "cf", "--exact", "--format", "json").stdout)
    assert (info["items"], info["deleted"]) == (2998, 2)
    assert info["load_factor"] == pytest.approx(2998 / 16384)
    assert info["subfilters"][0]["occupied"] == 2998 and info["exact"]
    assert info["metadata"]["bucket_size"] == 4 and info["metadata"]["type"] == "cuckoo"
    table = cli("info", "cf", "--format", "table")
    assert table.exit_code == 0 and "load factor" in table.stdout and "deleted" in table.stdout


def test_fill_ratio_judges_the_load_against_the_measured_full_load(ctarget):
    """The default thresholds at their boundary: just under the warn point is OK, past it WARN,
    at the full load OVER (exit 1); an explicit --max wins."""
    cli = ctarget.cli
    assert (
        cli(
            *reserve_args(ctarget, "-c", "1024", "--bucket-size", "4", "--max-iterations", "500", "--nonscaling")
        ).exit_code
        == 0
    )
    limit = full_load(4, 500, ctarget.backend.engine)
    slots = 1024
    f = Filter(ctarget.client, "cf")

    def fill_to(n):
        have = f.backend.card(ctarget.client, b"cf")
        f.madd([b"x:%d" % i for i in range(have, n)])

    fill_to(math.floor(0.8 * limit * slots))
    ok = cli("fill-ratio", "cf", "--format", "json")
    assert ok.exit_code == 0 and json.loads(ok.stdout)["filters"][0]["status"] == "ok"
    assert json.loads(ok.stdout)["filters"][0]["thresholds"] == {"warn": pytest.approx(0.8 * limit), "max": limit}
    fill_to(math.floor(0.8 * limit * slots) + 2)
    assert json.loads(cli("fill-ratio", "cf", "--format", "json").stdout)["filters"][0]["status"] == "warn"
    fill_to(math.ceil(limit * slots))
    over = cli("fill-ratio", "cf")
    assert over.exit_code == 1 and "OVER" in over.stdout and "type=cuckoo" in over.stdout and "load" in over.stdout
    assert cli("fill-ratio", "cf", "--max", "0.99").exit_code == 0
    prom = cli("fill-ratio", "cf", "--format", "prometheus", "--exact")
    assert 'bloomctl_filter_type{key="cf",type="cuckoo"} 1.0' in prom.stdout
    assert f'bloomctl_full_load_ratio{{key="cf"}} {limit}' in prom.stdout
    assert 'bloomctl_deleted_items{key="cf"} 0.0' in prom.stdout
    assert 'bloomctl_bit_fill_ratio{key="cf",subfilter="0"}' in prom.stdout


def test_fill_ratio_finds_cuckoo_filters_by_pattern(ctarget):
    cli = ctarget.cli
    for key in ("cf:a", "cf:b"):
        assert (
            cli("reserve", key, "--type", "cuckoo", "-c", "1000", "--backend", backend_choice(ctarget)).exit_code == 0
        )
    ctarget.client.set("cf:note", "not a filter")
    result = cli("fill-ratio", "cf:*", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert sorted(r["key"] for r in json.loads(result.stdout)["filters"]) == ["cf:a", "cf:b"]


def test_deleting_from_a_bloom_filter_is_refused(plain, cli_plain):
    assert cli_plain("reserve", "b", "-c", "1000", "-e", "1%").exit_code == 0
    with pytest.raises(StateConflict, match="Bloom filter"):
        Filter(plain.client(), "b").delete(b"x")


def test_header_struct_matches_the_lua_packing():
    assert LUA_HEADER.size == 56 and KeyFamily.of("s").standby_log == b"{s}:standby:log"
