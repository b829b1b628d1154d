"""`bloomctl apply` on real servers: a dry run changes nothing, apply creates what is missing (a
sourced filter from its source, never empty) and nothing else; a conflicting key, a failed
creation, a profile that does not answer or a declaration it cannot create leave the others to
go on; window buckets are never removed; two runs at once make each filter once."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from bloomctl import backends
from bloomctl.keys import KeyFamily
from bloomctl.server.capabilities import detect
from tests.helpers.declared import four_filters
from tests.helpers.redis import client_of, snapshot
from tests.servers import free_port


def test_apply_dry_run_changes_nothing_and_apply_creates_only_what_is_missing(server, tmp_path, cli):
    path = four_filters(server, tmp_path, cli)
    path.write_text(
        path.read_text() + '\n[filters.built]\ncapacity = 500\nerror_rate = "1%"\nsource.csv = "items.csv"\n'
    )
    before = snapshot(client_of(server))
    dry = cli("--config", str(path), "apply", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert snapshot(client_of(server)) == before
    assert re.search(r"^\+ missing +create: missing: reserve bloom, capacity 1,000, error rate 1%$", dry.stdout, re.M)
    assert re.search(r"^\+ built +create: missing: its first build, from the csv source$", dry.stdout, re.M)
    assert re.search(r"^~ drifted +drift: capacity: declared 2,000, found 1,000$", dry.stdout, re.M)
    assert f"resolve: bloomctl --config {path} rebuild drifted" in dry.stdout
    assert re.search(r"^= healthy +unchanged", dry.stdout, re.M)
    assert "dry run: 2 to create, nothing changed; 1 drifted" in dry.stdout
    result = cli("--config", str(path), "apply", "--format", "json")
    assert result.exit_code == 0, result.output
    after = snapshot(client_of(server))
    for key in (b"healthy", b"drifted", b"over"):  # live filters: byte for byte as they were
        assert after[key] == before[key]
    client = client_of(server)
    built = backends.for_key(client, b"built")
    assert built.card(client, b"built") == 100  # from its source, never empty
    assert all(built.mexists(client, b"built", [str(i).encode() for i in range(100)]))
    assert backends.for_key(client, b"missing").info(client, b"missing").reserved_capacity == 1000
    changes = {c["filter"]: c for c in json.loads(result.stdout)["changes"]}
    assert changes["built"]["result"]["done"] and changes["missing"]["result"]["done"]
    again = cli("--config", str(path), "apply")
    assert again.exit_code == 0 and "0 of 0 created" in again.stdout
    assert snapshot(client_of(server)) == snapshot(client_of(server)) and set(snapshot(client_of(server))) == set(after)


def test_apply_leaves_a_conflicting_key_alone_and_creates_the_rest(plain, tmp_path, cli):
    path = tmp_path / "k.toml"
    path.write_text(
        f'[profiles.default]\nurl = "{plain.url}"\n[filters.taken]\ncapacity = 10\nerror_rate = "1%"\n'
        '[filters.free]\ncapacity = 10\nerror_rate = "1%"\n'
    )
    client = client_of(plain)
    client.set("taken", "the application's value")
    result = cli("--config", str(path), "apply")
    assert result.exit_code == 5, result.output
    assert re.search(r"^! taken +conflict: ", result.stdout, re.M)
    assert client.get("taken") == b"the application's value"
    assert client.exists("free") == 1


def test_a_failed_creation_is_reported_and_the_others_go_on(plain, tmp_path, cli):
    path = tmp_path / "f.toml"
    (tmp_path / "empty.csv").write_text("id\n")  # a source without items: the build refuses it
    path.write_text(
        f'[profiles.default]\nurl = "{plain.url}"\n[filters.nosource]\ncapacity = 10\nerror_rate = "1%"\n'
        'source.csv = "empty.csv"\n[filters.ok]\ncapacity = 10\nerror_rate = "1%"\n'
    )
    result = cli("--config", str(path), "apply")
    assert result.exit_code == 8, result.output  # the source's error
    assert "FAILED (exit 8)" in result.stdout and "no items" in result.stdout
    client = client_of(plain)
    assert client.exists("ok") == 1 and client.exists("nosource") == 0


def test_apply_plans_a_sourced_filter_the_build_would_refuse_as_invalid(plain, tmp_path, cli):
    """A dry run said `+ create` (exit 0) for a filter whose build then failed: a bitmap filter
    with an expansion, a source file that is not there."""
    (tmp_path / "a.csv").write_text("id\n1\n")
    path = tmp_path / "f.toml"
    path.write_text(
        f'[profiles.default]\nurl = "{plain.url}"\n'
        '[filters.grows]\ncapacity = 50000\nerror_rate = "1%"\nexpansion = 4\nsource.csv = "a.csv"\n'
        '[filters.nofile]\ncapacity = "auto"\nerror_rate = "1%"\nsource.csv = "not-there.csv"\n'
    )
    for args in (["apply", "--dry-run"], ["apply"]):
        result = cli("--config", str(path), *args)
        assert result.exit_code == 2, result.output
        assert result.stdout.count("! ") == 2 and "do not grow" in result.stdout and "not-there.csv" in result.stdout
    assert client_of(plain).dbsize() == 0


def test_apply_refuses_in_its_plan_what_it_cannot_create(plain, tmp_path, cli):
    path = tmp_path / "i.toml"
    path.write_text(
        f'[profiles.default]\nurl = "{plain.url}"\n'
        '[filters.grows]\ncapacity = 10\nerror_rate = "1%"\nexpansion = 2\nbackend = "bitmap"\n'
        '[filters.ok]\ncapacity = 10\nerror_rate = "1%"\n'
    )
    result = cli("--config", str(path), "apply", "--dry-run")
    assert result.exit_code == 2, result.output
    assert re.search(r"^! grows +invalid: missing, and cannot be created as declared: ", result.stdout, re.M)
    assert re.search(r"^\+ ok +create", result.stdout, re.M)


def test_apply_plans_a_backend_the_server_lacks_as_invalid(plain, tmp_path, cli):
    (tmp_path / "a.csv").write_text("id\n1\n")
    path = tmp_path / "b.toml"
    path.write_text(
        f'[profiles.default]\nurl = "{plain.url}"\n'
        '[filters.fed]\ncapacity = 10\nerror_rate = "1%"\nbackend = "redisbloom"\n'
        '[filters.built]\ncapacity = 10\nerror_rate = "1%"\nbackend = "redisbloom"\nsource.csv = "a.csv"\n'
        '[filters.w]\ntype = "windowed"\ncapacity = 10\nerror_rate = "1%"\nbackend = "redisbloom"\n'
        'window.period = "1d"\nwindow.keep = 2\n'
    )
    result = cli("--config", str(path), "apply", "--dry-run")
    assert result.exit_code == 2, result.output
    assert result.stdout.count("invalid: missing, and cannot be created as declared") == 3
    assert "profile 'default'" not in result.stdout


def test_apply_goes_on_past_a_profile_that_does_not_answer(plain, tmp_path, cli):
    path = tmp_path / "two.toml"
    path.write_text(
        f'[profiles.gone]\nurl = "redis://127.0.0.1:{free_port()}/0"\nconnect_timeout = 0.5\n'
        f'[profiles.main]\nurl = "{plain.url}"\n'
        '[filters.away]\nprofile = "gone"\ncapacity = 10\nerror_rate = "1%"\n'
        '[filters.here]\nprofile = "main"\ncapacity = 10\nerror_rate = "1%"\n'
    )
    result = cli("--config", str(path), "apply")
    assert result.exit_code == 3, result.output
    assert re.search(r"^! away +error: profile 'gone'", result.stdout, re.M)
    assert client_of(plain).exists("here") == 1


def test_apply_never_removes_a_window_bucket(plain, tmp_path, cli):
    path = tmp_path / "w.toml"
    path.write_text(
        f'[profiles.default]\nurl = "{plain.url}"\n'
        '[filters.w]\ntype = "windowed"\ncapacity = 100\nerror_rate = "1%"\nwindow.period = "1d"\nwindow.keep = 2\n'
    )
    assert cli("--config", str(path), "apply").exit_code == 0
    client = client_of(plain)
    current = sorted(client.scan_iter("{w}:*"))[0]
    stray = b"{w}:2020-01-01"
    client.copy(current, stray)
    client.persist(stray)
    client.delete(sorted(client.scan_iter("{w}:*"))[-1])  # a coming bucket gone: apply makes it
    assert "bucket(s) to make" in cli("--config", str(path), "apply", "--dry-run").stdout
    assert cli("--config", str(path), "apply").exit_code == 0
    assert client.exists(stray) == 1  # old buckets are `window rotate`'s to remove


def test_bloomctl_password_is_not_sent_to_a_profile_server(plain, tmp_path, cli):
    path = tmp_path / "p.toml"
    path.write_text(f'[profiles.default]\nurl = "{plain.url}"\n[filters.a]\ncapacity = 10\nerror_rate = "1%"\n')
    result = cli("--config", str(path), "apply", env={"BLOOMCTL_PASSWORD": "meant-for-another-server"})
    assert result.exit_code == 0, result.output  # (AUTH with it would fail: this server has no password)


def _slow_file(server, tmp_path, wait: float | None = None):
    """Two filters built from a source at 20,000 items/s (a second each), two reserved, a window."""
    (tmp_path / "ids.csv").write_text("id\n" + "".join(f"id:{i}\n" for i in range(20_000)))
    built = "".join(
        f'[filters.{name}]\ncapacity = 50_000\nerror_rate = "1%"\nsource.csv = "ids.csv"\n'
        'rebuild.build = "server"\nrebuild.max_rate = 20_000\n'
        for name in ("b1", "b2")
    )
    reserved = "".join(f'[filters.{name}]\ncapacity = 1000\nerror_rate = "1%"\n' for name in ("r1", "r2"))
    window = (
        '[filters.w]\ntype = "windowed"\ncapacity = 1000\nerror_rate = "1%"\nwindow.period = "1h"\nwindow.keep = 3\n'
    )
    path = tmp_path / "bloomctl.toml"
    path.write_text(f'version = 1\n[profiles.default]\nurl = "{server.url}"\n{built}{reserved}{window}')
    return path


def cli_reserve(server, key: str, capacity: str) -> int:
    command = [sys.executable, "-m", "bloomctl", "--url", server.url, "reserve", key, "-c", capacity, "-e", "1%"]
    return subprocess.run(command, capture_output=True, check=False).returncode


def _apply_process(path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bloomctl", "--config", str(path), "apply", "--yes", "--format", "json", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_two_applies_at_once_make_each_filter_once_and_both_succeed(plain, tmp_path):
    """(#24 item 4) Two runs at once on one file both exited 6 although every filter was made: the
    one that found a filter's lock held called it a failure. A held filter is put off, waited for,
    and reported as made by the other run; each filter is made once, both runs exit 0."""
    path = _slow_file(plain, tmp_path)
    runs = [_apply_process(path), _apply_process(path)]
    outputs = [run.communicate(timeout=60) for run in runs]
    for run, (_out, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err.decode()
    results = [{c["filter"]: c.get("result") for c in json.loads(out)["changes"]} for out, _ in outputs]
    for name in ("b1", "b2", "r1", "r2"):
        made = [r[name]["message"] for r in results if r.get(name)]
        assert all(r[name]["done"] for r in results if r.get(name))
        assert sum(m.startswith(("built from its source", "created")) for m in made) == 1, made
    meanwhile = [r[n] for r in results for n in ("b1", "b2") if r.get(n) and "made meanwhile" in r[n]["message"]]
    assert meanwhile, "the two runs did not overlap: nothing was tested"
    client = client_of(plain)
    for name in ("b1", "b2"):
        family = KeyFamily.of(name)
        assert backends.for_key(client, name).card(client, name) == 20_000
        assert not client.exists(family.old), "built twice: a second build replaced the first"
    assert client.exists("w") and backends.for_key(client, "r1").info(client, "r1").reserved_capacity == 1000


def test_apply_and_a_cron_rebuild_all_at_once_build_each_filter_once(plain, tmp_path):
    """A deploy's apply and cron's `rebuild --all --due` start together on a file whose filters are
    missing. Both decided "first build"; the one that took a lock second built the filter again
    over the other's (its `old` kept an hour, the build's time and memory twice; a sharded filter's
    manifest refused, verified standbys left without TTL). A first build of --all now builds nothing
    where a rebuild from the source made the filter meanwhile; each filter is built once."""
    path = _slow_file(plain, tmp_path)
    command = [sys.executable, "-m", "bloomctl", "--config", str(path), "rebuild", "--all", "--due"]
    cron = subprocess.Popen(
        [*command, "--lock-wait", "30", "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deploy = _apply_process(path)
    (cron_out, cron_err), (apply_out, apply_err) = cron.communicate(timeout=90), deploy.communicate(timeout=90)
    assert cron.returncode == 0, cron_err.decode()
    assert deploy.returncode == 0, apply_err.decode()
    runs = {run["name"]: run for run in json.loads(cron_out)["filters"]}
    applied = {c["filter"]: c.get("result") for c in json.loads(apply_out)["changes"]}
    meanwhile = [name for name in ("b1", "b2") if "made meanwhile" in runs[name]["detail"]]
    meanwhile += [name for name in ("b1", "b2") if applied.get(name) and "made meanwhile" in applied[name]["message"]]
    assert meanwhile, (runs, applied, "the two runs did not overlap: nothing was tested")
    client = client_of(plain)
    for name in ("b1", "b2"):
        assert backends.for_key(client, name).card(client, name) == 20_000
        assert not client.exists(KeyFamily.of(name).old), f"{name} built twice: a second build replaced the first"


def test_a_filter_reserved_meanwhile_is_built_by_rebuild_all(plain, tmp_path, monkeypatch, cli):
    """The first build of --all meets, under the lock, a filter the application reserved after
    the decision: nothing built it from its source, so it is built now (as the schedule's "never
    built from its source" is), not reported made by another run."""
    from bloomctl.declared import schedule

    path = _slow_file(plain, tmp_path)
    real_decide = schedule.decide

    def decide_then_reserve(client, decl, **kwargs):
        decision = real_decide(client, decl, **kwargs)
        if decl.name == "b1" and decision.reason == schedule.FIRST_BUILD:
            assert cli_reserve(plain, "b1", "50000") == 0  # the application's, after the decision
        return decision

    monkeypatch.setattr(schedule, "decide", decide_then_reserve)
    result = cli("--config", str(path), "rebuild", "--all", "--due", "--format", "json")
    assert result.exit_code == 0, result.stderr
    run = {r["name"]: r for r in json.loads(result.stdout)["filters"]}["b1"]
    assert run["action"] == "rebuild" and run["swapped"] and "made meanwhile" not in run["detail"], run
    client = client_of(plain)
    assert backends.for_key(client, "b1").card(client, "b1") == 20_000


def test_a_held_filter_is_waited_for_then_made_here_or_left_with_exit_6(plain, tmp_path):
    """A filter whose lock another run holds: made here once that run lets go without making it;
    still held after --lock-wait, it is the one thing left undone (exit 6, the holder named), and
    the others are made."""
    path = _slow_file(plain, tmp_path)
    client = client_of(plain)
    lock = KeyFamily.of("b1").lock
    holder = json.dumps({"token": "t", "command": "bloomctl rebuild", "pid": 4242, "host": "elsewhere"})
    client.set(lock, holder, px=60_000)
    run = _apply_process(path, "--lock-wait", "1")
    out, err = run.communicate(timeout=60)
    assert run.returncode == 6, err.decode()
    results = {c["filter"]: c["result"] for c in json.loads(out)["changes"]}
    assert not results["b1"]["done"] and results["b1"]["exit_code"] == 6
    assert "pid 4242 on elsewhere" in results["b1"]["held_by"] and "waited 1s" in results["b1"]["error"]
    assert all(results[name]["done"] for name in ("b2", "r1", "r2", "w"))
    assert not client.exists("b1") and client.get(lock) == holder.encode()  # another run's lock: left alone
    run = _apply_process(path, "--lock-wait", "30")
    time.sleep(1.5)  # it puts b1 off, and waits for it
    client.delete(lock)  # the holder stops without having made it
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err.decode()
    result = {c["filter"]: c.get("result") for c in json.loads(out)["changes"]}["b1"]
    assert result["done"] and result["message"].startswith("built from its source") and "elsewhere" in result["held_by"]
    assert backends.for_key(client, "b1").card(client, "b1") == 20_000


def test_a_first_build_leaves_a_filter_made_while_it_waited_for_the_lock(target, tmp_path):
    """The check under the lock: a first build (apply's) that finds the filter made meanwhile
    builds nothing, leaves that filter as it is, and frees the lock."""
    from bloomctl.errors import MadeMeanwhile
    from bloomctl.lifecycle.front import reserve
    from bloomctl.rebuild import RebuildOptions, rebuild
    from bloomctl.sizing.bloom import plan
    from bloomctl.sources import CsvSource

    client, server = target.client, detect(target.client)
    csv = tmp_path / "ids.csv"
    csv.write_text("id\n" + "".join(f"id:{i}\n" for i in range(100)))
    nonscaling = target.backend.name == "bitmap"
    reserve(client, server, "users", plan(1000, 0.01, None if nonscaling else 2), backend=target.backend.name)
    before = snapshot(client)
    options = RebuildOptions(capacity=500, error_rate=0.01, swap=True, only_if_missing=True, nonscaling=nonscaling)
    with pytest.raises(MadeMeanwhile, match="made meanwhile by another run"):
        rebuild(client, server, "users", CsvSource(str(csv)), options)
    assert snapshot(client) == before  # no standby, no lock, the filter as it was


@pytest.mark.parametrize("what", ["a smaller filter", "a string", "an empty filter as declared"])
def test_a_key_that_appears_at_a_filter_to_build_is_judged_once_its_holder_is_done(plain, tmp_path, what):
    """The plan found b1 missing and its lock held; while the run waited, a key appeared there. It
    is judged only once the lock is free (still held: exit 6, whatever the key: its holder may be
    half-way through a sharded swap), and then as the plan would: an application's auto-created
    filter of capacity 100, or someone's string, is not "made by another run" (that was exit 0
    with every source item missing): exit 5, nothing built over it. Nor is a filter of the
    declared parameters that no rebuild from the source filled (the application's own reserve at
    its start: a reviewer saw exit 0, "2 of 2 created", every source item missing)."""
    path = _slow_file(plain, tmp_path)
    client = client_of(plain)
    lock = KeyFamily.of("b1").lock
    client.set(lock, json.dumps({"token": "t", "command": "bloomctl rebuild", "pid": 7, "host": "elsewhere"}))

    def appear() -> None:
        if what == "a string":
            client.set("b1", "someone's value")
        else:
            assert cli_reserve(plain, "b1", "100" if what == "a smaller filter" else "50000") == 0

    for release, code in ((False, 6), (True, 5)):
        client.unlink("b1", KeyFamily.of("b1").meta)
        run = _apply_process(path, "--lock-wait", "4", "b1")
        time.sleep(1.5)  # planned (missing), put off (held), waiting
        appear()
        before = snapshot(client)
        if release:
            client.delete(lock)
            del before[lock]
        out, err = run.communicate(timeout=60)
        assert run.returncode == code, err.decode()
        result = json.loads(out)["changes"][0]["result"]
        assert not result["done"] and result["exit_code"] == code and "elsewhere" in result["held_by"]
        if release:
            reason = "no rebuild from its source made it" if what.endswith("as declared") else "not as declared"
            assert reason in result["error"], result
        assert snapshot(client) == before  # nothing built over it
