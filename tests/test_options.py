"""Numbers given on the command line or to the library: NaN and infinities never reach a guard,
a percentage reads as the fraction it means, an expansion or a threshold out of range is refused
with exit 2 and one line naming the option."""

from __future__ import annotations

import json
import math

import pytest

from bloomctl.errors import UsageError
from bloomctl.keys import KeyFamily
from bloomctl.lifecycle import front as lifecycle
from bloomctl.server.capabilities import detect
from bloomctl.sizing.bloom import plan
from tests.helpers.matrix import SIGNALS_LOCKS_ERRORS
from tests.helpers.redis import active_and_standby


@SIGNALS_LOCKS_ERRORS
@pytest.mark.parametrize("bad", ["nan", "NaN", "inf", "-inf"])
def test_nan_and_infinities_never_reach_a_guard(target, tmp_path, bad):
    """(#10 item 1) `--min-ratio nan` turned the shrink guard off: 1000 items replaced by 3. Every float
    option refuses NaN and infinities (exit 2), the library's swap too."""
    active_and_standby(target)
    swap = target.cli("swap", "users", "--min-ratio", bad, "--yes")
    assert swap.exit_code == 2 and ("finite" in swap.stderr or "range" in swap.stderr), swap.stderr
    assert target.card("users") == 1000
    csv = tmp_path / "u.csv"
    csv.write_text("id\nuser:1\nuser:2\nuser:3\n")
    rebuild = target.cli("rebuild", "users", "--from-csv", str(csv), "--swap", "--min-ratio", bad)
    assert rebuild.exit_code == 2 and target.card("users") == 1000
    for args in (
        ["--timeout", bad, "info", "users"],
        ["--connect-timeout", bad, "info", "users"],
        ["fill-ratio", "users", "--max", bad],
        ["fill-ratio", "users", "--warn", bad],
        ["swap", "users", "--keep-old", bad, "--yes"],
        ["rebuild", "users", "--from-csv", str(csv), "--headroom", bad],
        ["rebuild", "users", "--from-csv", str(csv), "--max-rate", bad, "--build", "server"],
    ):
        result = target.cli(*args)
        assert result.exit_code == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    with pytest.raises(UsageError, match="min_ratio"):
        lifecycle.swap(target.client, detect(target.client), "users", min_ratio=float(bad))
    assert target.card("users") == 1000 and target.client.exists(KeyFamily.of("users").standby)


@SIGNALS_LOCKS_ERRORS
def test_percentages_where_a_fraction_is_asked(target):
    """(#10 item 16) `--max 90%` reads as 0.9; `--min-ratio 50%` as 0.5."""
    target.reserve("users", 1000)
    target.add("users", [f"u{i}" for i in range(950)])
    result = target.cli("fill-ratio", "users", "--max", "90%", "--format", "json")
    assert result.exit_code == 1, result.stderr
    assert math.isclose(json.loads(result.stdout)["thresholds"]["max"], 0.9)
    assert plan(1000, 0.01).capacity == 1000  # (the planner is untouched by the option types)


@SIGNALS_LOCKS_ERRORS
def test_absurd_expansions_are_refused_before_the_server_stores_them_as_0(target):
    """(#10 item 12) `--expansion 1099511627776` was stored by RedisBloom 2.8 as 0 (its factor is 32 bits);
    Redis 8's RedisBloom accepts 1 to 32,768: so does bloomctl, on every command and in the library."""
    for args in (["reserve", "users", "-c", "1000", "-e", "1%"], ["plan", "-c", "1000", "-e", "1%"]):
        result = target.cli(*args, "--expansion", str(2**40))
        assert result.exit_code == 2 and "1<=x<=32768" in result.stderr, result.stderr
    assert not target.client.exists("users")
    for bad in (2**40, 0, 2.5, True):
        with pytest.raises(UsageError, match="expansion"):
            plan(1000, 0.01, expansion=bad)
    for bad in (float("nan"), 1000.0, -1):
        with pytest.raises(UsageError, match="capacity"):
            plan(bad, 0.01)
    if target.backend.name == "redisbloom":
        assert target.cli("reserve", "users", "-c", "1000", "-e", "1%", "--expansion", "32768").exit_code == 0
        reply = target.client.execute_command("BF.INFO", "users", "EXPANSION")  # redis-py gives a dict
        assert (list(reply.values()) if isinstance(reply, dict) else reply) in (32768, [32768])


def test_a_zero_max_names_max(cli):
    """(#10 item 16, review) `fill-ratio --max 0` said "--warn must be positive" (never given)."""
    result = cli("fill-ratio", "users", "--max", "0")
    assert result.exit_code == 2 and "--max must be positive" in result.stderr and "--warn" not in result.stderr
