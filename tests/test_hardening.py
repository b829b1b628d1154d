"""Production hardening (issue 10): each fault or bad input an operator audit found, reproduced on
real servers. The item number of the audit is in each test's docstring."""

from __future__ import annotations

import json
import math
import re

import pytest

from bloomctl.errors import UsageError
from bloomctl.keys import KeyFamily
from bloomctl.lifecycle import front as lifecycle
from bloomctl.server.capabilities import detect
from bloomctl.sizing.bloom import plan


def active_and_small_standby(target, active_items: int = 1000, standby_items: int = 3) -> None:
    target.reserve("users", 10_000)
    target.add("users", [f"user:{i}" for i in range(active_items)])
    target.reserve(KeyFamily.of("users").standby, 10_000)
    target.add(KeyFamily.of("users").standby, [f"user:{i}" for i in range(standby_items)])


@pytest.mark.parametrize("bad", ["nan", "NaN", "inf", "-inf"])
def test_nan_and_infinities_never_reach_a_guard(target, tmp_path, bad):
    """(1) `--min-ratio nan` turned the shrink guard off: 1000 items replaced by 3. Every float
    option refuses NaN and infinities (exit 2), the library's swap too."""
    active_and_small_standby(target)
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


def test_percentages_where_a_fraction_is_asked(target):
    """(16) `--max 90%` reads as 0.9; `--min-ratio 50%` as 0.5."""
    target.reserve("users", 1000)
    target.add("users", [f"u{i}" for i in range(950)])
    result = target.cli("fill-ratio", "users", "--max", "90%", "--format", "json")
    assert result.exit_code == 1, result.stderr
    assert math.isclose(json.loads(result.stdout)["thresholds"]["max"], 0.9)
    assert plan(1000, 0.01).capacity == 1000  # (the planner is untouched by the option types)


def test_absurd_expansions_are_refused_before_the_server_stores_them_as_0(target):
    """(12) `--expansion 1099511627776` was stored by RedisBloom 2.8 as 0 (its factor is 32 bits);
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


def test_out_of_memory_mid_load_gives_the_memory_back(target, tmp_path):
    """(2) maxmemory + noeviction, a scaling standby growing past the limit: the run exits 3 and
    says so, and removes its standby, so the application's own writes work again."""
    if target.backend.name != "redisbloom" or target.cluster:
        pytest.skip("a RedisBloom chain grows while it loads; one node's memory")
    client = target.client
    target.reserve("users", 1000)
    target.add("users", ["user:0", "user:1"])
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(300_000)))
    used = client.info("memory")["used_memory"]
    client.config_set("maxmemory", str(used + 400_000))  # a 1000-capacity standby fits; its growth does not
    try:
        result = target.cli(
            "rebuild", "users", "--from-csv", str(csv), "-c", "1000", "-e", "1%", "--build", "server", "--swap"
        )
        assert result.exit_code == 3, result.stderr
        assert "out of memory" in result.stderr and "was removed to give the memory back" in result.stderr
        family = KeyFamily.of("users")
        assert not client.exists(family.standby) and not client.exists(family.standby_meta)
        assert client.set("app:key", "the application writes again")
        assert target.card("users") == 2 and not client.exists(family.lock)
    finally:
        client.config_set("maxmemory", "0")


@pytest.mark.parametrize("build", ["client", "server"])
def test_a_bitmap_filter_is_never_swapped_in_over_its_capacity(target, tmp_path, build):
    """(3) A bitmap filter rebuilt from 200k rows with the capacity of 1000 its metadata records was
    swapped in saturated ("maybe" for every absent item). It never grows: past its capacity the
    rebuild stops, as RedisBloom's NONSCALING filter does; over 80% it warns."""
    if target.backend.name != "bitmap":
        pytest.skip("RedisBloom grows, or refuses a NONSCALING filter's item itself")
    assert target.cli("reserve", "users", "-c", "1000", "-e", "1%", "--backend", "bitmap").exit_code == 0
    target.add("users", ["user:0"])
    big = tmp_path / "big.csv"
    big.write_text("id\n" + "".join(f"user:{i}\n" for i in range(200_000)))
    result = target.cli("rebuild", "users", "--from-csv", str(big), "--swap", "--build", build)
    assert result.exit_code == 5, result.stderr
    assert "over its capacity of 1,000" in result.stderr and "--capacity" in result.stderr
    assert target.card("users") == 1 and not target.client.exists(KeyFamily.of("users").old)
    assert target.cli("swap", "users", "--yes").exit_code == 5  # the standby left behind is never swapped in
    near = tmp_path / "near.csv"
    near.write_text("id\n" + "".join(f"user:{i}\n" for i in range(900)))
    result = target.cli("rebuild", "users", "--from-csv", str(near), "--swap", "--build", build)
    assert result.exit_code == 0, result.stderr
    assert "90% of its capacity of 1,000: it never grows" in result.stderr


def pause_writes_before(monkeypatch, target, calls: set[int], millis: int = 1500) -> None:
    """The server holds every write for ``millis`` from the swap script's n-th call (in ``calls``):
    the client's --timeout passes first, then the script runs."""
    from bloomctl.lifecycle import single

    real, seen = single.swap, [0]

    def paused(*args, **kwargs):
        seen[0] += 1
        if seen[0] in calls:
            target.client.execute_command("CLIENT", "PAUSE", millis, "WRITE")
        return real(*args, **kwargs)

    monkeypatch.setattr(single, "swap", paused)


def test_a_swap_whose_reply_is_lost_reports_what_happened(target, monkeypatch):
    """(4) A timeout while the swap script ran was reported as a failure (exit 3) though the swap
    was applied, and the lock stayed. bloomctl releases the lock (which settles a script still
    waiting in the server: it checks the lock's token), looks, and says what happened."""
    import redis

    from bloomctl.lifecycle import single

    active_and_small_standby(target, active_items=10, standby_items=10)
    real = single.swap

    def applied_then_lost(*args, **kwargs):
        real(*args, **kwargs)
        raise redis.exceptions.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(single, "swap", applied_then_lost)
    result = target.cli("swap", "users", "--yes", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert "bloomctl looked: it was applied" in result.stderr and json.loads(result.stdout)["note"]
    family = KeyFamily.of("users")
    assert not target.client.exists(family.standby) and not target.client.exists(family.lock)


def test_a_swap_held_by_the_server_past_the_timeout_is_reported_truthfully(target, monkeypatch):
    """The server holds the swap's script (CLIENT PAUSE) past --timeout: whichever way it ends, the
    report matches the keys, and the lock is released."""
    if target.cluster:
        pytest.skip("CLIENT PAUSE holds one node")
    active_and_small_standby(target, active_items=10, standby_items=10)
    pause_writes_before(monkeypatch, target, {1})
    result = target.cli("--timeout", "0.5", "swap", "users", "--yes")
    family = KeyFamily.of("users")
    if result.exit_code == 0:
        assert "it was applied" in result.stderr and not target.client.exists(family.standby)
    else:
        assert result.exit_code == 3 and "it was NOT applied" in result.stderr, result.stderr
        assert target.client.exists(family.standby)
    assert not target.client.exists(family.lock)


def test_a_swap_that_never_reached_the_server_says_it_was_not_applied(target, monkeypatch):
    import redis

    from bloomctl.lifecycle import single

    active_and_small_standby(target, active_items=10, standby_items=10)

    def lost(*args, **kwargs):
        raise redis.exceptions.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(single, "swap", lost)
    result = target.cli("swap", "users", "--yes")
    assert result.exit_code == 3 and "it was NOT applied" in result.stderr, result.stderr
    family = KeyFamily.of("users")
    assert target.client.exists(family.standby) and not target.client.exists(family.lock)
    assert target.card("users") == 10


def test_a_sharded_swap_counts_the_shards_really_swapped(target, tmp_path, monkeypatch):
    """(4) "1 of 3" was reported with 2 applied: the second member's reply was lost after it ran."""
    import redis

    from bloomctl.lifecycle import single

    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(3000)))
    args = ["rebuild", "users", "--from-csv", str(csv), "-c", "9000", "-e", "1%", "--shards", "3", "--nonscaling"]
    first = target.cli(*args, "--swap")
    assert first.exit_code == 0, first.stderr
    second = target.cli(*args[:4])
    assert second.exit_code == 0, second.stderr  # standbys built again, not swapped
    real, calls = single.swap, [0]

    def second_reply_lost(*args, **kwargs):
        calls[0] += 1
        done = real(*args, **kwargs)
        if calls[0] == 2:
            raise redis.exceptions.ConnectionError("Connection closed by server.")
        return done

    monkeypatch.setattr(single, "swap", second_reply_lost)
    result = target.cli("swap", "users", "--yes")
    assert result.exit_code == 5 and "stopped after 2 of 3 shards" in result.stderr, result.stderr
    monkeypatch.undo()
    again = target.cli("swap", "users", "--yes")
    assert again.exit_code == 0, again.stderr
    assert not target.client.exists(KeyFamily.of("users").lock)


