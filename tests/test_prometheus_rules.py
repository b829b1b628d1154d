"""The example alerting rules (examples/prometheus/bloomctl-rules.yml): promtool checks them and runs
their unit tests, the Alerts section of docs/operations.md works as written, and every metric and
label the rules use is one bloomctl exports, read from a real exporter and the real metrics files of
rebuild and fill-ratio, against a real redis-server.

promtool comes with Debian's `prometheus` package (.ci/run installs it). Without it the promtool
tests skip, and under CI=true they fail.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import RedisServer, free_port, in_ci

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "examples" / "prometheus" / "bloomctl-rules.yml"
RULE_TESTS = ROOT / "examples" / "prometheus" / "bloomctl-rules.test.yml"

# The bloomctl metrics the rules use, kept here as well as parsed from the rules: a rule that
# gains or loses a metric must change this list, and a parser that misses one fails.
RULE_METRICS = {
    "bloomctl_up",
    "bloomctl_filter_present",
    "bloomctl_filter_error",
    "bloomctl_fill_ratio",
    "bloomctl_fill_threshold_ratio",
    "bloomctl_estimated_false_positive_ratio",
    "bloomctl_window_false_positive_ratio",
    "bloomctl_false_positive_threshold_ratio",
    "bloomctl_last_rebuild_state",
    "bloomctl_rebuild_exit_code",
    "bloomctl_rebuild_all_exit_code",
    "bloomctl_last_success_timestamp_seconds",
}
# Made by Prometheus itself for each target, not by bloomctl.
PROMETHEUS_METRICS = {"up"}
# The labels Prometheus adds to every scraped series: the target's.
TARGET_LABELS = {"instance", "job"}

PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
PROMQL_WORDS |= {"offset", "atan2", "inf", "nan"}
STRING = r'"(?:[^"\\]|\\.)*"'
SELECTOR = re.compile(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(rf"(\w+)\s*(=~|!~|!=|=)\s*({STRING})")
IGNORING = re.compile(r"\bignoring\s*\(([^)]*)\)")
TEMPLATE_LABEL = re.compile(r"\$labels\.(\w+)")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        reason = "promtool is not on PATH (Debian: apt-get install --no-install-recommends prometheus)"
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def alerting_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression: identifiers outside strings, label matchers, ranges
    and grouping lists that are neither a function's name (followed by a parenthesis) nor a word
    of the language."""
    bare = re.sub(STRING, '""', expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    found = re.findall(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", bare)
    return {name for name in found if name.lower() not in PROMQL_WORDS}


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerting_rules())} rules found" in result.stdout


