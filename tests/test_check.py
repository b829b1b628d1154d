"""`bloomctl check` on real servers: a file with a healthy, a drifted, an over-threshold and a
missing filter, reported in every format (JUnit validated against an XSD), every problem in one
run; servers that do not answer; recipes, windows and sharded filters (apply: test_apply.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.declared import four_filters
from tests.helpers.redis import client_of
from tests.servers import free_port

XSD = Path(__file__).resolve().parent / "fixtures" / "junit.xsd"


def statuses(data: dict) -> dict[tuple[str, str], str]:
    return {(r["subject"], r["check"]): r["status"] for r in data["results"]}


def test_check_reports_every_problem_of_the_file_in_one_run(server, tmp_path, cli):
    path = four_filters(server, tmp_path, cli)
    result = cli("--config", str(path), "check", "--format", "json")
    assert result.exit_code == 5, result.output  # a missing filter: 5, as fill-ratio
    data = json.loads(result.stdout)
    found = statuses(data)
    assert {check: found[("healthy", check)] for check in ("exists", "parameters", "fill")} == dict.fromkeys(
        ("exists", "parameters", "fill"), "ok"
    )
    assert found[("drifted", "exists")] == "ok" and found[("drifted", "parameters")] == "fail"
    assert found[("over", "parameters")] == "ok" and found[("over", "fill")] == "fail"
    assert found[("missing", "exists")] == "fail" and found[("missing", "fill")] == "skip"
    by_key = {(r["subject"], r["check"]): r for r in data["results"]}
    assert "capacity: declared 2,000, found 1,000" in by_key[("drifted", "parameters")]["message"]
    assert by_key[("drifted", "parameters")]["fix"] == f"bloomctl --config {path} rebuild drifted"
    assert by_key[("over", "fill")]["message"] == "fill 95.0% > max 90.0%"
    assert by_key[("missing", "exists")]["fix"] == f"bloomctl --config {path} apply"
    assert {r["check"] for r in data["results"] if r["subject"] == "server default"} >= {"persistence", "eviction"}
    assert data["summary"]["fail"] == 3 and data["summary"]["exit_code"] == 5
    lines = path.read_text().splitlines()
    assert lines[by_key[("over", "fill")]["line"] - 1] == "[filters.over]"


def test_check_text_and_exit_codes(server, tmp_path, cli):
    path = four_filters(server, tmp_path, cli)
    text = cli("--config", str(path), "check")
    assert text.exit_code == 5
    assert re.search(r"^over\n(?:.*\n)*?  FAIL  fill +fill 95\.0% > max 90\.0%$", text.stdout, re.M)
    assert re.search(r"^  FAIL  parameters +drift: capacity: declared 2,000, found 1,000$", text.stdout, re.M)
    assert re.search(r"^4 filter\(s\) of .*: \d+ ok, .*3 fail.* \(exit 5\)$", text.stdout, re.M)
    assert "check: 3 failed" in text.stderr
    only_drift = cli("--config", str(path), "check", "healthy", "drifted", "--no-server-checks")
    assert only_drift.exit_code == 1 and "server default" not in only_drift.stdout
    healthy = cli("--config", str(path), "check", "healthy", "--no-server-checks")
    assert healthy.exit_code == 0 and healthy.stderr == ""
    unknown = cli("--config", str(path), "check", "healty")
    assert unknown.exit_code == 2 and "declares no filter 'healty' (did you mean 'healthy'?)" in unknown.stderr


def test_check_junit_is_valid_against_the_schema(server, tmp_path, cli):
    etree = pytest.importorskip("lxml.etree")
    path = four_filters(server, tmp_path, cli)
    out = tmp_path / "reports" / "bloomctl.xml"
    out.parent.mkdir()
    result = cli("--config", str(path), "check", "--format", "junit", "-o", str(out))
    assert result.exit_code == 5 and result.stdout == ""
    document = etree.parse(str(out))
    schema = etree.XMLSchema(etree.parse(str(XSD)))
    assert schema.validate(document), schema.error_log
    root = document.getroot()
    suites = {suite.get("name"): suite for suite in root.findall("testsuite")}
    assert list(suites)[:4] == ["healthy", "drifted", "over", "missing"] and "server default" in suites
    assert [case.get("name") for case in suites["healthy"].findall("testcase")] == [
        "exists", "parameters", "recipe", "fill", "fpr",
    ]  # fmt: skip
    failures = [
        (s, c.get("name"))
        for s, suite in suites.items()
        for c in suite.findall("testcase")
        if c.find("failure") is not None
    ]
    assert failures == [("drifted", "parameters"), ("over", "fill"), ("missing", "exists")]
    assert root.get("failures") == "3" and int(root.get("tests")) == sum(int(s.get("tests")) for s in suites.values())
    assert suites["missing"].get("skipped") == "4"
    failure = suites["over"].find("testcase[@name='fill']/failure")
    assert failure.get("message") == "fill 95.0% > max 90.0%" and "fix: " in failure.text
    assert suites["over"].find("testcase[@name='fill']").get("line") == str(
        path.read_text().splitlines().index("[filters.over]") + 1
    )
    # the schema is strict enough to refuse a broken report
    broken = etree.fromstring(b'<testsuites><testsuite name="x" tests="one" failures="0" errors="0"/></testsuites>')
    assert not schema.validate(broken)
    twice = etree.fromstring(
        b'<testsuites><testsuite name="x" tests="1" failures="1" errors="0"><testcase name="a">'
        b"<failure/><error/></testcase></testsuite></testsuites>"
    )
    assert not schema.validate(twice)


def test_check_github_annotations(server, tmp_path, cli):
    path = four_filters(server, tmp_path, cli)
    result = cli("--config", str(path), "check", "--format", "github", "--no-server-checks")
    assert result.exit_code == 5
    lines = result.stdout.splitlines()
    errors = [line for line in lines if line.startswith("::error ")]
    assert len(errors) == 3
    text = path.read_text().splitlines()
    pattern = re.compile(r"^::error file=([^,]+),line=(\d+),title=([^:]+)::(.*)$")
    parsed = [pattern.match(line).groups() for line in errors]
    assert [text[int(line) - 1] for _f, line, _t, _m in parsed] == [
        "[filters.drifted]",
        "[filters.over]",
        "[filters.missing]",
    ]
    assert parsed[1][2] == "bloomctl check%3A over fill"
    assert parsed[1][3].startswith("fill 95.0%25 > max 90.0%25")  # '%' escaped as GitHub asks
    assert lines[-1].startswith("::notice title=bloomctl check::") and "3 fail" in lines[-1]


def test_a_server_that_does_not_answer_hides_no_other_result(plain, tmp_path, cli):
    dead = free_port()
    text = f"""\