@pytest.mark.parametrize(
    "where, value",
    [
        ("meta", "string"),
        ("meta", "hash"),
        ("standby:meta", "string"),
        ("old:meta", "hash"),
        ("lock", "hash"),
        ("old", "string"),
    ],
)
def test_someone_elses_data_at_a_companion_key_is_refused_and_kept(target, tmp_path, where, value):
    """(5) A foreign value at `{k}:meta` was refused by reserve but overwritten by `rebuild --swap`;
    a lock key holding a hash gave a raw WRONGTYPE (exit 3, the key not named). Every command that
    would write, move or delete a companion key refuses (exit 5, the key named) and leaves it be."""
    target.reserve("users", 10_000)
    target.add("users", ["user:0"])
    key = f"{{users}}:{where}"
    if value == "string":
        target.client.set(key, "someone else's")
    else:
        target.client.hset(key, mapping={"owner": "another app"})
    before = target.client.dump(key)
    csv = tmp_path / "u.csv"
    csv.write_text("id\nuser:0\nuser:1\n")
    commands = [
        ["rebuild", "users", "--from-csv", str(csv), "-e", "1%", "--swap"],
        ["swap", "users", "--yes"],
        ["rollback", "users", "--yes"],
    ]
    if where in ("meta", "lock"):
        commands.append(["reserve", "fresh-" + where, "-c", "100", "-e", "1%"])  # another key: allowed
    for args in commands:
        result = target.cli(*args)
        if args[0] == "reserve":
            assert result.exit_code == 0, result.stderr
            continue
        assert result.exit_code == 5, (args, result.stderr)
        assert repr(key) in result.stderr and "WRONGTYPE" not in result.stderr, result.stderr
    assert target.client.dump(key) == before and target.card("users") == 1


def verified_standby(target, tmp_path):
    csv = tmp_path / "three.csv"
    csv.write_text("id,name,email\n1,a,x\n2,b,y\n")
    first = target.cli("rebuild", "users", "--from-csv", str(csv), "--column", "name", "-c", "100", "-e", "1%")
    assert first.exit_code == 0, first.stderr
    return csv


@pytest.mark.parametrize(
    "args",
    [
        ["--column", "5"],
        ["--template", "{7}"],
        ["--no-header", "--column", "5"],
        ["--column", "5", "--build", "server"],
    ],
)
def test_a_column_beyond_the_rows_is_refused_before_the_standby_is_touched(target, tmp_path, args):
    """(6) `--column 5` / `--template '{7}'` on a 3-column file replaced a verified standby with an
    empty `loading` one, then exited 8. Now: exit 2, the verified standby as it was."""
    from bloomctl.lifecycle.metadata import read_metadata

    csv = verified_standby(target, tmp_path)
    family = KeyFamily.of("users")
    before = target.client.dump(family.standby)
    result = target.cli("rebuild", "users", "--from-csv", str(csv), *args)
    assert result.exit_code == 2 and "the item needs column" in result.stderr, result.stderr
    assert read_metadata(target.client, family.standby_meta)["state"] == "verified"
    assert target.client.dump(family.standby) == before


def test_a_since_column_the_query_does_not_select_is_refused_up_front(target, sqlite_engine):
    """(6) A `--since-column` the query does not select failed only after the full load."""
    import sqlalchemy

    with sqlite_engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE users (email TEXT, updated_at TEXT)"))
        conn.execute(sqlalchemy.text("INSERT INTO users VALUES ('a@x', '2026-01-01')"))
    url = sqlite_engine.url.render_as_string(hide_password=False)
    args = ["--from-sql", "SELECT email FROM users", "--db-url", url, "-c", "100", "-e", "1%"]
    result = target.cli("rebuild", "users", *args, "--since-column", "updated_at")
    assert result.exit_code == 2 and "'updated_at' is not a column the query selects" in result.stderr
    assert "--since-column" in result.stderr and not target.client.exists(KeyFamily.of("users").standby)
    selected = target.cli(
        "rebuild", "users", *args[:1], "SELECT email, updated_at FROM users", *args[2:], "--since-column", "UPDATED_AT"
    )
    assert selected.exit_code == 0, selected.stderr


def test_a_user_without_scripting_is_told_before_anything_is_written(target, tmp_path):
    """(6) An ACL user without scripting failed only after the whole load."""
    if target.cluster:
        pytest.skip("one node's ACL")
    target.client.execute_command("ACL", "SETUSER", "noscript", "on", ">pw", "~*", "&*", "+@all", "-@scripting")
    try:
        csv = tmp_path / "u.csv"
        csv.write_text("id\nuser:1\n")
        url = target.url.replace("redis://", "redis://noscript:pw@", 1)
        for args in (
            ["rebuild", "users", "--from-csv", str(csv), "-c", "100", "-e", "1%", "--swap"],
            ["swap", "users", "--yes"],
        ):
            result = target.cli(*args, url=url)
            assert result.exit_code == 4 and "may not run Lua scripts" in result.stderr, result.stderr
            assert "pw" not in result.stderr.replace("+@scripting", "")
        family = KeyFamily.of("users")
        assert not any(target.client.exists(key) for key in (family.standby, family.standby_meta, family.lock))
    finally:
        target.client.execute_command("ACL", "DELUSER", "noscript")


def test_items_built_otherwise_are_never_swapped_in_silently(target, tmp_path):
    """(7) A rebuild with a different --prefix swapped in cleanly and every lookup then missed.
    The recipe (source kind, column, template, prefix) is recorded; a change is refused (exit 5)
    unless --allow-recipe-change, by the rebuild (before loading) and by the swap."""
    from bloomctl.lifecycle.metadata import read_metadata

    csv = tmp_path / "u.csv"
    csv.write_text("id,email\n" + "".join(f"{i},u{i}@x\n" for i in range(200)))
    base = ["rebuild", "users", "--from-csv", str(csv), "--column", "id", "-c", "1000", "-e", "1%"]
    assert target.cli(*base, "--prefix", "user:", "--swap").exit_code == 0
    recorded = json.loads(read_metadata(target.client, KeyFamily.of("users").meta)["recipe"])
    assert recorded == {"source": "csv", "column": "id", "template": None, "prefix": "user:"}
    changed = target.cli(*base, "--prefix", "u:", "--swap")
    assert changed.exit_code == 5 and "built differently" in changed.stderr, changed.stderr
    assert (
        "prefix 'u:'" in changed.stderr
        and "prefix 'user:'" in changed.stderr
        and "--allow-recipe-change" in changed.stderr
    )
    assert not target.client.exists(KeyFamily.of("users").standby)  # refused before anything was written
    assert target.cli(*base, "--prefix", "u:", "--allow-recipe-change").exit_code == 0  # built, not swapped
    swap = target.cli("swap", "users", "--yes")
    assert swap.exit_code == 5 and "built differently" in swap.stderr
    assert target.cli("swap", "users", "--yes", "--allow-recipe-change").exit_code == 0
    assert all(target.backend.mexists(target.client, b"users", [b"u:0", b"u:199"]))
    same = target.cli(*base, "--prefix", "u:", "--swap")
    assert same.exit_code == 0, same.stderr


