"""CLI behaviour that needs no RedisBloom: help, plan, exit codes, errors on a plain server."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from bloomctl.cli import main

pytestmark = pytest.mark.matrix  # CI runs this module on every server of the matrix

COMMANDS = sorted(main.commands)


def test_python_dash_m_help_runs_in_a_subprocess():
    out = subprocess.run([sys.executable, "-m", "bloomctl", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for name in COMMANDS:
        assert name in out.stdout
    assert out.stderr == ""


def test_version(cli):
    result = cli("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("bloomctl, version ")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(cli, command):
    result = cli(command, "--help")
    assert result.exit_code == 0
    assert "Example" in result.stdout
    assert result.stderr == ""


def test_plan_json_matches_the_planner(cli):
    result = cli("plan", "--capacity", "1M", "--error-rate", "1%", "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["size_bytes"] == 1_378_568
    assert data["hashes"] == 8
    assert data["first_filter_error_rate"] == 0.005
    assert data["naive_bytes"] < data["size_bytes"]
    assert result.stderr == ""


def test_plan_table_shows_size_and_naive_estimate(cli):
    result = cli("plan", "-c", "1e6", "-e", "0.01", "--nonscaling", "--format", "table")
    assert result.exit_code == 0
    assert "1,198,232" in result.stdout
    assert "naive" in result.stdout
    assert "NONSCALING" in result.stdout


def test_plan_with_items_prints_the_chain_and_warns_on_stderr(cli):
    result = cli("plan", "-c", "1000", "-e", "1%", "--items", "100k", "--format", "table")
    assert result.exit_code == 0
    assert "Growth chain" in result.stdout
    assert "compound false-positive rate" in result.stdout
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z warning: ", result.stderr), result.stderr
    assert "warning" not in result.stdout


def test_plan_nonscaling_overfill_warning(cli):
    result = cli("plan", "-c", "1000", "-e", "1%", "--nonscaling", "--items", "950", "--format", "json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["warnings"]
    assert "NONSCALING" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "-c", "0", "-e", "1%"],
        ["plan", "-c", "lots", "-e", "1%"],
        ["plan", "-c", "1M", "-e", "150%"],
        ["plan", "-c", "1M", "-e", "0"],
        ["plan", "-c", "1M", "-e", "1%", "--expansion", "0"],
        ["plan", "-c", "1M", "-e", "1%", "--expansion", "2", "--nonscaling"],
        ["plan", "-c", "1M"],
        ["fill-ratio", "k", "--warn", "0.9", "--max", "0.5"],
        ["nonsense"],
        ["info", ""],
        ["plan", "-c", "1e400", "-e", "1%"],
        ["plan", "-c", "1", "-e", "1%", "--expansion", "1", "--items", "5000", "--bogus"],
    ],
)
def test_usage_errors_exit_2_with_a_message_on_stderr(cli_plain, args):
    result = cli_plain(*args)
    assert result.exit_code == 2, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bloomctl: error: "), result.stderr


def test_redisbloom_backend_on_plain_redis_says_what_to_load(cli_plain, plain):
    result = cli_plain("reserve", "users", "-c", "1000", "-e", "1%", "--backend", "redisbloom")
    assert result.exit_code == 4
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "no BF.* commands" in lines[0] and "loadmodule" in lines[0] and "--backend bitmap" in lines[0]
    assert not plain.client().exists("users")


@pytest.mark.parametrize(
    "args",
    [
        ["reserve", "users", "-c", "1000", "-e", "1%"],
        ["info", "users"],
        ["fill-ratio", "users"],
        ["swap", "users", "--yes", "--standby", "users"],
        ["swap", "other", "--yes", "--standby", "users"],
    ],
)
def test_a_plain_string_is_never_taken_for_a_filter(cli_plain, plain, args):
    plain.client().set("users", "untouched")
    result = cli_plain(*args)
    assert result.exit_code == 5, result.stderr
    if args[0] == "fill-ratio":  # a check reports every key: the missing one gets its line of data
        assert result.stdout.startswith("users MISSING (")
    else:
        assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert plain.client().get("users") == b"untouched"


def test_unreachable_server_exits_3(cli):
    from tests.servers import free_port

    result = cli("info", "users", url=f"redis://127.0.0.1:{free_port()}/0")
    assert result.exit_code == 3
    assert result.stdout == ""
    assert "cannot connect" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_scheme_is_a_usage_error(cli):
    result = cli("info", "users", url="http://localhost/")
    assert result.exit_code == 2
    assert "redis://" in result.stderr


def test_plan_with_a_chain_too_long_to_project(cli):
    result = cli("plan", "-c", "1", "-e", "1%", "--expansion", "1", "--items", "5000", "--format", "json")
    assert result.exit_code == 0
    assert "projection stops" in result.stderr
    assert len(json.loads(result.stdout)["chain"]) == 64


def test_a_declared_rebuild_starts_from_the_rebuild_commands_own_defaults(monkeypatch):
    """`rebuild --all` and apply's first builds start from the library's plain defaults: they are
    the values `rebuild` parses when no option is given, type for type."""
    from bloomctl.cli.rebuild import rebuild_command
    from bloomctl.declared.declarations import rebuild_defaults

    for variable in ("BLOOMCTL_BACKEND", "BLOOMCTL_DB_URL"):
        monkeypatch.delenv(variable, raising=False)
    with (
        main.make_context("bloomctl", ["rebuild", "-"]) as root,
        rebuild_command.make_context("rebuild", ["-"], parent=root) as ctx,
    ):
        parsed = dict(ctx.params)
    for name in ("key", "all_filters", "due", "output_format", "metrics_file", "yes"):  # the command line's own
        parsed.pop(name)
    defaults = rebuild_defaults()
    assert defaults == parsed
    assert {name: type(value) for name, value in defaults.items()} == {
        name: type(value) for name, value in parsed.items()
    }
