"""The bitmap backend on plain Redis: hash scheme, exact counts, false-positive rate, the function library."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import pytest

from bloomctl.backends.bitmap import (
    HEADER,
    HEADER_BYTES,
    LIBRARY_VERSION,
    MAGIC,
    SCRIPT,
    Bitmap,
    functions_source,
    parse_header,
    positions,
)
from bloomctl.errors import KeyMissing, StateConflict, UnsupportedServer, UsageError, WrongType
from bloomctl.sizing.bloom import plan

pytestmark = pytest.mark.matrix  # CI runs this module on every server of the matrix

ITEMS = [b"", b"\x00", b"\xff\xfe\x00binary", "ünïcødé".encode(), b"a" * 1000, b"user:42"]


@pytest.fixture(params=["functions", "script"])
def bitmap(request, plain):
    """The backend in both modes: Redis Functions, and the EVALSHA fallback for servers before Redis 7."""
    backend = Bitmap(mode=request.param)
    return backend, plain.client()


def model_bits(items, m, k) -> set[int]:
    bits: set[int] = set()
    for item in items:
        bits.update(positions(item, m, k))
    return bits


def stored_bits(client, key: str, m: int) -> set[int]:
    raw = client.get(key)[HEADER_BYTES:]
    assert len(raw) * 8 == m
    return {i for i in range(m) if raw[i >> 3] & (0x80 >> (i & 7))}


def test_header_layout(bitmap):
    backend, client = bitmap
    p = plan(10_000, 0.01, None)
    backend.reserve(client, b"f", p)
    raw = client.get("f")
    assert len(raw) == HEADER_BYTES + p.first.bytes == backend.size_bytes(p)
    header = parse_header(raw)
    assert raw.startswith(MAGIC)
    assert header == {
        "format": 1,
        "scheme": 1,
        "hashes": p.first.hashes,
        "bits": p.first.bits,
        "capacity": 10_000,
        "error_rate": 0.01,
        "items": 0,
    }
    assert HEADER.size <= HEADER_BYTES


def test_server_hashing_matches_the_documented_scheme_bit_for_bit(bitmap):
    backend, client = bitmap
    p = plan(500, 0.01, None)
    backend.reserve(client, b"f", p)
    items = ITEMS + [f"item-{i}".encode() for i in range(300)]
    backend.madd(client, b"f", items)
    assert stored_bits(client, "f", p.first.bits) == model_bits(items, p.first.bits, p.first.hashes)


def test_counts_are_exact_like_bf_card(bitmap):
    """An add counts only when it set a new bit: repeats never count; the count matches a replay."""
    backend, client = bitmap
    p = plan(300, 0.05, None)
    backend.reserve(client, b"f", p)
    items = [f"x{i % 400}".encode() for i in range(1000)]  # 400 distinct, each repeated
    added = []
    for start in range(0, len(items), 137):
        added += backend.madd(client, b"f", items[start : start + 137])
    seen: set[int] = set()
    expected = []
    for item in items:
        bits = set(positions(item, p.first.bits, p.first.hashes))
        expected.append(not bits <= seen)
        seen |= bits
    assert added == expected
    assert backend.card(client, b"f") == sum(expected) <= 400
    assert backend.info(client, b"f").items == sum(expected)
    assert sum(expected) > 300  # most distinct items were new even on an overfilled filter


def test_binary_safe_items_and_no_false_negatives(bitmap):
    backend, client = bitmap
    backend.reserve(client, b"f", plan(20_000, 0.01, None))
    members = ITEMS + [f"m{i}".encode() for i in range(20_000 - len(ITEMS))]
    for start in range(0, len(members), 1000):
        backend.madd(client, b"f", members[start : start + 1000])
    answers = []
    for start in range(0, len(members), 1000):
        answers += backend.mexists(client, b"f", members[start : start + 1000])
    assert all(answers)


def test_false_positive_rate_within_statistical_bounds(plain):
    """100k non-members against a filter filled to capacity: the rate matches the plan and the bits."""
    backend, client = Bitmap(), plain.client()
    p = plan(20_000, 0.01, None)
    backend.reserve(client, b"f", p)
    for start in range(0, 20_000, 1000):
        backend.madd(client, b"f", [f"member:{i}" for i in range(start, start + 1000)])
    trials = 100_000
    hits = 0
    for start in range(0, trials, 2000):
        hits += sum(backend.mexists(client, b"f", [f"other:{i}" for i in range(start, start + 2000)]))
    measured = hits / trials
    state = backend.bit_fill(client, b"f")
    from_bits = state.estimated_fpr
    sigma = math.sqrt(from_bits * (1 - from_bits) / trials)
    assert abs(measured - from_bits) < 5 * sigma, (measured, from_bits)
    assert 0.5 * p.error_rate < measured < 1.5 * p.error_rate, measured


def test_bitcount_gives_the_exact_fill(bitmap):
    backend, client = bitmap
    p = plan(1000, 0.01, None)
    backend.reserve(client, b"f", p)
    items = [f"k{i}".encode() for i in range(700)]
    backend.madd(client, b"f", items)
    state = backend.bit_fill(client, b"f")
    assert state.subfilters[0].bits_set == len(model_bits(items, p.first.bits, p.first.hashes))


def test_errors(bitmap):
    backend, client = bitmap
    with pytest.raises(KeyMissing):
        backend.info(client, b"nope")
    assert backend.card(client, b"nope") == 0
    client.set("s", "just a string")
    with pytest.raises(WrongType):
        backend.madd(client, b"s", ["x"])
    client.rpush("l", "x")
    with pytest.raises(WrongType):
        backend.mexists(client, b"l", ["x"])
    backend.reserve(client, b"f", plan(100, 0.01, None))
    with pytest.raises(StateConflict):
        backend.reserve(client, b"f", plan(100, 0.01, None))


def test_plans_beyond_the_string_limit_are_refused(cli_plain):
    backend = Bitmap()
    with pytest.raises(UsageError, match="512 MB"):
        backend.check_plan(plan(1_000_000_000, 0.001, None))
    with pytest.raises(UsageError, match="do not grow"):
        backend.check_plan(plan(1000, 0.01, 2))
    result = cli_plain("reserve", "big", "-c", "1e9", "-e", "0.1%", "--backend", "bitmap")
    assert result.exit_code == 2 and "512 MB" in result.stderr and "shards" in result.stderr
    expansion = cli_plain("reserve", "x", "-c", "100", "-e", "1%", "--backend", "bitmap", "--expansion", "2")
    assert expansion.exit_code == 2 and "do not grow" in expansion.stderr


def test_functions_install_status_and_outdated_library(cli_plain, plain):
    client = plain.client()
    client.function_flush()
    missing = cli_plain("functions", "status")
    assert missing.exit_code == 1 and "missing" in missing.stdout
    installed = cli_plain("functions", "install")
    assert installed.exit_code == 0 and f"version {LIBRARY_VERSION} (current" in installed.stdout
    assert cli_plain("functions", "install").exit_code == 0  # idempotent
    assert cli_plain("functions", "status").exit_code == 0
    # An older library on the server is detected and never silently replaced.
    old = functions_source().replace(f"local LIB_VERSION = {LIBRARY_VERSION}", "local LIB_VERSION = 0")
    client.execute_command("FUNCTION LOAD", "REPLACE", old)
    outdated = cli_plain("functions", "status")
    assert outdated.exit_code == 1 and "outdated" in outdated.stdout
    refused = cli_plain("reserve", "f", "-c", "100", "-e", "1%", "--backend", "bitmap")
    assert refused.exit_code == 4 and "functions install" in refused.stderr
    assert not client.exists("f")
    assert cli_plain("functions", "install").exit_code == 0
    assert cli_plain("reserve", "f", "-c", "100", "-e", "1%", "--backend", "bitmap").exit_code == 0


def test_library_loads_by_itself_when_absent(cli_plain, plain):
    plain.client().function_flush()
    assert cli_plain("reserve", "f", "-c", "100", "-e", "1%").exit_code == 0
    assert Bitmap().installed_versions(plain.client()) == {f"127.0.0.1:{plain.port}": LIBRARY_VERSION}


def test_script_mode_survives_a_script_flush(plain):
    backend, client = Bitmap(mode=SCRIPT), plain.client()
    backend.reserve(client, b"f", plan(100, 0.01, None))
    client.script_flush()
    assert backend.madd(client, b"f", ["a"]) == [True]


def test_functions_on_every_cluster_master(cluster):
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(cluster.url))
    backend = Bitmap()
    backend.install(client)
    versions = backend.installed_versions(client)
    assert len(versions) == 3 and set(versions.values()) == {LIBRARY_VERSION}


@pytest.mark.skipif(not shutil.which("redis-cli"), reason="redis-cli not installed")
def test_readme_redis_cli_example(cli_plain, plain):
    """Any client can use the filter with FCALL: docs/bitmap-format.md's redis-cli lines, run for real."""
    assert cli_plain("reserve", "users", "-c", "1000", "-e", "1%", "--backend", "bitmap").exit_code == 0

    def rcli(*args: str) -> str:
        out = subprocess.run(["redis-cli", "-p", str(plain.port), *args], capture_output=True, text=True, check=True)
        return out.stdout.strip()

    assert rcli("FCALL", "bloomctl_add", "1", "users", "user:42") == "1"
    assert rcli("FCALL", "bloomctl_add", "1", "users", "user:42") == "0"
    assert rcli("FCALL_RO", "bloomctl_exists", "1", "users", "user:42") == "1"
    assert rcli("FCALL_RO", "bloomctl_mexists", "1", "users", "user:42", "user:43").split() == ["1", "0"]
    assert rcli("FCALL_RO", "bloomctl_card", "1", "users") == "1"
    # a missing key is an error, not a silent nil: the dual-write recipe (docs/rebuild.md) relies on it
    missing = subprocess.run(
        ["redis-cli", "-p", str(plain.port), "FCALL", "bloomctl_add", "1", "nosuch", "x"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "not found" in missing.stdout + missing.stderr and not plain.client().exists("nosuch")


def test_unsupported_server_message_for_outdated_is_typed(plain):
    client = plain.client()
    old = functions_source().replace(f"local LIB_VERSION = {LIBRARY_VERSION}", "local LIB_VERSION = 99")
    client.execute_command("FUNCTION LOAD", "REPLACE", old)
    try:
        with pytest.raises(UnsupportedServer, match="version 99, newer"):
            Bitmap().ensure(client)
    finally:
        client.function_flush()


def test_a_string_that_merely_starts_with_the_magic_is_not_a_filter(cli_plain, plain):
    client = plain.client()
    client.set("notes", "bloomctl is a tool for Bloom filters; these are my notes about it, long enough for a header")
    assert cli_plain("reserve", "real", "-c", "100", "-e", "1%").exit_code == 0
    info = cli_plain("info", "notes")
    assert info.exit_code == 5 and "not a bloomctl filter" in info.stderr
    scan = cli_plain("fill-ratio", "*", "--format", "json")
    assert scan.exit_code == 0, scan.stderr
    assert [f["key"] for f in json.loads(scan.stdout)["filters"]] == ["real"]
    truncated = client.get("real")[:-8]
    client.set("cut", truncated)  # a filter whose bits were cut short is not taken for one either
    assert cli_plain("info", "cut").exit_code == 5


def test_a_newer_format_says_so(plain):
    backend, client = Bitmap(), plain.client()
    backend.reserve(client, b"f", plan(100, 0.01, None))
    raw = bytearray(client.get("f"))
    raw[8] = 2  # format version 2
    client.set("f", bytes(raw))
    with pytest.raises(UnsupportedServer, match="newer bloomctl"):
        backend.madd(client, b"f", ["x"])


def test_a_newer_library_is_never_downgraded_silently(cli_plain, plain):
    client = plain.client()
    newer = functions_source().replace(f"local LIB_VERSION = {LIBRARY_VERSION}", "local LIB_VERSION = 99")
    client.execute_command("FUNCTION LOAD", "REPLACE", newer)
    try:
        status = cli_plain("functions", "status")
        assert status.exit_code == 1 and "newer" in status.stdout
        refused = cli_plain("functions", "install")
        assert refused.exit_code == 4 and "upgrade bloomctl" in refused.stderr
        use = cli_plain("reserve", "f", "-c", "100", "-e", "1%", "--backend", "bitmap")
        assert use.exit_code == 4 and "newer" in use.stderr
        assert cli_plain("functions", "install", "--force").exit_code == 0
        assert cli_plain("functions", "status").exit_code == 0
    finally:
        client.function_flush()


def test_a_large_filter_arrives_whole_and_matches_a_small_ones_layout(bitmap):
    """Above 16 MiB the client sends the empty filter (SET NX) instead of having the server zero it
    (which blocked it 91 ms for 228 MB): the same header and length as the function library's."""
    bitmap, client = bitmap
    large, small = plan(15_000_000, 0.01, None), plan(1000, 0.01, None)
    bitmap.reserve(client, b"large", large)
    bitmap.reserve(client, b"small", small)
    assert client.strlen(b"large") == HEADER_BYTES + large.first.bytes > 16 << 20
    head_large, head_small = client.getrange(b"large", 0, 63), client.getrange(b"small", 0, 63)
    assert parse_header(head_large) == {**parse_header(head_small), "bits": large.first.bits, "capacity": 15_000_000}
    assert bitmap.madd(client, b"large", [b"a", b"b"]) == [True, True] and bitmap.card(client, b"large") == 2
    with pytest.raises(StateConflict, match="already exists"):
        bitmap.reserve(client, b"large", large)
    assert bitmap.card(client, b"large") == 2  # untouched


def test_server_path_batches_stay_short(cli_plain, plain, tmp_path):
    """The bitmap server path sends 1000 items per FCALL (about 5 ms on the server, measured),
    RedisBloom's 5000 per BF.INSERT: no rebuild command over 20 ms."""
    path = tmp_path / "u.csv"
    path.write_text("id\n" + "".join(f"u{i}\n" for i in range(2500)))
    first = cli_plain("rebuild", "f", "--from-csv", str(path), "-c", "9000", "-e", "1%", "--nonscaling", "--swap")
    assert first.exit_code == 0, first.stderr
    client = plain.client()
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 100_000)  # the scripts' own commands are logged too
    client.slowlog_reset()
    again = cli_plain("rebuild", "f", "--from-csv", str(path), "--build", "server", "--swap")
    assert again.exit_code == 0, again.stderr
    fcalls = [entry for entry in client.slowlog_get(100_000) if entry["command"].startswith(b"FCALL bloomctl_madd")]
    client.config_set("slowlog-log-slower-than", 10_000)
    assert len(fcalls) == 3  # 1000 + 1000 + 500 items


def test_max_rate_paces_the_server_path(cli_plain, tmp_path):
    import time

    path = tmp_path / "u.csv"
    path.write_text("id\n" + "".join(f"u{i}\n" for i in range(4000)))
    args = ["-c", "9000", "-e", "1%", "--nonscaling", "--build", "server", "--max-rate", "8000", "--batch-size", "500"]
    started = time.perf_counter()
    result = cli_plain("rebuild", "f", "--from-csv", str(path), *args)
    assert result.exit_code == 0, result.stderr
    assert time.perf_counter() - started > 3500 / 8000  # the 8th batch of 500 leaves after 3,500 / 8,000 s
