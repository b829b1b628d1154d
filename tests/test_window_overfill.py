"""Windows: a bucket past its capacity is reported (#23 item 9), and `window create --dry-run`
shows what it would make and makes nothing (#23 item 8).

The quickstart's demo put 2,000 items into a bucket of 1,000 (192.8% fill, a lookup's FPR 13.96%)
and `window info` said nothing about it.
"""

from __future__ import annotations

import json

from bloomctl import window
from bloomctl.filters.windowed import WindowedFilter

CREATE = ["window", "create", "recent", "--period", "1d", "--keep", "3", "-e", "1%"]


def _fill(client, items: int, name: str = "recent") -> None:
    WindowedFilter(client, name).madd([f"event:{i}" for i in range(items)])


def _bucket(data: dict, role: str) -> dict:
    return next(b for b in data["buckets"] if b["role"] == role)


def test_window_info_warns_about_a_bucket_past_its_capacity(plain, cli_plain):
    """The quickstart's own numbers on the module-free backend, which keeps taking items past its
    capacity: a warning line on stderr, OVER in the table, `over_capacity` and `warnings` in JSON."""
    assert cli_plain(*CREATE, "-c", "auto", "--min-capacity", "1k").exit_code == 0
    _fill(plain.client(), 2000)
    shown = cli_plain("window", "info", "recent", "--format", "table")
    assert shown.exit_code == 0, shown.stderr  # a warning, not a failed check (`check` fails it)
    assert "warning:" in shown.stderr and "of its capacity 1,000" in shown.stderr, shown.stderr
    assert "above plan" in shown.stderr and "rotations size new buckets from its count" in shown.stderr
    assert "OVER" in shown.stdout and "Traceback" not in shown.stderr
    data = json.loads(cli_plain("window", "info", "recent", "--format", "json").stdout)
    current = _bucket(data, "current")
    assert current["over_capacity"] is True and current["fill_ratio"] > 1
    assert all(b["over_capacity"] is False for b in data["buckets"] if b["role"] != "current")
    assert len(data["warnings"]) == 1 and current["key"] in data["warnings"][0]


def test_a_bucket_at_its_capacity_is_not_past_it(plain, cli_plain):
    """The boundary: a bucket with as many items as its capacity is full, not over it."""
    assert cli_plain(*CREATE, "-c", "500").exit_code == 0
    client = plain.client()
    recent, counted = WindowedFilter(client, "recent"), 0
    for i in range(1000):  # an add that is a false positive counts nothing: add until 500 counted
        counted += recent.add(f"event:{i}")
        if counted == 500:
            break
    info = window.describe(client, "recent")
    current = next(b for b in info.buckets if b.role == "current")
    assert current.state.items == current.state.reserved_capacity == 500
    assert window.overfilled(info) == []
    shown = cli_plain("window", "info", "recent")
    assert shown.exit_code == 0 and "warning" not in shown.stderr and "OVER" not in shown.stdout
    WindowedFilter(client, "recent").add("one more")
    info = window.describe(client, "recent")
    assert [b.key for b in window.overfilled(info)] == [current.key]
    # a fixed capacity says where the fix is: a new window, since rotations keep the capacity
    assert "capacity is fixed" in window.overfill_warning(info, window.overfilled(info)[0])


def test_a_grown_redisbloom_bucket_is_past_its_capacity(bloom, cli_bloom):
    """A scaling RedisBloom bucket grows into a second sub-filter instead of refusing items: it is
    past the capacity the window planned, and its lookups compound two error rates."""
    assert cli_bloom(*CREATE, "-c", "1000", "--expansion", "2", "--backend", "redisbloom").exit_code == 0
    _fill(bloom.client(), 1500)
    data = json.loads(cli_bloom("window", "info", "recent", "--format", "json").stdout)
    current = _bucket(data, "current")
    assert current["over_capacity"] is True and current["capacity"] == 1000 and current["items"] > 1000
    assert len(data["warnings"]) == 1
    # it grew rather than overfilled: its rate is within the planned 1%, and the warning says so
    assert current["estimated_fpr"] < 0.01 and "grew past the capacity" in data["warnings"][0]
    assert "above plan" not in data["warnings"][0]


