"""What only the current RedisBloom line (the module Redis 8 ships) does, and bloomctl reads.

These tests carry the `redisbloom_current` marker: on RedisBloom 2.x they skip and say which
module was loaded. DEVELOPERS.md says how to build the current line locally.
"""

from __future__ import annotations

import json

import pytest

from bloomctl.server.capabilities import bloom_defaults, detect

pytestmark = [pytest.mark.redisbloom, pytest.mark.redisbloom_current]


def info_field(client, key: str, field: str) -> int:
    """One BF.INFO field: RedisBloom answers a one-element array, redis-py may hand it over as a dict."""
    reply = client.execute_command("BF.INFO", key, field)
    if isinstance(reply, dict):
        (reply,) = reply.values()
    return int(reply[0] if isinstance(reply, list) else reply)


def test_the_error_rate_cap_is_what_plan_predicts_for_redis8(bloom, cli):
    """Redis 8 takes an error rate above 0.25 as 0.25: BF.INFO Size is what `plan --server redis8`
    says, and not what the RedisBloom 2.x line would allocate."""
    client = bloom.client()
    client.execute_command("BF.RESERVE", "capped", "0.3", "77", "EXPANSION", "3")
    size = info_field(client, "capped", "SIZE")
    redis8 = json.loads(
        cli("plan", "-c", "77", "-e", "0.3", "--expansion", "3", "--server", "redis8", "--format", "json").stdout
    )
    two = json.loads(
        cli("plan", "-c", "77", "-e", "0.3", "--expansion", "3", "--server", "redisbloom2", "--format", "json").stdout
    )
    assert size == redis8["size_bytes"] != two["size_bytes"]


def test_the_auto_created_defaults_follow_config_set(bloom, cli):
    """Redis 8's bf-initial-size and bf-error-rate (CONFIG SET at run time) are the defaults a BF.ADD
    on a missing key uses, and the ones info's auto-created warning recognises."""
    client = bloom.client()
    before = {k: client.config_get(k)[k] for k in ("bf-initial-size", "bf-error-rate")}
    try:
        client.config_set("bf-initial-size", 700)
        client.config_set("bf-error-rate", 0.002)
        defaults = bloom_defaults(client, detect(client))
        assert (defaults.capacity, defaults.error_rate) == (700, 0.002)
        client.execute_command("BF.ADD", "forgot", "x")
        assert info_field(client, "forgot", "CAPACITY") == 700
        result = cli("info", "forgot", "--format", "json", url=bloom.url)
        warnings = json.loads(result.stdout)["warnings"]
        assert len(warnings) == 1 and "capacity 700," in warnings[0] and "error rate 0.002" in warnings[0], warnings
    finally:
        for name, value in before.items():
            client.config_set(name, value)