[profiles.main]
url = "{plain.url}"
[profiles.gone]
url = "redis://127.0.0.1:{dead}/0"
connect_timeout = 0.5

[filters.here]
profile = "main"
capacity = 100
error_rate = "1%"

[filters.away]
profile = "gone"
capacity = 100
error_rate = "1%"
"""
    path = tmp_path / "two.toml"
    path.write_text(text)
    assert cli("--url", plain.url, "reserve", "here", "-c", "100", "-e", "1%").exit_code == 0
    result = cli("--config", str(path), "check", "--format", "json")
    assert result.exit_code == 3
    found = statuses(json.loads(result.stdout))
    assert found[("here", "exists")] == "ok" and found[("away", "connect")] == "error"
    junit = cli("--config", str(path), "check", "--format", "junit")
    assert '<error message="cannot reach profile' in junit.stdout


def test_the_command_line_url_wins_over_the_profile(plain, tmp_path, cli):
    path = tmp_path / "f.toml"
    path.write_text(
        f'[profiles.default]\nurl = "redis://127.0.0.1:{free_port()}"\n[filters.a]\ncapacity = 10\nerror_rate = "1%"\n'
    )
    assert cli("--url", plain.url, "reserve", "a", "-c", "10", "-e", "1%").exit_code == 0
    result = cli("--config", str(path), "--url", plain.url, "check", "--no-server-checks")
    assert result.exit_code == 0, result.output


def test_recipe_drift_is_a_failure_with_its_fix(plain, tmp_path, cli):
    (tmp_path / "u.csv").write_text("id\n" + "".join(f"{i}\n" for i in range(50)))
    base = f'[profiles.default]\nurl = "{plain.url}"\n[filters.users]\ncapacity = 100\nerror_rate = "1%"\nsource.csv = "u.csv"\nsource.column = "id"\n'
    path = tmp_path / "a.toml"
    path.write_text(base + 'source.prefix = "user:"\n')
    built = cli("--config", str(path), "rebuild", "users")
    assert built.exit_code == 0, built.output
    assert cli("--config", str(path), "check", "--no-server-checks").exit_code == 0
    path.write_text(base + 'source.prefix = "u:"\n')
    result = cli("--config", str(path), "check", "--format", "json", "--no-server-checks")
    assert result.exit_code == 1
    recipe = next(r for r in json.loads(result.stdout)["results"] if r["check"] == "recipe")
    assert recipe["status"] == "fail" and "prefix 'user:'" in recipe["message"] and "prefix 'u:'" in recipe["message"]
    assert recipe["fix"].endswith("rebuild users --allow-recipe-change")


def test_cuckoo_and_window_declarations(plain, tmp_path, cli):
    path = tmp_path / "c.toml"
    path.write_text(
        f"""\