def test_a_past_bucket_over_capacity_is_reported_too(plain, cli_plain):
    """A lookup asks every bucket of the window: an overfilled bucket of yesterday raises every
    lookup's false-positive rate until it expires, so it is reported like the current one."""
    assert cli_plain(*CREATE, "-c", "200").exit_code == 0
    client = plain.client()
    info = window.describe(client, "recent")
    yesterday = info.spec.key(info.current - 1)
    from bloomctl.backends import get

    # yesterday's bucket, made by hand as the rotation of yesterday would have, then overfilled
    get("bitmap").reserve(client, yesterday, info.spec.plan_for(200))
    get("bitmap").madd(client, yesterday, [f"old:{i}" for i in range(400)])
    data = json.loads(cli_plain("window", "info", "recent", "--format", "json").stdout)
    past = [b for b in data["buckets"] if b["over_capacity"]]
    assert [b["role"] for b in past] == ["past"] and past[0]["key"] == "{recent}:" + info.spec.label(info.current - 1)


# --- window create --dry-run -----------------------------------------------------------------------


def test_window_create_dry_run_creates_nothing(plain, cli_plain):
    """Every check of a real create, the buckets it would make with their capacities and sizes, and
    not a key written nor a function library loaded; exit 0."""
    client = plain.client()
    client.execute_command("FUNCTION", "FLUSH")  # an earlier test's library: FLUSHALL keeps functions
    args = [*CREATE, "-c", "1k", "--dry-run"]
    shown = cli_plain(*args)
    assert shown.exit_code == 0, shown.stderr
    assert client.keys("*") == [] and client.execute_command("FUNCTION", "LIST") == []
    assert "dry run: nothing created" in shown.stdout
    assert shown.stdout.count("would create") == 3 and "capacity 1,000, 1.23 KiB" in shown.stdout
    data = json.loads(cli_plain(*args, "--format", "json").stdout)
    assert data["dry_run"] is True and data["settings"]["name"] == "recent"
    made = [b for b in data["buckets"] if b["action"] == "created"]
    assert len(made) == 3 and all(b["capacity"] == 1000 and b["size_bytes"] > 1000 for b in made)
    assert client.keys("*") == []
    # what it printed is what a real create makes
    real = json.loads(cli_plain(*CREATE, "-c", "1k", "--format", "json").stdout)
    assert [(b["key"], b["action"], b["size_bytes"]) for b in real["buckets"]] == [
        (b["key"], b["action"], b["size_bytes"]) for b in data["buckets"]
    ]
    created = [b["key"].encode() for b in made]
    assert [client.strlen(key) for key in created] == [b["size_bytes"] for b in made]


def test_window_create_dry_run_over_an_existing_window(plain, cli_plain):
    """The dry run says what the real run would: the same window with --if-not-exists is no
    change (exit 0), other settings are a conflict (exit 5); nothing is written either way."""
    assert cli_plain(*CREATE, "-c", "1k").exit_code == 0
    client = plain.client()
    before = sorted(client.keys("*"))
    same = cli_plain(*CREATE, "-c", "1k", "--if-not-exists", "--dry-run")
    assert same.exit_code == 0 and "the same window exists already" in same.stdout, same.stderr
    other = cli_plain(*CREATE, "-c", "5k", "--dry-run")
    assert other.exit_code == 5 and "already exists with other settings" in other.stderr
    assert sorted(client.keys("*")) == before


def test_window_create_help_lists_dry_run(cli):
    shown = " ".join(cli("window", "create", "--help").stdout.split())
    assert "--dry-run Make every check" in shown and "create nothing" in shown


def test_check_fails_the_fill_of_a_window_with_a_bucket_past_its_capacity(plain, cli_plain, tmp_path):
    """`check` reports what `window info` warns of: a bucket past its capacity fails the window's fill."""
    config = tmp_path / "bloomctl.toml"
    config.write_text(
        'version = 1\n[filters.recent]\ntype = "windowed"\ncapacity = 1000\nerror_rate = "1%"\n'
        'window.period = "1d"\nwindow.keep = 3\n'
    )
    assert cli_plain("--config", str(config), "apply", "--yes").exit_code == 0
    passed = cli_plain("--config", str(config), "check", "--format", "json")
    assert passed.exit_code == 0, passed.stdout
    _fill(plain.client(), 2000)
    failed = cli_plain("--config", str(config), "check", "--format", "json")
    assert failed.exit_code == 1, failed.stdout
    results = [r for r in json.loads(failed.stdout)["results"] if r["check"] == "fill"]
    assert results and results[0]["status"] == "fail" and "of its capacity 1,000" in results[0]["message"]
