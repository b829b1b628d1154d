"""Rendering: rich tables for people, stable JSON for machines. rich is imported only when used."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import click

from bloomctl.cli.output import current, no_color
from bloomctl.sizing.bloom import format_rate as fmt_rate  # noqa: F401 (the commands' name for it)

if TYPE_CHECKING:  # pragma: no cover - annotations only: rich loads when a table is printed
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

# Library messages name parameters in backticks (`capacity`, `header=False`); on the command line
# they read as the flags that set them. Most flags are the parameter's name with dashes; these are not.
FLAG_NAMES = {
    "warn": "--warn",
    "max": "--max",
    "csv_path": "--from-csv",
    "parquet_path": "--from-parquet",
    "sql": "--from-sql",
    "query": "--from-sql",
    "verify_all": "--verify all",
    "header=False": "--no-header",
    "keep_old_seconds": "--keep-old",
}
_PARAMETER = re.compile(r"`([a-z][a-z0-9_]*(?:=[A-Za-z0-9]+)?)`")


def _flags_of(command: click.Command, flags: dict[str, str]) -> dict[str, str]:
    """Parameter name -> its long flag, for ``command`` and every command under it (first seen wins)."""
    for param in command.params:
        longs = [opt for opt in param.opts if opt.startswith("--")]
        if isinstance(param, click.Option) and longs and param.name:
            flags.setdefault(param.name, longs[0])
    for sub in getattr(command, "commands", {}).values():
        _flags_of(sub, flags)
    return flags


def _command_flags() -> dict[str, str]:
    """Every command's flags, from the root of the running command line (one name means one flag
    throughout bloomctl: a test checks it)."""
    ctx = click.get_current_context(silent=True)
    return _flags_of(ctx.find_root().command, {}) if ctx is not None else {}


def to_flags(text: str) -> str:
    """A library message template as the command line says it: `error_rate` becomes --error-rate.

    Only for text the library wrote (error templates, plan warnings): never for text that holds
    key names, file names or a server's words, which may contain backticks of their own.
    """
    if "`" not in text:
        return text
    flags = {**_command_flags(), **FLAG_NAMES}
    return _PARAMETER.sub(lambda match: flags.get(match.group(1), match.group(0)), text)


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value):,} B" if unit == "B" else f"{value:,.2f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def emit_json(data: Any) -> None:
    """``data`` on stdout: indented, or one line with ``--log-format json`` (whose lines are one
    JSON object each: `>>app.log 2>&1` keeps one record a line)."""
    if current().log_format == "json":
        click.echo(json.dumps(data, sort_keys=False, default=str))
        return
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def one_line(text: str, output_format: str) -> str:
    """A command's JSON text as one line where ``--log-format json`` makes every line a JSON
    object (`>>app.log 2>&1`); as it is otherwise."""
    if output_format != "json" or current().log_format != "json":
        return text
    return json.dumps(json.loads(text), default=str) + "\n"


def _console() -> Console:
    from rich.console import Console

    return Console(file=sys.stdout, soft_wrap=False, width=None if sys.stdout.isatty() else 120, no_color=no_color())


def _print(table: Table) -> None:
    """Prints a table at its natural width when the terminal is narrower: wider than the screen
    rather than a number wrapped or elided ('3,025,928…')."""
    from rich.measure import Measurement

    console = _console()
    needed = Measurement.get(console, console.options.update_width(100_000), table).maximum
    if needed > console.width:
        console.width = needed
    console.print(table)


def _text(value: object) -> Text:
    """Cells are plain text: a key like ``x[/b]`` must not be read as rich markup."""
    from rich.text import Text

    return Text(str(value))


def emit_pairs(title: str, rows: Iterable[tuple[str, Any]]) -> None:
    """A two-column table of field -> value."""
    from rich.table import Table

    table = Table(title=_text(title), show_header=False, title_justify="left", box=None, pad_edge=False)
    table.add_column("field", style=None if no_color() else "bold", no_wrap=True)
    table.add_column("value")
    for name, value in rows:
        table.add_row(_text(name), _text(value))
    _print(table)


def emit_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    from rich.table import Table

    table = Table(
        title=_text(title) if title else None, title_justify="left", header_style=None if no_color() else "bold"
    )
    for column in columns:
        numeric = column[:1].isdigit() or column in NUMERIC
        table.add_column(column, justify="right" if numeric else "left", no_wrap=numeric)  # numbers are never cut
    for row in rows:
        table.add_row(*(_text(cell) for cell in row))
    _print(table)


NUMERIC = {"capacity", "items", "error rate", "hashes", "bits", "bytes", "fill", "bit fill", "est. FPR", "#"}


def warn(message: str) -> None:
    current().warn(message)


def note(message: str) -> None:
    current().log(message)