def test_the_rules_unit_tests_pass_in_promtool() -> None:
    """The unit tests name the rules file by its place beside them, wherever promtool runs."""
    result = subprocess.run([promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_complete_and_unit_tested_both_ways() -> None:
    """Each alert waits a `for:`, has a severity and says what and which filter or key; the unit
    tests have a time at which it fires and one at which it must not."""
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    assert tests["rule_files"] == [RULES.name]
    checks = [check for case in tests["tests"] for check in case.get("alert_rule_test", [])]
    for rule in alerting_rules():
        name = rule["alert"]
        assert rule.get("for"), name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert {"summary", "description"} <= set(rule["annotations"]), name
        outcomes = [bool(check["exp_alerts"]) for check in checks if check["alertname"] == name]
        assert True in outcomes and False in outcomes, f"{name}: needs a test that fires it and one that does not"


def test_the_metric_names_parsed_from_the_rules_are_the_list_kept_here() -> None:
    found = set().union(*(metric_names(rule["expr"]) for rule in alerting_rules()))
    assert found == RULE_METRICS | PROMETHEUS_METRICS
    assert metric_names('time() - a_b{c="d e"} > 26 * 3600 or absent(x[5m]) unless on(f) g') == {"a_b", "x", "g"}


def alerts_section() -> str:
    page = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    return page.split("\n## Alerts\n", 1)[1].split("\n## ", 1)[0]


def test_the_operations_page_prometheus_config_loads_the_rules(tmp_path: Path) -> None:
    """docs/operations.md's prometheus.yml lines, the rules file copied beside them as the page says:
    promtool loads the configuration and every rule."""
    block = re.search(r"```yaml\n(.*?)```", alerts_section(), re.S)
    assert block, "the Alerts section lost its prometheus.yml lines"
    (tmp_path / "prometheus.yml").write_text(block.group(1), encoding="utf-8")
    shutil.copy(RULES, tmp_path / RULES.name)
    result = subprocess.run(
        [promtool(), "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerting_rules())} rules found" in result.stdout


def test_the_operations_page_promtool_commands_pass() -> None:
    """The Alerts section's shell lines, run as written from the checkout."""
    block = re.search(r"```sh\n(.*?)```", alerts_section(), re.S)
    assert block, "the Alerts section lost its promtool commands"
    lines = block.group(1).splitlines()
    assert [line.split()[:3] for line in lines] == [["promtool", "check", "rules"], ["promtool", "test", "rules"]]
    for line in lines:
        words = shlex.split(line)
        result = subprocess.run([promtool(), *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (line, result.stdout + result.stderr)


# --- what bloomctl really exports ---------------------------------------------------------------

# Each source's metrics: name -> the label names of each of its samples (labels with an empty
# value left out, as Prometheus drops them).
Exported = dict[str, list[frozenset[str]]]


def parse(text: str) -> Exported:
    found: Exported = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = frozenset(name for name, value in sample.labels.items() if value != "")
            found.setdefault(sample.name, []).append(labels)
    return found


def label_values(sources: dict[str, str], metric: str, label: str) -> set[str]:
    values = set()
    for text in sources.values():
        for family in text_string_to_metric_families(text):
            values |= {s.labels[label] for s in family.samples if s.name == metric and label in s.labels}
    return values


def scrape_exporter(config: Path) -> str:
    """Starts `bloomctl exporter` as a process of its own, scrapes it once and stops it."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOOMCTL_")}
    command = [sys.executable, "-m", "bloomctl", "--config", str(config), "exporter", "--listen", f"127.0.0.1:{port}"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
                    return response.read().decode()
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the exporter did not serve: {process.communicate()[1]}") from None
                time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(30)
        if process.stderr:
            process.stderr.close()


def write_config(tmp_path: Path, server: RedisServer) -> Path:
    """A Bloom filter with every threshold declared and a window with its max_fpr: between them,
    every metric the rules read from the exporter."""
    (tmp_path / "u.csv").write_text("id\n" + "".join(f"{i}\n" for i in range(300)))
    path = tmp_path / "bloomctl.toml"
    path.write_text(
        f"""\
[profiles.default]
url = "{server.url}"
[filters.users]
key = "bf:users"
capacity = 1000
error_rate = "1%"
source.csv = "u.csv"
thresholds.warn = 0.2
thresholds.max = 0.5
thresholds.max_fpr = "2%"
[filters.seen]
type = "windowed"
capacity = 100
error_rate = "1%"
window.period = "1d"
window.keep = 2
thresholds.max_fpr = "1%"
"""
    )
    return path


# fill-ratio given the thresholds that bloomctl.toml declares for users, writing its textfile.
FILL_OPTIONS = ("--warn", "0.2", "--max", "0.5", "--max-fpr", "0.02", "--format", "prometheus")


@pytest.fixture
def real_metrics(plain: RedisServer, tmp_path: Path, cli: Any) -> dict[str, str]:
    """The text of each source the rules read: a scrape of the exporter, and the files of `rebuild
    --metrics-file`, `rebuild --all --metrics-file` and `fill-ratio --format prometheus --output`."""
    config = write_config(tmp_path, plain)
    runs = {
        "rebuild": ("--config", str(config), "rebuild", "users", "--metrics-file", str(tmp_path / "rebuild.prom")),
        "rebuild --all": ("--config", str(config), "rebuild", "--all", "--metrics-file", str(tmp_path / "all.prom")),
        "fill-ratio": (
            "--url",
            plain.url,
            "fill-ratio",
            "bf:*",
            *FILL_OPTIONS,
            "--output",
            str(tmp_path / "fill.prom"),
        ),
    }
    assert cli("--config", str(config), "apply", "seen").exit_code == 0
    for args in runs.values():
        result = cli(*args)
        assert result.exit_code == 0, (args, result.output)
    sources = {"exporter": scrape_exporter(config)}
    for source, name in (("rebuild", "rebuild.prom"), ("rebuild --all", "all.prom"), ("fill-ratio", "fill.prom")):
        sources[source] = (tmp_path / name).read_text(encoding="utf-8")
    return sources


def without_conditionals(template: str) -> str:
    """An annotation without its `{{ with ... }}...{{ end }}` parts: what it prints in every case."""
    return re.sub(r"\{\{\s*with\b.*?\{\{\s*end\s*\}\}", "", template, flags=re.S)


def test_the_rules_read_only_metrics_and_labels_bloomctl_exports(real_metrics: dict[str, str]) -> None:
    """Every metric of the rules is exported; every label matcher names a label of its metric and
    matches a value it has; in each source, the labels an annotation always prints are on the
    rule's metrics (those it prints under `with` on some source's), the labels `ignoring` drops are
    there, and the metrics one rule compares carry the same labels once those are dropped, so that
    the comparison pairs series one to one."""
    sources = {source: parse(text) for source, text in real_metrics.items()}
    everywhere = set().union(*sources.values())
    missing = sorted(RULE_METRICS - everywhere)
    assert not missing, f"the rules read metrics bloomctl does not export: {missing}"

    for rule in alerting_rules():
        name, expr = rule["alert"], rule["expr"]
        ours = metric_names(expr) & RULE_METRICS
        for metric, matchers in SELECTOR.findall(expr):
            if metric not in RULE_METRICS:
                continue
            for label, op, quoted in MATCHER.findall(matchers):
                values = label_values(real_metrics, metric, label)
                assert values, f"{name}: {metric} has no label {label!r}"
                wanted = yaml.safe_load(quoted)
                if op == "=":
                    assert wanted in values, f"{name}: {metric}{{{label}}} is never {wanted!r}: {values}"
                elif op == "=~":  # each alternative: a misspelt one would hide behind the others
                    for alternative in wanted.split("|"):
                        assert any(re.fullmatch(alternative, v) for v in values), f"{name}: {alternative!r} {values}"
        ignored = {label.strip() for group in IGNORING.findall(expr) for label in group.split(",") if label.strip()}
        templates = " ".join(rule["annotations"].values())
        always = set(TEMPLATE_LABEL.findall(without_conditionals(templates))) - TARGET_LABELS
        sometimes = set(TEMPLATE_LABEL.findall(templates)) - TARGET_LABELS - always
        seen: set[str] = set()
        for source, found in sources.items():
            present = {metric: set().union(*found[metric]) for metric in ours if metric in found}
            for metric, labels in present.items():
                seen |= labels
                for sample in found[metric]:
                    assert always <= sample, (
                        f"{name}: prints {sorted(always - sample)}, which {source}'s {metric} lacks"
                    )
            compared = {frozenset(labels - ignored) for labels in present.values()}
            assert len(compared) <= 1, f"{name}: in {source}, its metrics' labels differ: {compared}"
        assert sometimes <= seen, f"{name}: prints {sorted(sometimes - seen)}, which no source has"
        assert ignored <= seen, f"{name}: ignoring({sorted(ignored - seen)}) drops no label"
