"""Docs as tests: every command has help and a README entry with an example; exit codes are documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bloomctl.cli import main
from bloomctl.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(main.commands))
def test_every_command_has_a_readme_section_with_an_example(name):
    section = re.search(rf"^### `bloomctl {re.escape(name)}`\n(.*?)(?=^## |^### |\Z)", README, re.M | re.S)
    assert section, f"README has no section for {name}"
    assert f"bloomctl {name} " in section.group(1), f"README section for {name} has no example"
    assert main.commands[name].help, f"{name} has no help text"


def test_exit_code_table_matches_the_code():
    section = README.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    table = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", section, re.M))
    assert {int(code) for code in table} == {int(code) for code in ExitCode}


def test_readme_commands_exist():
    assert "python -m pytest -q" in README
    assert "bash examples/quickstart.sh" in README
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "python -m pytest -q" in ci


def test_main_help_lists_exit_codes(cli):
    result = cli("--help")
    for code in (0, 1, 2, 3, 4, 5):
        assert f"{code} " in result.stdout