@pytest.mark.parametrize("password", ["Sekr1t/Xyz9", "Sekr1t#Xyz9", "Sekr1t?Xyz9", "Sekr1t/Xyz9#Qq7"])
def test_a_password_that_breaks_the_url_is_refused_without_a_trace_of_it(cli_plain, plain, password):
    """(8) A password holding an unencoded / # or ? leaked its first part in the URL error, and the
    client connected to another host. Refused (exit 2) with percent-encoding advice; no fragment
    of the password anywhere."""
    from urllib.parse import quote

    host = plain.url.split("//", 1)[1]
    result = cli_plain("info", "users", url=f"redis://:{password}@{host}")
    assert result.exit_code == 2 and "percent-encode" in result.stderr, result.stderr
    for fragment in ("Sekr1t", "Xyz9", "Qq7"):
        assert fragment not in result.stdout + result.stderr
    encoded = cli_plain("info", "users", url=f"redis://:{quote(password, safe='')}@{host}")
    assert (
        encoded.exit_code != 2 and "percent-encode" not in encoded.stderr
    )  # reaches the server (no password set there)
    assert "Sekr1t" not in encoded.stdout + encoded.stderr


def start_rebuild(target, tmp_path, *extra: str, env: dict | None = None):
    """A slow rebuild (server path, 20,000 items/s; ``extra`` options added) in its own process;
    returns once it loads."""
    import os
    import subprocess
    import sys
    import time

    from bloomctl.lifecycle.metadata import read_metadata

    csv = tmp_path / "big.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(400_000)))
    args = ["--from-csv", str(csv), "-c", "1M", "-e", "1%", "--build", "server", "--max-rate", "20000", "--swap"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bloomctl", "--url", target.url, "rebuild", "users", *args, *extra, "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    family = KeyFamily.of("users")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if (
            target.client.exists(family.standby)
            and read_metadata(target.client, family.standby_meta).get("state") == "loading"
        ):
            time.sleep(0.3)
            return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(proc.communicate())


@pytest.mark.parametrize(
    "signals, code", [(["SIGTERM"], 143), (["SIGINT", "SIGINT"], 130), (["SIGTERM", "SIGTERM"], 143)]
)
def test_sigterm_and_a_double_ctrl_c_stop_cleanly(target, tmp_path, signals, code):
    """(9) SIGTERM killed the run silently (no line, the lock held ~30 s, the standby `loading`, a
    retry exited 6); a double Ctrl-C also left the lock held. Now: one line, the lock released, the
    standby marked `interrupted` (never swapped), exit 143 (130 for Ctrl-C); a retry runs."""
    import signal
    import time

    from bloomctl.lifecycle.metadata import read_metadata

    target.reserve("users", 10_000)
    target.add("users", ["user:0"])
    proc = start_rebuild(target, tmp_path)
    for name in signals:
        proc.send_signal(getattr(signal, name))
        time.sleep(0.05)
    _out, err = proc.communicate(timeout=30)
    lines = [line for line in err.decode().splitlines() if line.startswith("bloomctl: error")]
    assert proc.returncode == code and len(lines) == 1, err.decode()
    assert ("terminated (SIGTERM)" if code == 143 else "interrupted") in lines[0]
    assert lines[0].endswith("; the filter's lock is released")  # (said only by a run that took one)
    family = KeyFamily.of("users")
    assert not target.client.exists(family.lock)
    assert read_metadata(target.client, family.standby_meta)["state"] == "interrupted"
    assert target.card("users") == 1  # the active filter as it was
    assert target.cli("swap", "users", "--yes").exit_code == 5  # an interrupted standby is never swapped in


def test_ctrl_c_cancels_the_postgresql_query(target, pg_engine):
    """(9) After Ctrl-C the PostgreSQL query kept running on the server. It is cancelled."""
    import signal

    import sqlalchemy

    query = "SELECT v::text AS v FROM (SELECT 1 AS v, pg_sleep(60) AS pause) AS slow /* bloomctl-cancel-test */"

    def running() -> int:
        with pg_engine.connect() as conn:
            return conn.execute(
                sqlalchemy.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%bloomctl-cancel-test%' AND pid <> pg_backend_pid()"
                )
            ).scalar_one()

    _signal_a_running_query(target, pg_engine, query, running, signal.SIGINT, 130)


def _signal_a_running_query(target, engine, query: str, running, signum: int, code: int) -> float:
    """Starts a rebuild from ``query``, signals it once the query runs on the database server,
    checks the exit code and that the query is gone from the server within 5 s; returns how long
    the exit took."""
    import subprocess
    import sys
    import time

    url = engine.url.render_as_string(hide_password=False)
    command = [sys.executable, "-m", "bloomctl", "--url", target.url, "-q", "rebuild", "users"]
    command += ["--from-sql", query, "--db-url", url, "-c", "100", "-e", "1%"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while running() == 0:
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    started = time.monotonic()
    proc.send_signal(signum)
    _out, err = proc.communicate(timeout=30)
    took = time.monotonic() - started
    assert proc.returncode == code, err.decode()
    deadline = time.monotonic() + 5
    while running():
        assert time.monotonic() < deadline, "the query still runs on the server"
        time.sleep(0.1)
    return took


def test_a_run_that_lost_its_lock_stops_writing_at_once(target, tmp_path):
    """(10) A rebuild whose lock was taken kept writing into its successor's standby (all 400,000
    items here). It looks at the lock on the server before each batch at most every 0.1 s and
    stops (exit 5, "lost the lock"): the successor's standby gets at most the batches of that
    tenth of a second (a lock that expired for want of renewals stops it before anyone can take it)."""
    import time

    from bloomctl.backends import get
    from bloomctl.sizing.bloom import plan as make_plan

    proc = start_rebuild(target, tmp_path, "--batch-size", "1000", "--window", "1")
    family = KeyFamily.of("users")
    target.client.set(family.lock, json.dumps({"token": "successor", "command": "another run"}), px=60_000)
    target.client.unlink(family.standby)  # the successor's new, empty standby
    backend = get(target.backend.name)
    backend.reserve(target.client, family.standby, make_plan(1_000_000, 0.01, None if backend.name == "bitmap" else 2))
    started = time.monotonic()
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 5 and "lost the lock" in err.decode(), err.decode()
    assert time.monotonic() - started < 5
    time.sleep(0.2)
    assert target.card(family.standby) <= 3000  # 0.1 s at 20,000 items/s, and the batch in flight


def test_rediss_to_a_plain_server_says_so_within_the_connect_timeout(cli_plain, plain):
    """(11, 16) `rediss://` against a plain server waited the full --timeout despite
    --connect-timeout 2. The TLS handshake is bounded by --connect-timeout and says what is wrong."""
    import time

    host = plain.url.split("//", 1)[1]
    started = time.monotonic()
    result = cli_plain("--connect-timeout", "1", "--timeout", "20", "info", "users", url=f"rediss://{host}")
    assert result.exit_code == 3 and "plain (non-TLS) Redis? then use a redis:// URL" in result.stderr, result.stderr
    assert time.monotonic() - started < 3


@pytest.mark.cluster
def test_a_stopped_cluster_master_costs_the_timeout_not_ten_times_it(cluster, cli):
    """(11) With a stopped Cluster master, `--timeout 3` took 33 s for `info` and 56 s for a sharded
    swap: redis-py retried 10 times. bloomctl does not retry: the command fails within --timeout."""
    import os
    import signal
    import time

    import redis

    assert cli("reserve", "users", "-c", "1000", "-e", "1%", "--backend", "bitmap", url=cluster.url).exit_code == 0
    seed = redis.RedisCluster.from_url(cluster.url)
    port = seed.get_node_from_key("users").port
    seed.close()
    victim = next(node for node in cluster.nodes if node.port == port)
    os.kill(victim.process.pid, signal.SIGSTOP)
    try:
        seed_url = next(node.url for node in cluster.nodes if node.port != port)
        started = time.monotonic()
        result = cli("--timeout", "1", "info", "users", url=seed_url)
        assert result.exit_code == 3 and "timed out" in result.stderr, result.stderr
        assert time.monotonic() - started < 4
    finally:
        os.kill(victim.process.pid, signal.SIGCONT)


@pytest.mark.parametrize("redirect", ["<&-", ">&-", "<&- >&-"])
def test_closed_standard_streams_give_no_traceback(plain, redirect):
    """(12) A closed stdin (`<&-`) gave exit 70 and an AttributeError."""
    import shlex
    import subprocess
    import sys

    command = f"{shlex.quote(sys.executable)} -m bloomctl --url {plain.url} swap users {redirect}"
    proc = subprocess.run(["bash", "-c", command], stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 5 and "Traceback" not in proc.stderr and "does not exist" in proc.stderr, proc.stderr


def test_a_url_database_must_be_a_number(cli_plain, plain):
    """(12) `redis://host/notadb` silently used database 0."""
    result = cli_plain("info", "users", url=plain.url.rsplit("/", 1)[0] + "/notadb")
    assert result.exit_code == 2 and "'notadb': a database is a number" in result.stderr
    assert cli_plain("info", "users", url=plain.url.rsplit("/", 1)[0] + "/3").exit_code == 5  # db 3: no such filter


def test_a_bad_client_key_file_is_named(cli_plain, plain, tmp_path):
    """(12) A bad client key file gave "Error 524297 PEM lib" (exit 3): now the file, exit 2."""
    bad = tmp_path / "client.key"
    bad.write_text("not a key\n")
    host = plain.url.split("//", 1)[1]
    result = cli_plain("--tls-cert", str(bad), "--tls-key", str(bad), "info", "users", url=f"rediss://{host}")
    assert result.exit_code == 2 and repr(str(bad)) in result.stderr and "524297" not in result.stderr, result.stderr


TIMESTAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "


def test_json_logs_make_every_stderr_line_json_the_error_included(target, tmp_path):
    """(13) `--log-format json`: every stderr line is one JSON object, the failure's line too (with
    its exit code); text log lines start with a UTC timestamp."""
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(500)))
    ok = target.cli(
        "--log-format", "json", "rebuild", "users", "--from-csv", str(csv), "-c", "1000", "-e", "1%", "--swap"
    )
    assert ok.exit_code == 0, ok.stderr
    records = [json.loads(line) for line in ok.stderr.splitlines()]
    assert records and {r["level"] for r in records} <= {"info", "warning"}
    assert all(r["time"].endswith("Z") and r["message"] for r in records)
    assert any(r.get("phase") == "swap" for r in records)
    failed = target.cli("--log-format", "json", "info", "nope")
    (line,) = failed.stderr.splitlines()
    assert json.loads(line)["level"] == "error" and json.loads(line)["exit_code"] == 5 == failed.exit_code
    text = target.cli("rebuild", "users", "--from-csv", str(csv), "--swap")
    assert text.exit_code == 0 and text.stderr.splitlines()
    assert all(re.match(TIMESTAMP, line) for line in text.stderr.splitlines()), text.stderr


