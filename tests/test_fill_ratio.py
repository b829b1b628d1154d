"""fill-ratio end to end through the CLI: thresholds and exit codes, JSON, Prometheus, globs over every master.

Runs on every backend and topology (``target``), like the lifecycle suite.
"""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.matrix  # CI runs this module on every server of the matrix


@pytest.fixture
def filled(target):
    """Filters at 10%, 85% and 99% of capacity, a standby, and a string that is not a filter."""
    for key, n in (("bf:a", 100), ("bf:b", 850), ("bf:c", 990)):
        target.reserve(key, 1000)
        target.add(key, [f"{key}:{i}" for i in range(n)])
    target.reserve("bf:{a}:standby", 1000)
    target.client.set("bf:string", "x")
    return target


def test_fill_ratio_text_and_exit_codes(filled):
    cli = filled.cli
    ok = cli("fill-ratio", "bf:a", "--format", "text")
    assert ok.exit_code == 0 and ok.stdout.startswith("bf:a OK fill=0.")
    over = cli("fill-ratio", "bf:*", "--max", "0.95", "--format", "text")
    assert over.exit_code == 1
    lines = over.stdout.strip().splitlines()
    assert [line.split()[:2] for line in lines] == [["bf:a", "OK"], ["bf:b", "WARN"], ["bf:c", "OVER"]]
    assert "1 of 3 filters over the limit: bf:c" in over.stderr
    assert cli("fill-ratio", "bf:*", "--format", "text").exit_code == 0  # default --max 1.0


def test_fill_ratio_json_and_max_fpr(filled):
    result = filled.cli("fill-ratio", "bf:b", "bf:a", "--format", "json")
    data = json.loads(result.stdout)
    assert [f["key"] for f in data["filters"]] == ["bf:b", "bf:a"]
    assert [f["status"] for f in data["filters"]] == ["warn", "ok"]
    strict = filled.cli("fill-ratio", "bf:b", "--max-fpr", "1e-9", "--format", "json")
    assert strict.exit_code == 1 and json.loads(strict.stdout)["filters"][0]["status"] == "over"


def test_fill_ratio_prometheus(filled):
    result = filled.cli("fill-ratio", "bf:*", "--exact", "--format", "prometheus")
    assert result.exit_code == 0, result.stderr
    families = {f.name: f for f in text_string_to_metric_families(result.stdout)}
    fill = {s.labels["key"]: s.value for s in families["bloomctl_fill_ratio"].samples}
    assert fill == pytest.approx({"bf:a": 0.1, "bf:b": 0.85, "bf:c": 0.99}, abs=0.01)
    assert {s.labels["key"] for s in families["bloomctl_bit_fill_ratio"].samples} == {"bf:a", "bf:b", "bf:c"}
    assert families["bloomctl_over_max"].type == "gauge"


def test_fill_ratio_glob_reaches_every_master(target):
    keys = [f"g:{i}" for i in range(24)]
    for key in keys:
        target.reserve(key, 100)
    if target.cluster:
        assert len({target.client.get_node_from_key(k).port for k in keys}) == 3
    data = json.loads(target.cli("fill-ratio", "g:*", "--format", "json").stdout)
    assert sorted(f["key"] for f in data["filters"]) == sorted(keys)


def test_fill_ratio_missing_keys_get_a_line_and_exit_5(filled):
    result = filled.cli("fill-ratio", "bf:a", "nope", "zz:*", "bf:string", "--format", "text")
    assert result.exit_code == 5
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("bf:a OK")
    assert lines[1].startswith("nope MISSING (") and "does not exist" in lines[1]
    assert lines[2] == "zz:* MISSING (no Bloom filter matches this pattern)"
    assert lines[3].startswith("bf:string MISSING (") and "not a bloomctl filter" in lines[3]
    assert "3 of 4 are not filters (not found: nope, zz:*; not a filter: bf:string)" in result.stderr
    prom = filled.cli("fill-ratio", "bf:a", "nope", "--format", "prometheus")
    families = {f.name: f for f in text_string_to_metric_families(prom.stdout)}
    assert {s.labels["key"]: s.value for s in families["bloomctl_filter_present"].samples} == {"bf:a": 1, "nope": 0}


def test_fill_ratio_max_below_the_default_warn(filled):
    result = filled.cli("fill-ratio", "bf:b", "--max", "0.5", "--format", "json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["thresholds"]["warn"] == 0.5


def test_fill_ratio_key_with_glob_characters_taken_literally(target):
    target.reserve("weird*key", 100)
    target.reserve("weird-other", 100)
    result = target.cli("fill-ratio", "weird*key", "--format", "json")
    assert [f["key"] for f in json.loads(result.stdout)["filters"]] == ["weird*key"]
