"""The planner: input parsing, RedisBloom's sizing arithmetic, and (RedisBloom tier) the real server's numbers."""

from __future__ import annotations

import json
import math

import pytest

from bloomctl import backends
from bloomctl.errors import UsageError
from bloomctl.server.capabilities import detect
from bloomctl.sizing.bloom import (
    CHAIN_OVERHEAD_BYTES,
    LINK_OVERHEAD_BYTES,
    SubFilter,
    for_line,
    parse_count,
    parse_error_rate,
    plan,
)

rb = backends.get("redisbloom")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1000000", 1_000_000),
        ("1_000_000", 1_000_000),
        ("1e6", 1_000_000),
        ("1M", 1_000_000),
        ("1m", 1_000_000),
        ("2.5k", 2_500),
        ("3G", 3_000_000_000),
        (" 42 ", 42),
        (7, 7),
    ],
)
def test_parse_count_accepts_the_documented_spellings(text, expected):
    assert parse_count(text) == expected


@pytest.mark.parametrize("text", ["0", "-5", "1.5", "abc", "", "1e-3", "2.5", "1kk", "M"])
def test_parse_count_rejects_nonsense(text):
    with pytest.raises(UsageError):
        parse_count(text)


@pytest.mark.parametrize(("text", "expected"), [("0.01", 0.01), ("1%", 0.01), ("0.1%", 0.001), ("5e-4", 0.0005)])
def test_parse_error_rate(text, expected):
    assert parse_error_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["0", "1", "100%", "0%", "-0.1", "1.5", "x", "%"])
def test_parse_error_rate_rejects_out_of_range(text):
    with pytest.raises(UsageError):
        parse_error_rate(text)


def test_plan_validates_arguments():
    with pytest.raises(UsageError):
        plan(0, 0.01)
    with pytest.raises(UsageError):
        plan(10, 1.0)
    with pytest.raises(UsageError):
        plan(10, 0.01, expansion=0)
    with pytest.raises(UsageError):
        plan(10, 0.01, items=-1)


def test_first_subfilter_follows_bloom_init():
    """bits = floor(n * bpe) rounded up to 64-bit words, k = ceil(ln2 * bpe), error halved when scaling."""
    p = plan(1_000_000, 0.01)
    bpe = -math.log(0.005) / 0.480453013918201
    raw = int(1_000_000 * bpe)
    assert p.first.error_rate == 0.005
    assert p.first.bytes == math.ceil(raw / 64) * 8
    assert p.first.bits == p.first.bytes * 8
    assert p.first.hashes == math.ceil(0.693147180559945 * bpe) == 8
    assert p.size_bytes == CHAIN_OVERHEAD_BYTES + LINK_OVERHEAD_BYTES + p.first.bytes
    nonscaling = plan(1_000_000, 0.01, expansion=None)
    assert nonscaling.first.error_rate == 0.01
    assert nonscaling.first.hashes == 7


def test_sizes_measured_in_shared_context():
    """Figures measured on RedisBloom 2.8 / Redis 7.0 (../shared/CONTEXT.md)."""
    assert plan(1_000_000, 0.01).size_bytes == 1_378_568
    assert plan(1_000_000, 0.01, expansion=None).size_bytes == 1_198_232
    assert plan(100, 0.01).size_bytes == 240


def test_tiny_filter_keeps_at_least_one_word():
    sub = SubFilter.sized(0, 1, 0.99)
    assert sub.bytes == 8 and sub.bits == 64


def test_growth_chain_capacity_and_error():
    p = plan(1000, 0.01, expansion=3, items=20_000)
    caps = [s.capacity for s in p.chain]
    assert caps == [1000, 3000, 9000, 27000]
    assert [s.error_rate for s in p.chain] == pytest.approx([0.005, 0.0025, 0.00125, 0.000625])
    assert p.total_capacity == sum(caps) >= 20_000
    assert p.total_memory_bytes == CHAIN_OVERHEAD_BYTES + sum(LINK_OVERHEAD_BYTES + s.bytes for s in p.chain)
    assert p.compound_error_rate < 0.01  # the tightening keeps the compound rate under the target


def test_naive_estimate_is_smaller_than_redisbloom():
    p = plan(1_000_000, 0.01)
    assert p.naive_bytes == math.ceil(1_000_000 * -math.log(0.01) / math.log(2) ** 2 / 8)
    assert p.size_bytes > p.naive_bytes * 1.1


def test_warnings_for_poor_plans():
    assert plan(1000, 0.01, items=500).warnings() == []
    nonscaling_full = plan(1000, 0.01, expansion=None, items=900).warnings()
    assert len(nonscaling_full) == 1 and "1,125" in nonscaling_full[0]
    overfull = plan(1000, 0.01, expansion=None, items=2000)
    assert "BF.ADD fails" in overfull.warnings()[0]
    assert overfull.compound_error_rate > 0.01  # an overfilled nonscaling filter misses its target
    many = plan(1000, 0.01, expansion=2, items=1_000_000).warnings()
    assert "sub-filters" in many[0] and "1,000,000" in many[0]


def test_as_dict_has_the_documented_keys():
    data = plan(1000, 0.01, items=5000).as_dict()
    for key in (
        "capacity",
        "error_rate",
        "bits_per_item",
        "hashes",
        "first_filter_bytes",
        "size_bytes",
        "naive_bytes",
        "filters",
        "total_memory_bytes",
        "compound_error_rate",
        "chain",
        "warnings",
    ):
        assert key in data