def test_a_failure_with_format_json_prints_a_json_error_object(target):
    """(13) With `--format json` a failed command also prints a JSON error object on stdout (a
    script reading stdout got nothing); without an explicit --format stdout stays empty."""
    failed = target.cli("info", "nope", "--format", "json")
    assert failed.exit_code == 5
    assert json.loads(failed.stdout) == {
        "error": {"message": "filter 'nope' does not exist", "exit_code": 5, "kind": "error"}
    }
    assert failed.stderr == "bloomctl: error: filter 'nope' does not exist\n"
    assert target.cli("info", "nope").stdout == ""
    usage = target.cli("reserve", "x", "-c", "0", "-e", "1%", "--format", "json")
    assert usage.exit_code == 2 and json.loads(usage.stdout)["error"]["exit_code"] == 2


def test_quiet_log_format_verbose_and_debug_are_global(target, tmp_path):
    """(13) `--quiet`, `--log-format`, `-v` and `--debug` come before any command."""
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(500)))
    args = ["rebuild", "users", "--from-csv", str(csv), "-c", "1000", "-e", "1%", "--swap"]
    quiet = target.cli("-q", *args)
    assert quiet.exit_code == 0 and quiet.stderr == "" and "swapped" in quiet.stdout
    normal = target.cli(*args)
    verbose = target.cli("-v", *args)
    assert "debug: connected to" not in normal.stderr
    assert re.search(TIMESTAMP + "debug: connected to redis://", verbose.stderr), verbose.stderr
    assert "debug: holding the lock '{users}:lock'" in verbose.stderr
    assert len(verbose.stderr.splitlines()) > len(normal.stderr.splitlines())
    debug = target.cli("--debug", "info", "nope")
    assert "Traceback (most recent call last)" in debug.stderr and debug.stderr.endswith(
        "bloomctl: error: filter 'nope' does not exist\n"
    )
    assert "Traceback" not in target.cli("info", "nope").stderr
    assert target.cli("-q", "info", "nope").stderr == "bloomctl: error: filter 'nope' does not exist\n"


