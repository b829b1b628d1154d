"""`bloomctl apply` on real servers: a dry run changes nothing, apply creates what is missing (a
sourced filter from its source, never empty) and nothing else; a conflicting key, a failed
creation, a profile that does not answer or a declaration it cannot create leave the others to
go on; window buckets are never removed."""

from __future__ import annotations

import json
import re

from bloomctl import backends
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