COMBINATIONS = [
    (100, 0.01, 2),
    (1_000_000, 0.01, 2),
    (1_000_000, 0.01, None),
    (1, 0.5, 2),
    (7, 0.999, None),
    (12_345, 0.001, 4),
    (250_000, 0.0001, 1),
    (99_999, 0.05, None),
    (10_000_000, 0.001, 2),
    (3, 1e-9, 2),
    (500_000, 0.2, 3),
    (64, 0.01, None),
    (1000, 0.5, None),  # powers of two: RedisBloom's truncated ln 2 changes the hash count
    (1000, 0.25, 2),
    (1000, 0.0009765625, None),
    (1000, 0.125, 4),
    (77, 0.3, 3),  # above 0.25: Redis 8 takes it as 0.25 (144 bytes), RedisBloom 2.8 keeps it (136)
    (1000, 0.4, None),
    (500, 0.26, 2),
    (1_000_000, 0.75, 5),  # above 0.25, scaling: 2.8 tightens 0.75 to 0.375, Redis 8 caps it first (0.125)
    (1, 0.9, None),  # one item at 0.9: a single 64-bit word on both
    (5, 0.01, 7),
    (3_784_323, 0.0005, None),  # bits from RedisBloom's truncated ln(2)^2, not log(2)**2
]


@pytest.mark.redisbloom
@pytest.mark.parametrize(("capacity", "error", "expansion"), COMBINATIONS)
def test_plan_size_equals_bf_info_size(bloom, capacity, error, expansion):
    client = bloom.client()
    args = ["BF.RESERVE", "k", repr(error), capacity]
    args += ["EXPANSION", expansion] if expansion else ["NONSCALING"]
    client.execute_command(*args)
    predicted = for_line(plan(capacity, error, expansion), detect(client).line)  # the server's own line
    assert predicted.size_bytes == rb.info_field(client, b"k", "size")
    sub = rb.info(client, b"k").subfilters[0]  # from the SCANDUMP header
    assert (sub.hashes, sub.bits, sub.error_rate) == (
        predicted.first.hashes,
        predicted.first.bits,
        predicted.first.error_rate,
    )


@pytest.mark.redisbloom
@pytest.mark.parametrize("expansion", [1, 2, 3])
def test_growth_chain_matches_server_after_filling(bloom, expansion):
    """Add more items than the capacity: the chain the server grows matches the planner's, byte for byte."""
    client = bloom.client()
    capacity, items = 200, 1500
    client.execute_command("BF.RESERVE", "g", "0.01", capacity, "EXPANSION", expansion)
    for start in range(0, items, 500):
        client.execute_command("BF.MADD", "g", *[f"item-{i}" for i in range(start, start + 500)])
    added = client.execute_command("BF.CARD", "g")
    p = plan(capacity, 0.01, expansion, items=added)
    state = rb.info(client, b"g")
    assert state.filters == len(p.chain)
    assert state.size_bytes == p.total_memory_bytes
    assert [s.capacity for s in state.subfilters] == [s.capacity for s in p.chain]
    assert [s.bits for s in state.subfilters] == [s.bits for s in p.chain]
    assert [s.hashes for s in state.subfilters] == [s.hashes for s in p.chain]
    assert [s.error_rate for s in state.subfilters] == pytest.approx([s.error_rate for s in p.chain], rel=1e-12)


def test_each_server_line_plans_what_it_builds():
    """(#11 item 1) Redis 8 (RedisBloom 8) takes an error rate above 0.25 as 0.25 and refuses a
    capacity above 2**30; RedisBloom 2.x and the bitmap backend take the plan as given."""
    asked = plan(77, 0.3, 3)
    redis8 = for_line(asked, "redis8")
    assert (redis8.error_rate, redis8.capped_from, redis8.size_bytes) == (0.25, 0.3, 144)
    assert redis8.warnings() and "0.25" in redis8.warnings()[0]
    assert for_line(asked, "redisbloom2") == asked and asked.size_bytes == 136
    assert for_line(asked, "bitmap") == asked
    assert for_line(plan(77, 0.25, 3), "redis8").capped_from is None
    with pytest.raises(UsageError, match="at most 1,073,741,824"):
        for_line(plan(2**30 + 1, 0.01), "redis8")
    assert for_line(plan(2**30 + 1, 0.01), "redisbloom2").capacity == 2**30 + 1


def test_plan_takes_the_server_line(cli):
    """(#11 item 1) `plan --server`: redis8 by default, redisbloom2, bitmap (also via --backend)."""
    default = json.loads(cli("plan", "-c", "77", "-e", "0.3", "--expansion", "3", "--format", "json").stdout)
    assert (default["size_bytes"], default["error_rate"], default["requested_error_rate"]) == (144, 0.25, 0.3)
    two = json.loads(
        cli("plan", "-c", "77", "-e", "0.3", "--expansion", "3", "--server", "redisbloom2", "--format", "json").stdout
    )
    assert (two["size_bytes"], two["error_rate"]) == (136, 0.3)
    bitmap = json.loads(cli("plan", "-c", "1M", "-e", "1%", "--server", "bitmap", "--format", "json").stdout)
    assert bitmap["backend"] == "bitmap"
    clash = cli("plan", "-c", "1M", "-e", "1%", "--backend", "bitmap", "--server", "redis8")
    assert clash.exit_code == 2 and "disagree" in clash.stderr