def _on_a_terminal(args: list[str], env: dict[str, str]) -> str:
    """Runs bloomctl with stdout on a pseudo-terminal (rich colours only for a terminal)."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bloomctl", *args],
        stdout=follower,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "100", **env},
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=30)
    os.close(leader)
    assert proc.returncode == 0, proc.stderr.read()
    return b"".join(chunks).decode()


def test_no_color_means_no_colour_and_no_bold(target):
    """(13) NO_COLOR was ignored (and bold stayed): no escape sequence at all when it is set."""
    target.reserve("users", 10_000)
    args = ["--url", target.url, "info", "users", "--format", "table"]
    env = {"NO_COLOR": "", "TERM": "xterm-256color", "BLOOMCTL_URL": "", "BLOOMCTL_PASSWORD": ""}
    coloured = _on_a_terminal(args, env)
    assert "\x1b[" in coloured  # the check below can fail: a terminal gets escapes by default
    plain = _on_a_terminal(args, {**env, "NO_COLOR": "1"})
    assert "\x1b[" not in plain and "reserved capacity" in plain


def test_plan_and_reserve_print_json_when_piped(target):
    """(13) `plan` and `reserve` printed tables into a pipe (`info` printed JSON)."""
    planned = target.cli("plan", "-c", "1M", "-e", "1%")
    assert json.loads(planned.stdout)["size_bytes"] > 0
    reserved = target.cli("reserve", "users", "-c", "1000", "-e", "1%")
    assert reserved.exit_code == 0 and json.loads(reserved.stdout)["created"] is True
    assert "capacity" in target.cli("plan", "-c", "1M", "-e", "1%", "--format", "text").stdout  # text = table


def test_numbers_are_never_cut_in_a_narrow_terminal(target):
    """(13) On a narrow terminal, table cells wrapped or elided digits ('3,025,928…')."""
    plan_args = ["plan", "-c", "123456789", "-e", "0.000123", "--items", "999999999", "--format", "table"]
    shown = _on_a_terminal(plan_args, {"COLUMNS": "40", "NO_COLOR": "1"})
    for number in ("123,456,789", "987,654,312", "3,025,928,872", "5,428,715,000", "311,449,768"):
        assert number in shown, shown
    assert "…" not in shown
    target.reserve("a-rather-long-filter-name:users:2026", 123_456)
    info_args = ["--url", target.url, "info", "a-rather-long-filter-name:users:2026", "--format", "table"]
    shown = _on_a_terminal(info_args, {"COLUMNS": "40", "NO_COLOR": "1", "BLOOMCTL_URL": ""})
    assert "123,456" in shown and "…" not in shown, shown


def test_one_false_positive_notation(target):
    """(13) FPRs were printed as 0.0073, 7.30e-05 and 0.73% by different commands: text shows a
    percentage with four significant digits everywhere, JSON a fraction."""
    target.reserve("users", 10_000)
    target.add("users", [f"user:{i}" for i in range(5000)])
    info = target.cli("info", "users", "--format", "table").stdout
    fill = target.cli("fill-ratio", "users", "--format", "text").stdout
    planned = target.cli("plan", "-c", "10000", "-e", "1%", "--items", "30000", "--format", "table").stdout
    tiny = target.cli("plan", "-c", "10000", "-e", "0.0001%", "--items", "30000", "--format", "table").stdout
    rates = re.findall(r"estimated FPR now\s+(\S+)", info) + re.findall(r"fpr=(\S+)", fill)
    rates += re.findall(r"compound false-positive rate\s+(\S+)", planned + tiny)
    assert len(rates) == 4 and all(re.fullmatch(r"\d+(\.\d+)?%", r) for r in rates), rates
    assert all(len(re.sub(r"\D|^0+|\.", "", r.lstrip("0.").rstrip("%"))) <= 4 for r in rates), rates
    as_json = json.loads(target.cli("info", "users", "--format", "json").stdout)
    assert 0 < as_json["estimated_fpr"] < 0.01


def test_metadata_is_typed_in_json_with_a_schema_version(target):
    """(13) `info --format json` gave every metadata value as a string ("capacity": "10000")."""
    assert target.cli("reserve", "users", "-c", "10000", "-e", "1%").exit_code == 0
    meta = json.loads(target.cli("info", "users", "--format", "json").stdout)["metadata"]
    assert meta["schema"] == 1
    assert meta["capacity"] == 10000 and isinstance(meta["capacity"], int)
    assert meta["error_rate"] == 0.01 and isinstance(meta["error_rate"], float)


def _families(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def test_prometheus_thresholds_are_per_key_and_ratios_end_in_ratio(target, tmp_path):
    """(14) Two textfiles for two keys emitted conflicting `bloomctl_fill_ratio_threshold{level}`
    series (no key label); ratios were not named `_ratio`."""
    for key in ("a", "b"):
        target.reserve(key, 1000)
    first = _families(target.cli("fill-ratio", "a", "--max", "0.9", "--format", "prometheus").stdout)
    second = _families(target.cli("fill-ratio", "b", "--max", "0.5", "--format", "prometheus").stdout)
    series = {
        (tuple(sorted(s.labels.items())), s.value)
        for families in (first, second)
        for s in families["bloomctl_fill_threshold_ratio"].samples
    }
    labels = {labels for labels, _value in series}
    assert len(labels) == len(series) == 4  # no two files write the same series
    assert ((("key", "b"), ("level", "max")), 0.5) in series
    ratios = [name for name in first if "fpr" in name or "fill" in name]
    assert ratios and all(name.endswith("_ratio") for name in ratios), ratios
    assert "bloomctl_estimated_false_positive_ratio" in first


def test_fill_ratio_output_is_atomic_with_exit_code_and_last_success(target, tmp_path):
    """(14) `--output FILE` renames a complete file into place; it carries the exit code and
    `bloomctl_last_success_timestamp_seconds`, which a failed run keeps from the file it replaces."""
    import os
    import time

    target.reserve("a", 1000)
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    out = textfile / "bloomctl.prom"
    before = time.time()
    ok = target.cli("fill-ratio", "a", "--format", "prometheus", "--output", str(out))
    assert ok.exit_code == 0 and ok.stdout == ""
    families = _families(out.read_text())
    (success,) = families["bloomctl_last_success_timestamp_seconds"].samples
    assert success.labels == {"command": "fill-ratio"} and before <= success.value <= time.time()
    assert families["bloomctl_fill_ratio_exit_code"].samples[0].value == 0
    assert oct(os.stat(out).st_mode & 0o777) == "0o644"
    inode = os.stat(out).st_ino
    missing = target.cli("fill-ratio", "a", "nope", "--format", "prometheus", "--output", str(out))
    assert missing.exit_code == 5
    families = _families(out.read_text())
    assert families["bloomctl_fill_ratio_exit_code"].samples[0].value == 5
    assert families["bloomctl_last_success_timestamp_seconds"].samples[0].value == success.value  # kept
    assert os.stat(out).st_ino != inode  # a new file renamed over the old one, not rewritten in place
    assert sorted(os.listdir(textfile)) == ["bloomctl.prom"]  # no temporary file left behind
    down = target.cli("fill-ratio", "a", "--format", "prometheus", "--output", str(out), url="redis://127.0.0.1:1/0")
    assert down.exit_code == 3
    families = _families(out.read_text())
    assert families["bloomctl_fill_ratio_exit_code"].samples[0].value == 3
    assert families["bloomctl_last_success_timestamp_seconds"].samples[0].value == success.value
    nowhere = target.cli("fill-ratio", "a", "--output", str(tmp_path / "no" / "such" / "dir.prom"))
    assert nowhere.exit_code == 2 and "does not exist" in nowhere.stderr
    text = target.cli("fill-ratio", "a", "--format", "json", "--output", str(tmp_path / "a.json"))
    assert text.exit_code == 0 and json.loads((tmp_path / "a.json").read_text())["filters"][0]["key"] == "a"


def test_rebuild_metrics_file_says_duration_items_and_result(target, tmp_path):
    """(14) `rebuild --metrics-file` (cron and Kubernetes had to echo their own exit code into a
    file): duration, items, exit code, swapped and the last success, also when the run fails."""
    import time

    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(700)))
    metrics = tmp_path / "rebuild-users.prom"
    args = ["rebuild", "users", "--from-csv", str(csv), "-c", "1000", "-e", "1%", "--swap"]
    before = time.time()
    ok = target.cli(*args, "--metrics-file", str(metrics))
    assert ok.exit_code == 0, ok.stderr
    families = _families(metrics.read_text())
    value = {name: f.samples[0].value for name, f in families.items()}
    assert all(f.samples[0].labels["key"] == "users" for f in families.values())
    assert value["bloomctl_rebuild_items"] == 700 and value["bloomctl_rebuild_exit_code"] == 0
    assert value["bloomctl_rebuild_success"] == 1 and value["bloomctl_rebuild_swapped"] == 1
    assert 0 < value["bloomctl_rebuild_duration_seconds"] < 60
    assert before <= value["bloomctl_last_success_timestamp_seconds"] <= time.time()
    missing = target.cli(
        *[a if a != str(csv) else str(tmp_path / "gone.csv") for a in args], "--metrics-file", str(metrics)
    )
    assert missing.exit_code == 8
    failed = {name: f.samples[0].value for name, f in _families(metrics.read_text()).items()}
    assert failed["bloomctl_rebuild_exit_code"] == 8 and failed["bloomctl_rebuild_success"] == 0
    assert failed["bloomctl_rebuild_swapped"] == 0
    assert failed["bloomctl_last_success_timestamp_seconds"] == value["bloomctl_last_success_timestamp_seconds"]
    no_db = target.cli(
        "rebuild", "users", "--from-sql", "SELECT 1", "--metrics-file", str(metrics), env={"BLOOMCTL_DB_URL": ""}
    )
    assert no_db.exit_code == 2  # refused while opening the source: the file says so too
    assert _families(metrics.read_text())["bloomctl_rebuild_exit_code"].samples[0].value == 2
    nowhere = target.cli(*args, "--metrics-file", str(tmp_path / "none" / "x.prom"))
    assert nowhere.exit_code == 2 and "does not exist" in nowhere.stderr and target.card("users") == 700


def test_a_swap_keeps_the_replaced_filter_for_rollback_by_default(target):
    """(15) The replaced filter was unlinked unless --keep-old was given: a bad swap could not be
    rolled back. It is kept for an hour by default; `--keep-old 0` drops it."""
    active_and_small_standby(target, active_items=1000, standby_items=900)
    swapped = target.cli("swap", "users", "--yes")
    assert swapped.exit_code == 0, swapped.stderr
    old = KeyFamily.of("users").old
    assert target.card(old) == 1000 and 3500 < target.client.ttl(old) <= 3600
    assert target.cli("rollback", "users", "--yes").exit_code == 0 and target.card("users") == 1000
    again = target.cli("swap", "users", "--yes", "--keep-old", "0")  # the rolled-back filter is the standby
    assert again.exit_code == 0 and target.card("users") == 900 and not target.client.exists(old)


def test_dry_runs_check_everything_and_change_nothing(target):
    """(15) `--dry-run` on swap and rollback: every check of the real command (the lock, the shrink
    guard), and nothing written."""
    active_and_small_standby(target, active_items=1000, standby_items=900)

    def snapshot() -> dict:
        return {k: target.client.dump(k) for k in target.client.scan_iter(count=1000)}

    before = snapshot()
    dry = target.cli("swap", "users", "--dry-run", "--format", "json")
    assert dry.exit_code == 0, dry.stderr
    data = json.loads(dry.stdout)
    assert data["dry_run"] is True and data["swapped"] is False and data["items"] == 900
    assert data["previous_items"] == 1000
    assert "dry run: would swap" in target.cli("swap", "users", "--dry-run", "--format", "text").stdout
    assert snapshot() == before
    shrink = target.cli("swap", "users", "--dry-run", "--min-ratio", "0.95")
    assert shrink.exit_code == 5 and "--allow-shrink" in shrink.stderr  # the real guard, refused
    target.client.set(KeyFamily.of("users").lock, json.dumps({"token": "t", "command": "bloomctl rebuild"}))
    locked = target.cli("swap", "users", "--dry-run")
    assert locked.exit_code == 6 and "locked by" in locked.stderr
    target.client.delete(KeyFamily.of("users").lock)
    no_old = target.cli("rollback", "users", "--dry-run")
    assert no_old.exit_code == 5 and "no old filter" in no_old.stderr
    assert snapshot() == before
    assert target.cli("swap", "users", "--yes").exit_code == 0
    before = snapshot()
    target.client.delete(KeyFamily.of("users").standby)  # (there is none after a swap; rollback needs none)
    rolled = target.cli("rollback", "users", "--dry-run", "--format", "text")
    assert rolled.exit_code == 0 and "dry run: would roll" in rolled.stdout, rolled.stderr
    assert snapshot() == before and target.card("users") == 900


def test_functions_install_dry_run_loads_nothing(cli_plain, plain):
    """(15) `functions install --dry-run` says which primaries would get the library."""
    client = plain.client()
    client.execute_command("FUNCTION", "FLUSH")
    dry = cli_plain("functions", "install", "--dry-run", "--format", "json")
    assert dry.exit_code == 0 and json.loads(dry.stdout)["would_load"], dry.stdout
    assert client.execute_command("FUNCTION", "LIST") == []
    assert cli_plain("functions", "install").exit_code == 0
    text = cli_plain("functions", "install", "--dry-run", "--format", "text")
    assert "every primary has the current library" in text.stdout


def test_lock_wait_waits_for_the_holder(target):
    """(15) A swap during a rebuild exited 6 at once; `--lock-wait SECONDS` waits for the lock
    (and still exits 6, naming the holder, when it is not released in time)."""
    import threading
    import time

    active_and_small_standby(target, active_items=1000, standby_items=900)
    lock = KeyFamily.of("users").lock
    holder = json.dumps({"token": "t", "command": "bloomctl rebuild", "host": "h", "pid": 1})
    target.client.set(lock, holder, px=30_000)
    started = time.monotonic()
    waited = target.cli("swap", "users", "--yes", "--lock-wait", "0.5")
    assert waited.exit_code == 6 and "waited 0.5s" in waited.stderr
    assert 0.4 < time.monotonic() - started < 3
    assert "--lock-wait" in target.cli("swap", "users", "--yes").stderr  # the hint, when not waiting
    threading.Timer(0.6, lambda: target.client.delete(lock)).start()
    started = time.monotonic()
    swapped = target.cli("swap", "users", "--yes", "--lock-wait", "10")
    assert swapped.exit_code == 0, swapped.stderr
    assert 0.5 < time.monotonic() - started < 5 and target.card("users") == 900


def test_redis_cli_style_addresses(target, plain):
    """(16) `-h HOST -p PORT` as in redis-cli, and a bare `host:port` URL; the password and the
    database of the URL are kept; a unix socket URL takes no port."""
    from bloomctl.server.connection import settings_from

    target.reserve("users", 1000)
    host, port = target.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    wrong = f"redis://127.0.0.1:{plain.port + 1 if plain.port < 65535 else 1}/0"  # nothing there
    by_flags = target.cli("-h", host, "-p", port, "info", "users", "--format", "json", url=wrong)
    assert by_flags.exit_code == 0 and json.loads(by_flags.stdout)["key"] == "users", by_flags.stderr
    bare = target.cli("info", "users", "--format", "json", url=f"{host}:{port}")
    assert bare.exit_code == 0, bare.stderr
    settings = settings_from("redis://ann:s3cret@db.example:6380/4?ssl_cert_reqs=none", host="10.0.0.9", port=7000)
    assert settings.url == "redis://ann:s3cret@10.0.0.9:7000/4?ssl_cert_reqs=none"
    assert settings_from("rediss://db.example/2", port=6390).url == "rediss://db.example:6390/2"
    assert settings_from("redis://x", host="::1").url == "redis://[::1]:6379"
    unix = target.cli("-p", "7000", "info", "users", url="unix:///tmp/redis.sock")
    assert unix.exit_code == 2 and "unix://" in unix.stderr
    help_alone = target.cli("-h")
    assert help_alone.exit_code == 0 and "--host" in help_alone.stdout


def test_bloomctl_alone_prints_a_short_usage(cli):
    """(16) `bloomctl` alone was an error (exit 2, the whole help on stderr)."""
    result = cli()
    assert result.exit_code == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Usage: ") and "COMMAND" in lines[0] and len(lines) <= 4
    assert "rebuild" in result.stdout and "--help" in result.stdout


def test_a_typo_in_a_filter_name_gets_a_suggestion(target):
    """(16) `info user` when `users` exists said only "does not exist"."""
    target.reserve("users", 1000)
    target.reserve("orders", 1000)
    target.client.set("user_session", "a plain string: not a filter")
    for args in (["info", "user"], ["swap", "user", "--yes"], ["rollback", "user", "--yes"]):
        result = target.cli(*args)
        assert result.exit_code == 5 and "did you mean 'users'?" in result.stderr, (args, result.stderr)
        assert "user_session" not in result.stderr
    fill = target.cli("fill-ratio", "user", "--format", "text")
    assert fill.exit_code == 5 and "did you mean 'users'?" in fill.stdout
    far = target.cli("info", "inventory")
    assert far.exit_code == 5 and "did you mean" not in far.stderr


def test_a_hash_is_reported_as_not_a_filter(target):
    """(16) A key holding a hash was counted with the filters "not found"."""
    target.reserve("users", 1000)
    target.client.hset("profile", "a", "1")
    info = target.cli("info", "profile")
    assert info.exit_code == 5 and "'profile' holds a hash, not a Bloom filter" in info.stderr
    fill = target.cli("fill-ratio", "users", "profile", "nope", "--format", "text")
    assert fill.exit_code == 5
    assert "2 of 3 are not filters (not found: nope; not a filter: profile)" in fill.stderr


def test_a_postgres_url_is_accepted(target, pg_engine):
    """(16) `postgres://` (libpq's and many platforms' spelling) was refused by SQLAlchemy."""
    from tests.fixtures.sql import PG_URL

    url = "postgres://" + PG_URL.split("://", 1)[1]
    result = _rebuild_from_a_pg_table(target, pg_engine, "hardening_pg_scheme", 300, url)
    assert result.exit_code == 0, result.stderr
    assert target.card("users") == 300


def _rebuild_from_a_pg_table(target, pg_engine, table: str, rows: int, url: str):
    """A table of ``rows`` ids ('u1'...), and `rebuild users --swap` from it through ``url``."""
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        conn.exec_driver_sql(f"CREATE TABLE {table} (id text)")
        conn.exec_driver_sql(f"INSERT INTO {table} SELECT 'u' || g FROM generate_series(1, {rows}) g")
    query = f"SELECT id FROM {table}"
    return target.cli("rebuild", "users", "--from-sql", query, "--db-url", url, "-c", "1000", "-e", "1%", "--swap")


def test_a_sharded_dry_run_swap_changes_nothing(target, tmp_path):
    """(15) `swap --dry-run` on a sharded filter checks every member's standby and swaps none."""
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(900)))
    args = ["rebuild", "users", "--from-csv", str(csv), "-c", "3000", "-e", "1%", "--shards", "3"]
    if target.backend.name == "bitmap":
        args.append("--nonscaling")
    assert target.cli(*args, "--swap").exit_code == 0
    assert target.cli(*args).exit_code == 0  # the standbys, not swapped

    def snapshot() -> dict:
        return {k: target.client.dump(k) for k in target.client.scan_iter(count=1000)}

    before = snapshot()
    dry = target.cli("swap", "users", "--dry-run", "--format", "text")
    assert dry.exit_code == 0 and "dry run: would swap 3 of 3 shards" in dry.stdout, dry.stdout + dry.stderr
    assert snapshot() == before
    assert target.cli("swap", "users", "--yes").exit_code == 0 and snapshot() != before


