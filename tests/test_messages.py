"""Messages: the library names its parameters (`capacity`), the CLI shows its flags (--capacity),
and text that is not the library's own (key names, CSV headers, a server's words) is shown as it is,
backticks and all."""

from __future__ import annotations

import json

import click

from bloomctl.cli import main
from bloomctl.cli.render import FLAG_NAMES
from bloomctl.errors import StateConflict, UsageError
from bloomctl.sizing.bloom import plan


def test_one_parameter_name_means_one_flag_throughout_the_cli():
    seen: dict[str, set[str]] = {}

    def walk(command: click.Command) -> None:
        for param in command.params:
            longs = [opt for opt in param.opts if opt.startswith("--")]
            if isinstance(param, click.Option) and longs and param.name:
                seen.setdefault(param.name, set()).add(longs[0])
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(main)
    assert {name: flags for name, flags in seen.items() if len(flags) > 1} == {}
    for name, flag in FLAG_NAMES.items():  # an explicit mapping must agree with the option of that name
        assert seen.get(name, {flag}) == {flag}, name


def test_library_errors_name_parameters_and_keep_values_apart():
    error = UsageError("`template` %r: %s", "x{`force`", "unmatched '{'")
    assert str(error) == "`template` 'x{`force`': unmatched '{'"
    assert (
        error.render(lambda text: text.replace("`template`", "--template")) == "--template 'x{`force`': unmatched '{'"
    )
    assert str(StateConflict("100% done")) == "100% done"  # no values: not a template


def test_a_key_with_backticks_is_shown_as_it_is(cli_plain):
    result = cli_plain("info", "bf`shards`x")
    assert result.exit_code == 5
    assert "'bf`shards`x' does not exist" in result.stderr and "--shards" not in result.stderr


def test_a_csv_header_with_backticks_is_shown_as_it_is(cli_plain, tmp_path):
    path = tmp_path / "mysql-export.csv"
    path.write_text("`id`,`format`\n1,x\n", encoding="utf-8")
    result = cli_plain("rebuild", "users", "--from-csv", str(path), "--column", "nope", "-c", "100", "-e", "1%")
    assert result.exit_code == 2
    assert "`id`, `format`" in result.stderr and "--format" not in result.stderr


def test_fill_ratio_thresholds_are_named_by_their_flags(cli_plain):
    negative = cli_plain("fill-ratio", "k", "--warn", "-1")
    assert negative.exit_code == 2 and "'--warn': -1.0 is not in the range x>=0" in negative.stderr
    inverted = cli_plain("fill-ratio", "k", "--warn", "0.9", "--max", "0.5")
    assert inverted.exit_code == 2 and "--warn (0.9) must not be above --max (0.5)" in inverted.stderr


def test_plan_warnings_name_flags_in_json_too(cli):
    assert "`capacity`" in plan(1000, 0.01, None, items=2000).warnings()[0]  # the library's own words
    result = cli("plan", "-c", "1000", "-e", "1%", "--nonscaling", "-n", "2000", "--format", "json")
    warning = json.loads(result.stdout)["warnings"][0]
    assert "raise --capacity to at least 2,500" in warning and "`" not in warning
    assert "raise --capacity to at least 2,500" in result.stderr


def test_a_usage_error_in_a_sharded_swap_comes_before_the_lock(cli_plain, plain):
    assert cli_plain("reserve", "s", "-c", "3000", "-e", "1%", "--nonscaling", "--shards", "3").exit_code == 0
    plain.client().set("{s}:lock", '{"token": "someone else"}', px=60_000)
    result = cli_plain("swap", "s", "--standby", "other", "--yes")
    assert result.exit_code == 2 and "leave out --standby" in result.stderr
