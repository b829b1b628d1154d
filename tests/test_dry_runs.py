"""--dry-run makes every check of the real command and writes nothing: swap and rollback, a
sharded swap, `functions install`; and it loads no function library."""

from __future__ import annotations

import json

import pytest

from bloomctl.keys import KeyFamily
from tests.helpers.matrix import SIGNALS_LOCKS_ERRORS
from tests.helpers.redis import active_and_standby, snapshot


@SIGNALS_LOCKS_ERRORS
def test_dry_runs_check_everything_and_change_nothing(target):
    """(#10 item 15) `--dry-run` on swap and rollback: every check of the real command (the lock, the shrink
    guard), and nothing written."""
    active_and_standby(target, 1000, 900)

    before = snapshot(target.client)
    dry = target.cli("swap", "users", "--dry-run", "--format", "json")
    assert dry.exit_code == 0, dry.stderr
    data = json.loads(dry.stdout)
    assert data["dry_run"] is True and data["swapped"] is False and data["items"] == 900
    assert data["previous_items"] == 1000
    assert "dry run: would swap" in target.cli("swap", "users", "--dry-run", "--format", "text").stdout
    assert snapshot(target.client) == before
    shrink = target.cli("swap", "users", "--dry-run", "--min-ratio", "0.95")
    assert shrink.exit_code == 5 and "--allow-shrink" in shrink.stderr  # the real guard, refused
    target.client.set(KeyFamily.of("users").lock, json.dumps({"token": "t", "command": "bloomctl rebuild"}))
    locked = target.cli("swap", "users", "--dry-run")
    assert locked.exit_code == 6 and "locked by" in locked.stderr
    target.client.delete(KeyFamily.of("users").lock)
    no_old = target.cli("rollback", "users", "--dry-run")
    assert no_old.exit_code == 5 and "no old filter" in no_old.stderr
    assert snapshot(target.client) == before
    assert target.cli("swap", "users", "--yes").exit_code == 0
    before = snapshot(target.client)
    target.client.delete(KeyFamily.of("users").standby)  # (there is none after a swap; rollback needs none)
    rolled = target.cli("rollback", "users", "--dry-run", "--format", "text")
    assert rolled.exit_code == 0 and "dry run: would roll" in rolled.stdout, rolled.stderr
    assert snapshot(target.client) == before and target.card("users") == 900


@SIGNALS_LOCKS_ERRORS
def test_a_sharded_dry_run_swap_changes_nothing(target, tmp_path):
    """(#10 item 15) `swap --dry-run` on a sharded filter checks every member's standby and swaps none."""
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(900)))
    args = ["rebuild", "users", "--from-csv", str(csv), "-c", "3000", "-e", "1%", "--shards", "3"]
    if target.backend.name == "bitmap":
        args.append("--nonscaling")
    assert target.cli(*args, "--swap").exit_code == 0
    assert target.cli(*args).exit_code == 0  # the standbys, not swapped

    before = snapshot(target.client)
    dry = target.cli("swap", "users", "--dry-run", "--format", "text")
    assert dry.exit_code == 0 and "dry run: would swap 3 of 3 shards" in dry.stdout, dry.stdout + dry.stderr
    assert snapshot(target.client) == before
    assert target.cli("swap", "users", "--yes").exit_code == 0 and snapshot(target.client) != before


@SIGNALS_LOCKS_ERRORS
def test_a_dry_run_swap_loads_no_function_library(target):
    """(#10 item 15, review) `swap --dry-run` on a bitmap filter loaded the function library (FUNCTION LOAD:
    a write, replicated) to count the standby's items. It uses the script cache instead."""
    if target.backend.name != "bitmap":
        pytest.skip("the function library is the bitmap backend's")
    active_and_standby(target, 1000, 900)
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


def test_functions_install_dry_run_loads_nothing(cli_plain, plain):
    """(#10 item 15) `functions install --dry-run` says which primaries would get the library."""
    client = plain.client()
    client.execute_command("FUNCTION", "FLUSH")
    dry = cli_plain("functions", "install", "--dry-run", "--format", "json")
    assert dry.exit_code == 0 and json.loads(dry.stdout)["would_load"], dry.stdout
    assert client.execute_command("FUNCTION", "LIST") == []
    assert cli_plain("functions", "install").exit_code == 0
    text = cli_plain("functions", "install", "--dry-run", "--format", "text")
    assert "every primary has the current library" in text.stdout