def test_memory_running_out_during_a_sharded_swap_keeps_the_pending_standbys(target, tmp_path, monkeypatch):
    """(2, review) A sharded `rebuild --swap` that hit maxmemory after its first member was swapped
    deleted the other members' verified standbys (no way to finish or roll back) and said nothing
    was swapped. The memory discard covers the load and the verification only."""
    import bloomctl.lifecycle.sharded as sharded

    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(900)))
    args = ["rebuild", "users", "--from-csv", str(csv), "-c", "3000", "-e", "1%", "--shards", "3", "--swap"]
    if target.backend.name == "bitmap":
        args.append("--nonscaling")
    assert target.cli(*args).exit_code == 0
    original, calls = sharded.swap_under, []
    nodes = [target.client] if not target.cluster else list(target.client.get_primaries())

    def swap_then_fill_up(*a, **k):
        out = original(*a, **k)
        calls.append(1)
        if len(calls) == 1:  # another writer takes the server over maxmemory after the first member
            for node in nodes:
                (node if not target.cluster else target.client.get_redis_connection(node)).config_set("maxmemory", "1")
        return out

    monkeypatch.setattr(sharded, "swap_under", swap_then_fill_up)
    try:
        stopped = target.cli(*args)
    finally:
        for node in nodes:
            (node if not target.cluster else target.client.get_redis_connection(node)).config_set("maxmemory", "0")
    assert stopped.exit_code != 0 and "was removed" not in stopped.stderr, stopped.stderr
    monkeypatch.setattr(sharded, "swap_under", original)
    finished = target.cli("swap", "users", "--yes")
    assert finished.exit_code == 0, finished.stderr


