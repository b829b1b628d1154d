"""Rendering: rich tables for people, stable JSON for machines. rich is imported only when used."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import click


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value):,} B" if unit == "B" else f"{value:,.2f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    return f"{value:.4%}" if value >= 0.0001 else f"{value:.3e}"


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def _console() -> Any:
    from rich.console import Console

    return Console(file=sys.stdout, soft_wrap=False, width=None if sys.stdout.isatty() else 120)


def _text(value: Any) -> Any:
    """Cells are plain text: a key like ``x[/b]`` must not be read as rich markup."""
    from rich.text import Text

    return Text(str(value))


def emit_pairs(title: str, rows: Iterable[tuple[str, Any]]) -> None:
    """A two-column table of field -> value."""
    from rich.table import Table

    table = Table(title=_text(title), show_header=False, title_justify="left", box=None, pad_edge=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for name, value in rows:
        table.add_row(_text(name), _text(value))
    _console().print(table)


def emit_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    from rich.table import Table

    table = Table(title=_text(title) if title else None, title_justify="left")
    for column in columns:
        table.add_column(column, justify="right" if column[:1].isdigit() or column in NUMERIC else "left")
    for row in rows:
        table.add_row(*(_text(cell) for cell in row))
    _console().print(table)


NUMERIC = {"capacity", "items", "error rate", "hashes", "bits", "bytes", "fill", "bit fill", "est. FPR", "#"}


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def note(message: str) -> None:
    click.echo(message, err=True)
