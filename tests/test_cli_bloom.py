"""What only RedisBloom has: scaling chains, the SCANDUMP header, bit-exact scans (RedisBloom tier).

The lifecycle suite (test_lifecycle.py) covers the commands on both backends."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bloomctl import backends
from bloomctl.keys import KeyFamily
from bloomctl.lifecycle.metadata import read_metadata
from bloomctl.sizing.bloom import plan
from tests.helpers.bloom_model import ModelChain

rb = backends.get("redisbloom")

pytestmark = [pytest.mark.redisbloom, pytest.mark.matrix]  # matrix: CI runs it on every server


def madd(client, key, items):
    for start in range(0, len(items), 1000):
        client.execute_command("BF.MADD", key, *items[start : start + 1000])


def test_reserve_nonscaling_and_expansion(cli_bloom, bloom):
    assert cli_bloom("reserve", "a", "-c", "1000", "-e", "1%", "--nonscaling").exit_code == 0
    assert cli_bloom("reserve", "b", "-c", "1000", "-e", "1%", "--expansion", "4").exit_code == 0
    client = bloom.client()
    assert rb.info(client, b"a").nonscaling
    assert rb.info(client, b"b").expansion == 4
    assert read_metadata(client, KeyFamily.of("a").meta)["expansion"] == "nonscaling"


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


def test_prometheus_labels_are_escaped(cli_bloom, bloom):
    weird = 'we"ird\\key'
    bloom.client().execute_command("BF.RESERVE", weird, "0.01", 100)
    result = cli_bloom("fill-ratio", weird, "--format", "prometheus")
    families = {f.name: f for f in text_string_to_metric_families(result.stdout)}
    assert families["bloomctl_items"].samples[0].labels["key"] == weird


def test_fill_ratio_exact_reports_bit_fill(cli_bloom, bloom):
    bloom.client().execute_command("BF.RESERVE", "bf:b", "0.01", 1000)
    madd(bloom.client(), "bf:b", [f"bf:b:{i}" for i in range(850)])
    result = cli_bloom("fill-ratio", "bf:b", "--exact", "--format", "json")
    sub = json.loads(result.stdout)["filters"][0]["subfilters"][0]
    model = ModelChain(1000, 0.01, 2)
    for i in range(850):
        model.add(f"bf:b:{i}".encode())
    assert sub["bits_set"] == model.bits_set()[0]


def test_fill_ratio_exact_on_a_grown_filter(cli_bloom, bloom):
    client = bloom.client()
    client.execute_command("BF.RESERVE", "bf:c", "0.01", 1000)
    madd(client, "bf:c", [f"bf:c:{i}" for i in range(1200)])
    result = cli_bloom("fill-ratio", "bf:c", "--exact", "--format", "text")
    assert result.exit_code == 1  # 1200 items on a reserved capacity of 1000: grown, over --max 1.0
    assert "filters=2" in result.stdout and "bit_fill=0." in result.stdout


def test_swap_refuses_to_change_the_backend(cli_bloom, bloom):
    from bloomctl.keys import KeyFamily

    family = KeyFamily.of("users")
    client = bloom.client()
    client.execute_command("BF.RESERVE", "users", "0.01", 1000)
    assert cli_bloom("reserve", family.standby.decode(), "-c", "1000", "-e", "1%", "--backend", "bitmap").exit_code == 0
    result = cli_bloom("swap", "users", "--yes", "--allow-shrink")
    assert result.exit_code == 5 and "readers of the active key would break" in result.stderr
    assert client.type("users") == b"MBbloom--"


def test_auto_backend_picks_redisbloom(cli_bloom, bloom):
    result = cli_bloom("reserve", "users", "-c", "1000", "-e", "1%", "--format", "json")
    assert json.loads(result.stdout)["filter"]["backend"] == "redisbloom"
    assert bloom.client().type("users") == b"MBbloom--"


def test_info_warns_about_a_filter_auto_created_with_the_defaults(cli_bloom, bloom):
    """(#11 item 1) BF.ADD on a missing key creates a filter of capacity 100: `info` says so, in
    text (stderr) and JSON; a filter bloomctl reserved with the same numbers does not warn."""
    client = bloom.client()
    client.execute_command("BF.ADD", "forgot", "user:1")
    text = cli_bloom("info", "forgot", "--format", "table")
    assert text.exit_code == 0 and "looks auto-created" in text.stderr and "capacity 100," in text.stderr
    data = json.loads(cli_bloom("info", "forgot", "--format", "json").stdout)
    assert len(data["warnings"]) == 1 and "bloomctl reserve" in data["warnings"][0]
    assert cli_bloom("reserve", "planned", "-c", "100", "-e", "1%").exit_code == 0
    planned = cli_bloom("info", "planned", "--format", "json")
    assert json.loads(planned.stdout)["warnings"] == [] and "auto-created" not in planned.stderr
    client.execute_command("BF.RESERVE", "by-hand", "0.001", 100)  # reserved, another error rate: no warning
    assert json.loads(cli_bloom("info", "by-hand", "--format", "json").stdout)["warnings"] == []


def test_the_auto_created_warning_reads_the_servers_own_defaults(bloom, workdir, cli):  # bloom: the tier
    """Module arguments INITIAL_SIZE / ERROR_RATE (both lines take them; Redis 8 maps them to
    bf-initial-size / bf-error-rate): the warning recognises a filter made with those."""
    from tests.servers import RedisServer, module_path

    server = RedisServer(workdir, extra=["--loadmodule", module_path(), "INITIAL_SIZE", "500", "ERROR_RATE", "0.001"])
    try:
        server.client().execute_command("BF.ADD", "forgot", "x")
        result = cli("info", "forgot", "--format", "json", url=server.url)
        warnings = json.loads(result.stdout)["warnings"]
        assert len(warnings) == 1 and "capacity 500," in warnings[0] and "error rate 0.001" in warnings[0], warnings
    finally:
        server.stop()