def test_a_swap_refuses_a_bitmap_standby_filled_past_its_capacity(target):
    """(3, review) Dual writes kept filling a bitmap standby after the rebuild's count; `swap` then
    put it in place at 3.3x its capacity (an FPR of 52%). Only the rebuild checked the fill."""
    if target.backend.name != "bitmap":
        pytest.skip("only filters that never grow: RedisBloom's NONSCALING refuses items past capacity itself")
    active_and_small_standby(target, active_items=1000, standby_items=900)
    standby = KeyFamily.of("users").standby
    target.add(standby, [f"late:{i}" for i in range(10_000)])  # the application's dual writes
    refused = target.cli("swap", "users", "--yes")
    assert refused.exit_code == 5 and "over its capacity of 10,000" in refused.stderr, refused.stderr
    assert target.card("users") == 1000


def test_the_suggestion_is_bounded_and_never_in_the_library(target):
    """(16, review) "Did you mean" walked the whole keyspace (3M keys: 3,009 SCAN calls, 11 s),
    also inside the library's Filter.exists on a missing filter. Now: the command line only, at
    most 10 SCAN calls per primary and type."""
    if target.cluster:
        pytest.skip("SCAN calls are counted on one server")
    from bloomctl import open_filter
    from bloomctl.errors import KeyMissing

    target.reserve("users", 1000)
    few = target.cli("fill-ratio", "userz", "usrs", "--format", "text")  # a small keyspace: found
    assert few.exit_code == 5 and few.stdout.count("did you mean 'users'?") == 2
    for chunk in range(60):  # 60,000 strings: like most keyspaces, far more than the look may read
        target.client.mset({f"noise:{chunk}:{i}": "x" for i in range(1000)})

    def scans() -> int:
        return int(target.client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))

    before = scans()
    with pytest.raises(KeyMissing):
        open_filter(target.client, "userz").exists("x")
    assert scans() == before  # the application's path: no scan at all
    result = target.cli("info", "userz")
    assert result.exit_code == 5
    assert 0 < scans() - before <= 2 * 10  # RedisBloom's type, then strings: 10 calls each at most
    before = scans()
    fill = target.cli("fill-ratio", "userz", "usrs", "userss", "--format", "text")
    assert fill.exit_code == 5
    assert scans() - before <= 2 * 10  # one look for every missing name (a look each took 3 x 20)


def test_a_foreign_hash_with_a_field_named_like_ours_is_not_taken_for_metadata(target, tmp_path):
    """(5, review) A hash at `{k}:meta` with a generic field (`state`, `schema`) was taken for
    bloomctl's metadata and overwritten by `rebuild --swap`. Metadata is recognised by created_by."""
    target.reserve("users", 1000)
    meta = KeyFamily.of("users").meta
    target.client.delete(meta)
    target.client.hset(meta, mapping={"state": "active", "owner": "billing-service", "schema": "v2"})
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(700)))
    result = target.cli("rebuild", "users", "--from-csv", str(csv), "-c", "2000", "-e", "1%", "--swap")
    assert result.exit_code == 5 and "did not write" in result.stderr, result.stderr
    assert target.client.hgetall(meta) == {b"state": b"active", b"owner": b"billing-service", b"schema": b"v2"}


def test_a_dry_run_swap_loads_no_function_library(target):
    """(15, review) `swap --dry-run` on a bitmap filter loaded the function library (FUNCTION LOAD:
    a write, replicated) to count the standby's items. It uses the script cache instead."""
    if target.backend.name != "bitmap":
        pytest.skip("the function library is the bitmap backend's")
    active_and_small_standby(target, active_items=1000, standby_items=900)
    nodes = (
        [target.client.get_redis_connection(n) for n in target.client.get_primaries()]
        if target.cluster
        else [target.client]
    )
    for node in nodes:
        node.execute_command("FUNCTION", "FLUSH")
    dry = target.cli("swap", "users", "--dry-run", "--format", "json")
    assert dry.exit_code == 0 and json.loads(dry.stdout)["items"] == 900, dry.stderr
    assert all(node.execute_command("FUNCTION", "LIST") == [] for node in nodes)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_the_library_refuses_a_lock_wait_that_never_ends(target, bad):
    """(1, 15, review) `lifecycle.swap(..., lock_wait=nan)` waited for ever on a held lock."""
    active_and_small_standby(target, active_items=1000, standby_items=900)
    target.client.set(KeyFamily.of("users").lock, json.dumps({"token": "t"}), px=30_000)
    server = detect(target.client)
    with pytest.raises(UsageError, match="lock_wait"):
        lifecycle.swap(target.client, server, "users", lock_wait=bad)
    with pytest.raises(UsageError, match="lock_wait"):
        lifecycle.rollback(target.client, "users", lock_wait=bad)


def test_a_database_password_never_shows_and_may_hold_any_character(target, pg_engine):
    """(8, review) A PostgreSQL password with a space failed on the ADBC and COPY paths (libpq
    refused the URI) and its percent-encoded form showed in the error; an unencoded @ showed a
    part of it."""
    from tests.fixtures.sql import PG_URL

    user_host = PG_URL.split("://", 1)[1].split("@", 1)
    url = f"postgresql://{user_host[0]}:p%40ss%2Fw%3Frd%231%20x@{user_host[1]}"  # p@ss/w?rd#1 x (trust auth)
    ok = _rebuild_from_a_pg_table(target, pg_engine, "hardening_pw", 200, url)
    assert ok.exit_code == 0, ok.stderr
    bad = target.cli("rebuild", "users", "--from-sql", "SELECT id FROM no_such_table_here", "--db-url", url)
    assert bad.exit_code == 8
    broken = target.cli(
        "--log-format",
        "json",
        "rebuild",
        "users",
        "--from-sql",
        "SELECT 1",
        "--format",
        "json",
        "--db-url",
        f"postgresql://{user_host[0]}:p@ss@{user_host[1]}",
    )
    assert broken.exit_code == 2
    for result in (ok, bad, broken):
        shown = result.stdout + result.stderr
        for fragment in ("p@ss", "p%40ss", "w?rd", "w%3Frd", "rd#1", "%231", "1 x", "1%20x", "ss@"):
            assert fragment not in shown, (fragment, shown)