[profiles.default]
url = "{plain.url}"
[filters.sessions]
type = "cuckoo"
capacity = 1000
bucket_size = 4
[filters.seen]
type = "windowed"
capacity = 1000
error_rate = "1%"
window.period = "1d"
window.keep = 3
thresholds.max_fpr = "5%"
"""
    )
    applied = cli("--config", str(path), "apply")
    assert applied.exit_code == 0, applied.output
    assert cli("--config", str(path), "check", "--no-server-checks").exit_code == 0
    drifted = (
        path.read_text().replace("bucket_size = 4", "bucket_size = 2").replace("window.keep = 3", "window.keep = 5")
    )
    path.write_text(drifted)
    result = cli("--config", str(path), "check", "--format", "json", "--no-server-checks")
    by = {(r["subject"], r["check"]): r for r in json.loads(result.stdout)["results"]}
    assert result.exit_code == 1
    assert "bucket_size: declared 2, found 4" in by[("sessions", "parameters")]["message"]
    assert "window.keep: declared 5, found 3" in by[("seen", "parameters")]["message"]
    assert "lookup over the window" in by[("seen", "fpr")]["message"]
    client = client_of(plain)
    current = [k for k in client.scan_iter("{seen}:*") if client.ttl(k) > 0 and client.ttl(k) <= 3 * 86400]
    assert current
    client.delete(*client.keys("{seen}:*"))  # the rotation never ran: adds would fail
    missing = cli("--config", str(path), "check", "seen", "--format", "json", "--no-server-checks")
    exists = next(r for r in json.loads(missing.stdout)["results"] if r["check"] == "exists")
    assert missing.exit_code == 5 and "current bucket is missing" in exists["message"]
    assert "rebuild --all --due" in exists["fix"]


def test_a_sharded_filter_with_a_member_gone_fails_exists(plain, tmp_path, cli):
    path = tmp_path / "s.toml"
    path.write_text(
        f'[profiles.default]\nurl = "{plain.url}"\n[filters.big]\ncapacity = 3000\nerror_rate = "1%"\nshards = 3\n'
    )
    applied = cli("--config", str(path), "apply", "--format", "json")
    assert applied.exit_code == 0, applied.output
    ok = cli("--config", str(path), "check", "--format", "json", "--no-server-checks")
    assert ok.exit_code == 0, ok.output
    assert "sharded bloom filter of 3" in json.loads(ok.stdout)["results"][0]["message"]
    from bloomctl.lifecycle.manifest import read_manifest

    client = client_of(plain)
    client.delete(read_manifest(client, "big").members[1])
    result = cli("--config", str(path), "check", "--format", "json", "--no-server-checks")
    assert result.exit_code == 5
    assert "member(s) 1 of 3 missing" in json.loads(result.stdout)["results"][0]["message"]


# --- review findings ---------------------------------------------------------------------------


def test_check_apply_and_the_exporter_never_load_the_function_library(plain, tmp_path, cli):
    """Reads only: a module-free filter is read through the script cache, FUNCTION LOAD is a write."""
    from bloomctl.declared.config import load
    from bloomctl.declared.exporter import Exporter
    from bloomctl.server.capabilities import detect

    path = tmp_path / "r.toml"
    path.write_text(f'[profiles.default]\nurl = "{plain.url}"\n[filters.a]\ncapacity = 100\nerror_rate = "1%"\n')
    assert cli("--config", str(path), "apply").exit_code == 0
    admin = plain.client()
    admin.execute_command("FUNCTION", "FLUSH")
    checked = cli("--config", str(path), "check", "--format", "json")  # the server's checks read it too
    assert checked.exit_code == 0, checked.output
    assert cli("--config", str(path), "apply", "--dry-run").exit_code == 0
    client = client_of(plain)
    exporter = Exporter(load(path), lambda _p: (client, detect(client)), cache_seconds=0)
    assert list(exporter.collect())
    assert admin.execute_command("FUNCTION", "LIST") == []


def test_a_filter_that_cannot_be_read_hides_no_other_result(plain, tmp_path, cli):
    """A command the server refuses (NOPERM here) is an error of that filter's `read`, not of the
    connection; the other filters and the other profile are still checked."""
    admin = plain.client()
    for key in ("a", "a2"):
        assert cli("--url", plain.url, "reserve", key, "-c", "100", "-e", "1%").exit_code == 0
    admin.execute_command("ACL", "SETUSER", "limited", "reset", "on", ">limited-pw", "~*", "+@all", "-type")
    try:
        path = tmp_path / "acl.toml"
        path.write_text(
            f'[profiles.limited]\nurl = "redis://limited@127.0.0.1:{plain.port}/0"\npassword_env = "LIMITED_PW"\n'
            f'[profiles.admin]\nurl = "{plain.url}"\n'
            '[filters.lim]\nkey = "a"\nprofile = "limited"\ncapacity = 100\nerror_rate = "1%"\n'
            '[filters.b]\nkey = "a2"\nprofile = "admin"\ncapacity = 100\nerror_rate = "1%"\n'
            '[filters.gone]\nprofile = "admin"\ncapacity = 100\nerror_rate = "1%"\n'
        )
        result = cli(
            "--config", str(path), "check", "--format", "json", "--no-server-checks", env={"LIMITED_PW": "limited-pw"}
        )
        found = {(r["subject"], r["check"]): r for r in json.loads(result.stdout)["results"]}
        assert (
            found[("lim", "read")]["status"] == "error"
            and "no permissions to run the 'type'" in found[("lim", "read")]["message"]
        )
        assert found[("b", "exists")]["status"] == "ok" and found[("gone", "exists")]["status"] == "fail"
        assert result.exit_code == 3 and "limited-pw" not in result.output
    finally:
        admin.execute_command("ACL", "DELUSER", "limited")


def test_drift_without_metadata_sharded_and_windows(plain, tmp_path, cli):
    from bloomctl.keys import KeyFamily

    assert cli("--url", plain.url, "reserve", "bare", "-c", "100", "-e", "1%").exit_code == 0
    client_of(plain).delete(KeyFamily.of("bare").meta)  # as if made by another tool
    assert cli("--url", plain.url, "reserve", "big", "-c", "3000", "-e", "1%", "--shards", "3").exit_code == 0
    assert cli("--url", plain.url, "window", "create", "w", "--period", "1d", "--keep", "2", "-c", "1000", "-e", "1%",
               "--backend", "bitmap").exit_code == 0  # fmt: skip
    path = tmp_path / "d.toml"
    path.write_text(
        f'[profiles.default]\nurl = "{plain.url}"\n'
        '[filters.bare]\ncapacity = 5000\nerror_rate = "1%"\n'
        '[filters.big]\ncapacity = 99999\nerror_rate = "1%"\nshards = 3\n'
        '[filters.w]\ntype = "windowed"\ncapacity = 50000\nerror_rate = "1%"\nwindow.period = "1d"\nwindow.keep = 2\n'
    )
    result = cli("--config", str(path), "check", "--format", "json", "--no-server-checks")
    by = {(r["subject"], r["check"]): r for r in json.loads(result.stdout)["results"]}
    assert "capacity: declared 5,000, found 100" in by[("bare", "parameters")]["message"]
    assert "the application feeds it" in by[("bare", "parameters")]["fix"]  # (no source: a rebuild cannot help)
    assert "capacity per shard: declared 33,333, found 1,000" in by[("big", "parameters")]["message"]
    assert "capacity: declared 50,000, found 1,000" in by[("w", "parameters")]["message"]
    plan = cli("--config", str(path), "apply", "--dry-run")
    assert plan.stdout.count("~ ") == 3, plan.stdout


def test_junit_stays_valid_xml_with_control_characters(plain, tmp_path, cli):
    etree = pytest.importorskip("lxml.etree")
    path = tmp_path / "x.toml"
    path.write_text(
        f'[profiles.default]\nurl = "{plain.url}"\n[filters.odd]\nkey = "k\\u0001ey"\ncapacity = 10\nerror_rate = "1%"\n'
    )
    result = cli("--config", str(path), "check", "--format", "junit", "--no-server-checks")
    assert result.exit_code == 5
    document = etree.fromstring(result.stdout.encode())
    assert etree.XMLSchema(etree.parse(str(XSD))).validate(document)
    assert "k\\x01ey" in result.stdout


@pytest.mark.redisbloom
def test_a_cuckoo_filter_the_application_made_shows_no_false_drift(bloom, tmp_path, cli):
    """CF.RESERVE 1000 holds 1,024 slots: without bloomctl's metadata, that is the capacity 1000, not drift."""
    client = client_of(bloom)
    client.execute_command("CF.RESERVE", "cf1", 1000)
    client.execute_command("CF.RESERVE", "cf2", 1000, "BUCKETSIZE", 4)
    path = tmp_path / "cf.toml"
    body = f'[profiles.default]\nurl = "{bloom.url}"\n'
    path.write_text(
        body + '[filters.cf1]\ntype = "cuckoo"\ncapacity = 1000\n[filters.cf2]\ntype = "cuckoo"\ncapacity = 1000\n'
    )
    result = cli("--config", str(path), "check", "--format", "json", "--no-server-checks")
    assert result.exit_code == 0, result.output
    path.write_text(body + '[filters.cf1]\ntype = "cuckoo"\ncapacity = 5000\n')
    drifted = cli("--config", str(path), "check", "--format", "json", "--no-server-checks")
    assert drifted.exit_code == 1 and "capacity: declared 5,000, found 1,024" in drifted.stdout
