"""Byte sizes mean what redis.conf means (#23 item 9): `1gb` is 2^30 bytes, `1g` 10^9.

`--max-shard-memory 1gb` was refused ('not a number') and `1G` was 10^9 with nothing said. Byte
sizes now read Redis's units exactly as Redis's own config parser does (checked against a real
server's CONFIG SET), the IEC names bloomctl prints (GiB) too, and every byte option's --help
says which is which. Counts (`--capacity 3G`) stay decimal: a count's `b` is a billion.
"""

from __future__ import annotations

import json

import pytest

from bloomctl.errors import UsageError
from bloomctl.sizing.bloom import parse_count, parse_size

# A memory config that nothing in the tests depends on: only its parser matters here.
MEMORY_CONFIG = "active-defrag-ignore-bytes"
REDIS_SPELLINGS = ["1", "100", "1b", "1k", "1K", "1kb", "1KB", "1kB", "5m", "5mb", "5MB", "2g", "2gb", "2GB", "2Gb"]


def test_sizes_read_as_redis_reads_them(plain):
    """Every unit of redis.conf, in any case, is what the server itself makes of it (CONFIG SET
    reads sizes with the parser redis.conf goes through)."""
    client = plain.client()
    before = client.config_get(MEMORY_CONFIG)[MEMORY_CONFIG]
    try:
        for spelling in REDIS_SPELLINGS:
            client.config_set(MEMORY_CONFIG, spelling)
            assert parse_size(spelling) == int(client.config_get(MEMORY_CONFIG)[MEMORY_CONFIG]), spelling
    finally:
        client.config_set(MEMORY_CONFIG, before)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1gb", 2**30),
        ("1G", 10**9),
        ("1GiB", 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5kb", 1536),
        ("1_000_000", 10**6),
        ("1e9", 10**9),
        ("1tb", 2**40),
    ],
)
def test_sizes_beyond_redis_spellings(text, expected):
    """Redis's units plus the IEC names bloomctl prints, decimals that come out whole, and the
    spellings counts take."""
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["0", "-1gb", "1x", "1gbb", "1.3b", "1 g b", "gb", "1e400"])
def test_nonsense_sizes_are_refused(text):
    with pytest.raises(UsageError):
        parse_size(text)


def test_max_shard_memory_takes_redis_units(cli):
    """The same filter split under 1gb (2^30) and under 1G (10^9): the two are different limits
    (1gb was refused as 'not a number')."""

    def planned(limit: str) -> dict:
        result = cli("plan", "-c", "3G", "-e", "1%", "--max-shard-memory", limit, "--format", "json")
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)

    binary, decimal, iec = planned("1gb"), planned("1G"), planned("1GiB")
    assert binary["max_shard_memory"] == iec["max_shard_memory"] == 2**30
    assert decimal["max_shard_memory"] == 10**9
    # -c 3G is a count, not bytes: three billion items; a count's b is a billion, and kb no count
    assert binary["capacity"] == 3 * 10**9 and parse_count("1b") == 10**9
    with pytest.raises(UsageError):
        parse_count("1gb")
    assert binary["shard_bytes"] <= 2**30 and decimal["shard_bytes"] <= 10**9
    refused = cli("plan", "-c", "3G", "-e", "1%", "--max-shard-memory", "1gbytes")
    assert refused.exit_code == 2 and "not a size in bytes" in refused.stderr and "1gb" in refused.stderr


def test_the_help_says_which_unit_is_which(cli):
    shown = " ".join(cli("plan", "--help").stdout.split())
    assert "--max-shard-memory BYTES" in shown
    for words in ("redis.conf", "1k = 1000", "1kb = 1024", "1g = 10^9", "1gb = 2^30", "1GiB"):
        assert words in shown, words