def test_sigterm_cancels_the_mysql_query(target, mysql_engine):
    """(9, review) After SIGTERM a MariaDB/MySQL query kept running on the server (PyMySQL has no
    cancel), and the exit took 10 s: bloomctl sends KILL QUERY from a second connection."""
    import signal

    import sqlalchemy

    query = "SELECT 'x' AS v FROM (SELECT 1 AS one) AS t WHERE SLEEP(60) = 0 /* bloomctl-mysql-cancel */"

    def running() -> int:
        with mysql_engine.connect() as conn:
            rows = conn.execute(sqlalchemy.text("SHOW FULL PROCESSLIST")).all()
        return sum(
            1 for row in rows if "bloomctl-mysql-cancel" in str(row[7] or "") and "PROCESSLIST" not in str(row[7])
        )

    assert _signal_a_running_query(target, mysql_engine, query, running, signal.SIGTERM, 143) < 5


SECRET = "s3cr3tPW"


@pytest.mark.parametrize(
    "args",
    [
        ["-h", f"redis://:{SECRET}@localhost:6379", "info", "users"],
        ["-h", f"user:{SECRET}@localhost", "info", "users"],
        ["-h", f"user:{SECRET}", "info", "users"],
        ["--url", f"redis://default:{SECRET}", "info", "users"],
        ["--url", f"redis://:{SECRET}", "info", "users"],
        ["--url", f"user:{SECRET}", "info", "users"],
        ["--url", f"redis://user:{SECRET}", "-p", "6380", "info", "users"],
        ["--url", f"rediss://:{SECRET}@localhost:70x", "info", "users"],
        ["--url", f"rediss://:{SECRET}@localhost:99999", "info", "users"],
        ["--url", f"rediss://user:{SECRET}", "info", "users"],
        ["--url", "redis://[::1:7970", "-p", "7970", "info", "users"],
    ],
)
def test_bad_addresses_are_one_line_without_the_password(cli, args):
    """(8, 12, 16, review) These echoed the password (a URL without '@host', a URL given to -h)
    or crashed with exit 70; in text and JSON logs, and in the JSON error object."""
    for extra in ([], ["--log-format", "json"]):
        result = cli(*extra, *args, "--format", "json")
        assert result.exit_code == 2, (args, result.stdout, result.stderr)
        assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
        assert SECRET not in result.stdout + result.stderr and SECRET[2:-2] not in result.stdout + result.stderr
        assert json.loads(result.stdout)["error"]["exit_code"] == 2
        if extra:
            assert json.loads(result.stderr)["level"] == "error"


def test_option_errors_before_the_command_follow_log_format_json(cli):
    """(13, review) A bad global option (read before the Output exists) gave a text line under
    `--log-format json`; an error rate that underflows crashed (exit 70)."""
    for args in (
        ["--timeout", "nan", "info", "x"],
        ["-p", "70000", "info", "x"],
        ["plan", "-c", "1000", "-e", "5e-324"],
    ):
        result = cli("--log-format", "json", *args)
        assert result.exit_code == 2, result.stderr
        assert json.loads(result.stderr)["exit_code"] == 2


def test_output_files_are_regular_files_only(target, tmp_path, monkeypatch):
    """(14, review) `--output` renamed its file over a FIFO or a device (as root, over /dev/full),
    replaced a symbolic link by a file, wrote a file named '-', and left its temporary file behind
    when a signal came during the write."""
    import os

    from bloomctl.cli import metrics

    target.reserve("users", 1000)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused = target.cli("fill-ratio", "users", "--format", "json", "--output", str(fifo))
    assert refused.exit_code == 2 and "not a regular file" in refused.stderr and fifo.is_fifo()
    real = tmp_path / "real.prom"
    real.write_text("old\n")
    real.chmod(0o640)
    link = tmp_path / "link.prom"
    link.symlink_to(real)
    assert target.cli("fill-ratio", "users", "--format", "prometheus", "--output", str(link)).exit_code == 0
    assert (
        link.is_symlink() and "bloomctl_fill_ratio" in real.read_text() and oct(real.stat().st_mode & 0o777) == "0o640"
    )
    dash = target.cli("fill-ratio", "users", "--format", "json", "--output", "-")
    assert dash.exit_code == 0 and json.loads(dash.stdout)["filters"]
    before = sorted(os.listdir(tmp_path))

    def interrupted(_fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(metrics.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        metrics.write_atomically(str(tmp_path / "new.prom"), "x\n", "--output")
    assert sorted(os.listdir(tmp_path)) == before  # no temporary file, no target


def test_a_failed_metrics_write_keeps_the_runs_own_exit_code(target, tmp_path, monkeypatch):
    """(14, review) When the metrics file could not be written after a failed rebuild, its write
    error replaced the run's own (exit 2 instead of 8, or 143 after SIGTERM)."""
    from bloomctl.cli import metrics
    from bloomctl.errors import UsageError as Refused

    def full_disk(*_args: object) -> None:
        raise Refused("--metrics-file x: cannot write: No space left on device")

    monkeypatch.setattr(metrics, "write_atomically", full_disk)
    result = target.cli(
        "rebuild",
        "users",
        "--from-csv",
        str(tmp_path / "gone.csv"),
        "-c",
        "100",
        "-e",
        "1%",
        "--metrics-file",
        str(tmp_path / "m.prom"),
    )
    assert result.exit_code == 8 and "no metrics written" in result.stderr and "cannot read" in result.stderr


def test_any_failure_of_fill_ratio_updates_its_textfile(target, tmp_path, monkeypatch):
    """(14, review) An error that was not bloomctl's own (a timeout, a command the ACL denies)
    left the previous run's `exit_code 0` in the textfile."""
    import redis

    import bloomctl.lifecycle.fill

    target.reserve("users", 1000)
    out = tmp_path / "f.prom"
    assert target.cli("fill-ratio", "users", "--format", "prometheus", "--output", str(out)).exit_code == 0

    def timed_out(*_args: object, **_kwargs: object) -> None:
        raise redis.exceptions.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(bloomctl.lifecycle.fill, "fill_ratio", timed_out)
    failed = target.cli("fill-ratio", "users", "--format", "prometheus", "--output", str(out))
    assert failed.exit_code == 3
    assert _families(out.read_text())["bloomctl_fill_ratio_exit_code"].samples[0].value == 3


def test_a_zero_max_names_max(cli):
    """(16, review) `fill-ratio --max 0` said "--warn must be positive" (never given)."""
    result = cli("fill-ratio", "users", "--max", "0")
    assert result.exit_code == 2 and "--max must be positive" in result.stderr and "--warn" not in result.stderr


def test_a_rebuild_short_of_memory_names_the_filter_kept_for_rollback(target, tmp_path):
    """(15) With the replaced filter kept an hour by default, a second rebuild within that hour
    may not fit under maxmemory: the refusal says which kept filter holds the memory."""
    if target.cluster:
        pytest.skip("maxmemory set on one server")
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(2000)))
    args = ["rebuild", "users", "--from-csv", str(csv), "-c", "200000", "-e", "0.1%", "--swap"]
    assert target.cli(*args).exit_code == 0
    assert target.cli(*args).exit_code == 0  # the first rebuild's filter is now kept as {users}:old
    used = int(target.client.info("memory")["used_memory"])
    target.client.config_set("maxmemory", str(used + 100_000))  # less than one more filter
    try:
        refused = target.cli(*args)
    finally:
        target.client.config_set("maxmemory", "0")
    assert refused.exit_code == 5, refused.stderr
    assert "still kept for rollback ('{users}:old', expiring in" in refused.stderr
    assert "--keep-old 0" in refused.stderr and target.card("users") == 2000


def test_the_lock_note_belongs_to_one_invocation(target):
    """(9, review) "the filter's lock is released" is said only by a run that took a lock: the flag
    is reset by every invocation (a long-lived caller's earlier run does not leak into the next)."""
    from bloomctl.lifecycle import lock

    active_and_small_standby(target, active_items=1000, standby_items=900)
    assert target.cli("swap", "users", "--yes").exit_code == 0 and lock.TAKEN[0]
    assert target.cli("info", "users").exit_code == 0 and not lock.TAKEN[0]
