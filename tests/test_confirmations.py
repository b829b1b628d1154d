"""(#23 item 8) One rule for asking: every command that replaces or creates what applications read
asks on a terminal (unless --yes) and never without one; restore, copy and window create have a
--dry-run that writes nothing.

Before: `swap` and `rollback` asked; `restore --swap`, `copy --swap`, `rebuild --swap`, `reserve`
and `apply` went ahead on a terminal without a word, and restore and copy had no --dry-run.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bloomctl.keys import KeyFamily
from tests.helpers.redis import snapshot
from tests.servers import RedisServer

CSV = "id\n" + "".join(f"user:{i}\n" for i in range(300))


@pytest.fixture
def terminal(monkeypatch):
    """stdin is a terminal (CliRunner's input is not): the prompt reads CliRunner's input."""
    import bloomctl.cli.confirm as confirm

    monkeypatch.setattr(confirm, "stdin_is_tty", lambda: True)


@pytest.fixture
def second(workdir):
    server = RedisServer(workdir)
    yield server
    server.stop()


@pytest.fixture
def dumped(cli_plain, plain, tmp_path) -> Path:
    """'users' with 300 items, and a dump of it."""
    source = tmp_path / "u.csv"
    source.write_text(CSV)
    built = cli_plain("rebuild", "users", "--from-csv", str(source), "-c", "1000", "-e", "0.01", "--swap", "--yes")
    assert built.exit_code == 0, built.stderr
    path = tmp_path / "users.bfdump"
    assert cli_plain("dump", "users", "-o", str(path)).exit_code == 0
    return path


def _no_then_yes(run, client, changed) -> None:
    """On a terminal: "n" changes nothing (exit 5), "y" goes ahead."""
    before = snapshot(client)
    refused = run(input="n\n")
    assert refused.exit_code == 5 and "not confirmed" in refused.stderr, refused.stderr
    assert "[y/N]" in refused.stderr
    if changed is None:
        assert snapshot(client) == before
    done = run(input="y\n")
    assert done.exit_code == 0, done.stderr
    assert changed is None or changed()


@pytest.mark.usefixtures("terminal")
def test_reserve_asks_on_a_terminal(cli_plain, plain):
    client = plain.client()
    _no_then_yes(lambda **kw: cli_plain("reserve", "users", "-c", "1000", "-e", "0.01", **kw), client, None)
    assert client.exists("users")
    quiet = cli_plain("reserve", "others", "-c", "1000", "-e", "0.01", "--yes")
    assert quiet.exit_code == 0 and "[y/N]" not in quiet.stderr
    dry = cli_plain("reserve", "more", "-c", "1000", "-e", "0.01", "--dry-run")
    assert dry.exit_code == 0 and "[y/N]" not in dry.stderr and not client.exists("more")


@pytest.mark.usefixtures("terminal")
def test_rebuild_that_swaps_asks_before_it_starts(cli_plain, plain, tmp_path):
    source = tmp_path / "u.csv"
    source.write_text(CSV)
    client = plain.client()
    args = ("rebuild", "users", "--from-csv", str(source), "-c", "1000", "-e", "0.01")
    before = snapshot(client)
    refused = cli_plain(*args, "--swap", input="n\n")
    assert refused.exit_code == 5 and "Rebuild 'users' and swap it in" in refused.stderr
    assert snapshot(client) == before  # asked before anything was read or written
    assert cli_plain(*args, "--swap", input="y\n").exit_code == 0 and client.exists("users")
    no_swap = cli_plain(*args)  # builds a standby only: nothing applications read changes
    assert no_swap.exit_code == 0 and "[y/N]" not in no_swap.stderr


@pytest.mark.usefixtures("terminal")
def test_restore_swap_asks_and_a_no_keeps_the_restored_standby(cli_plain, plain, dumped):
    client = plain.client()
    family = KeyFamily.of("users")
    client.delete("users")
    assert cli_plain("reserve", "users", "-c", "1000", "-e", "0.01", "--yes").exit_code == 0
    refused = cli_plain("restore", "users", "-i", str(dumped), "--swap", "--allow-shrink", input="n\n")
    assert refused.exit_code == 5, refused.stderr
    assert "the restored filter waits in the standby" in refused.stderr and "swap users" in refused.stderr
    assert client.exists(family.standby) and int(client.execute_command("FCALL_RO", "bloomctl_card", 1, "users")) == 0
    done = cli_plain("restore", "users", "-i", str(dumped), "--swap", input="y\n")
    assert done.exit_code == 0, done.stderr
    assert "[y/N]" in done.stderr
    assert cli_plain("restore", "users", "-i", str(dumped), "--swap", "--yes").exit_code == 0


@pytest.mark.usefixtures("terminal")
def test_copy_swap_asks_on_a_terminal(cli_plain, plain, second, dumped):
    target = second.client()
    refused = cli_plain("copy", "users", "--to", second.url, "--swap", input="n\n")
    assert refused.exit_code == 5 and not target.exists("users"), refused.stderr
    done = cli_plain("copy", "users", "--to", second.url, "--swap", input="y\n")
    assert done.exit_code == 0 and target.exists("users"), done.stderr


@pytest.mark.usefixtures("terminal")
def test_apply_asks_naming_what_it_creates(cli_plain, plain, tmp_path):
    config = tmp_path / "bloomctl.toml"
    config.write_text(
        "[filters.users]\ncapacity = 1000\nerror_rate = 0.01\n[filters.carts]\ncapacity = 500\nerror_rate = 0.01\n"
    )
    client = plain.client()
    refused = cli_plain("--config", str(config), "apply", input="n\n")
    assert refused.exit_code == 5, refused.stderr
    assert "Create 2 declared filter(s): users, carts?" in refused.stderr or "carts, users" in refused.stderr
    assert not client.exists("users") and not client.exists("carts")
    done = cli_plain("--config", str(config), "apply", input="y\n")
    assert done.exit_code == 0 and client.exists("users") and client.exists("carts"), done.stderr
    again = cli_plain("--config", str(config), "apply", input="")  # nothing to create: no question
    assert again.exit_code == 0 and "[y/N]" not in again.stderr


def test_without_a_terminal_nothing_asks(cli_plain, plain, tmp_path, dumped):
    """CliRunner's stdin is no terminal, as cron's and CI's: every command goes ahead unasked."""
    client = plain.client()
    for args in (
        ("reserve", "fresh", "-c", "100", "-e", "0.01"),
        ("restore", "users", "-i", str(dumped), "--swap"),
        ("swap", "users"),
    ):
        result = cli_plain(*args)
        assert "[y/N]" not in result.stderr, (args, result.stderr)
        assert result.exit_code in (0, 5), (args, result.stderr)  # (the swap finds no standby: 5)
    assert client.exists("fresh")


def test_a_real_terminal_is_asked_and_a_pipe_is_not(plain):
    """The same in a process of its own: stdin a pseudo-terminal, then a pipe."""
    bloomctl = str(Path(sys.executable).parent / "bloomctl")
    env = {**os.environ, "BLOOMCTL_URL": plain.url}
    controller, terminal_end = pty.openpty()
    process = subprocess.Popen(
        [bloomctl, "reserve", "tty", "-c", "100", "-e", "0.01"],
        stdin=terminal_end,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(terminal_end)
    time.sleep(1.5)  # the question is on stderr by now; answer no
    os.write(controller, b"n\n")
    _out, err = process.communicate(timeout=60)
    os.close(controller)
    assert process.returncode == 5 and b"Create 'tty'" in err, err
    assert not plain.client().exists("tty")
    piped = subprocess.run(
        [bloomctl, "reserve", "tty", "-c", "100", "-e", "0.01"], input=b"", capture_output=True, env=env, timeout=60
    )
    assert piped.returncode == 0 and b"[y/N]" not in piped.stderr
    assert plain.client().exists("tty")


def test_restore_and_copy_dry_runs_read_everything_and_write_nothing(cli_plain, plain, second, dumped, tmp_path):
    client, target = plain.client(), second.client()
    before, there = snapshot(client), snapshot(target)
    dry = cli_plain("restore", "users", "-i", str(dumped), "--dry-run", "--swap")
    assert dry.exit_code == 0 and "checks out" in dry.stdout and "nothing written" in dry.stdout, dry.stderr
    copied = cli_plain("copy", "users", "--to", second.url, "--dry-run", "--format", "json")
    assert copied.exit_code == 0 and '"dry_run": true' in copied.stdout, copied.stderr
    assert snapshot(client) == before and snapshot(target) == there
    damaged = tmp_path / "damaged.bfdump"
    data = bytearray(dumped.read_bytes())
    data[-40] ^= 0xFF  # a flipped byte in the last chunk: only a read of every chunk finds it
    damaged.write_bytes(bytes(data))
    broken = cli_plain("restore", "users", "-i", str(damaged), "--dry-run")
    assert broken.exit_code == 8, broken.stderr
    assert snapshot(client) == before
    client.set(KeyFamily.of("users").lock, "another-run", px=60_000)
    locked = cli_plain("restore", "users", "-i", str(dumped), "--dry-run")
    assert locked.exit_code == 6, locked.stderr


@pytest.mark.usefixtures("terminal")
def test_a_no_to_a_rebuild_leaves_the_last_runs_metrics(cli_plain, plain, tmp_path):
    """A "no" is no run: the metrics file of the last rebuild stays as it was (no failed run to alert on)."""
    source = tmp_path / "u.csv"
    source.write_text(CSV)
    metrics = tmp_path / "rebuild.prom"
    args = (
        "rebuild",
        "users",
        "--from-csv",
        str(source),
        "-c",
        "1000",
        "-e",
        "0.01",
        "--swap",
        "--metrics-file",
        str(metrics),
    )
    assert cli_plain(*args, "--yes").exit_code == 0
    before = metrics.read_text()
    assert "bloomctl_rebuild_success 1" in before.replace('{key="users"}', "")
    refused = cli_plain(*args, input="n\n")
    assert refused.exit_code == 5
    assert metrics.read_text() == before


@pytest.mark.usefixtures("terminal")
def test_reserve_checks_before_it_asks_and_asks_nothing_it_will_not_do(cli_plain, plain):
    assert cli_plain("reserve", "users", "-c", "1000", "-e", "0.01", "--yes").exit_code == 0
    same = cli_plain("reserve", "users", "-c", "1000", "-e", "0.01", "--if-not-exists", input="")
    assert same.exit_code == 0 and "[y/N]" not in same.stderr, same.stderr  # nothing to create
    taken = cli_plain("reserve", "users", "-c", "2000", "-e", "0.01", input="")
    assert taken.exit_code == 5 and "[y/N]" not in taken.stderr, taken.stderr  # refused before any question


@pytest.mark.usefixtures("terminal")
def test_window_create_asks_on_a_terminal(cli_plain, plain):
    args = ("window", "create", "recent", "--period", "1d", "--keep", "2", "-c", "1000", "-e", "0.01")
    client = plain.client()
    refused = cli_plain(*args, input="n\n")
    assert refused.exit_code == 5 and "Create window 'recent'" in refused.stderr, refused.stderr
    assert client.dbsize() == 0
    assert cli_plain(*args, input="y\n").exit_code == 0 and client.exists("recent")
    again = cli_plain(*args, "--if-not-exists", input="")
    assert again.exit_code == 0 and "[y/N]" not in again.stderr


def test_a_restore_dry_run_makes_the_checks_the_restore_makes(cli_plain, plain, dumped, tmp_path):
    """The swap's shrink guard on the dump's count, a scratch key bloomctl did not write, and a user
    without scripts: each refused by the dry run as by the restore."""
    client = plain.client()
    client.delete("users")
    assert cli_plain("reserve", "users", "-c", "5000", "-e", "0.01").exit_code == 0
    client.execute_command("FCALL", "bloomctl_madd", 1, "users", *[f"big:{i}" for i in range(1000)])
    shrink = cli_plain("restore", "users", "-i", str(dumped), "--swap", "--dry-run")
    assert shrink.exit_code == 5 and "the swap would refuse it" in shrink.stderr, shrink.stderr
    assert cli_plain("restore", "users", "-i", str(dumped), "--swap", "--dry-run", "--allow-shrink").exit_code == 0
    client.set(KeyFamily.of("users").companion("restore"), "another application's")
    foreign = cli_plain("restore", "users", "-i", str(dumped), "--dry-run")
    assert foreign.exit_code == 5 and "bloomctl did not write" in foreign.stderr, foreign.stderr
    client.delete(KeyFamily.of("users").companion("restore"))
    client.execute_command("ACL", "SETUSER", "noscript", "on", ">pw", "~*", "&*", "+@all", "-@scripting")
    try:
        url = plain.url.replace("redis://", "redis://noscript:pw@", 1)
        denied = cli_plain("restore", "users", "-i", str(dumped), "--dry-run", url=url)
        assert denied.exit_code != 0 and "may not run Lua scripts" in denied.stderr, denied.stderr
    finally:
        client.execute_command("ACL", "DELUSER", "noscript")
