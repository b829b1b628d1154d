"""Sources: where a rebuild's items come from (CSV files, SQL queries), behind one protocol.

``open_source`` turns the rebuild's options into a source; every source follows ``Source`` (and
SQL also ``IncrementalSource``, for the catch-up).
"""

from __future__ import annotations

from typing import Any

from bloomctl.errors import UsageError
from bloomctl.sources.base import IncrementalSource, ItemFormatter, Source, SourceStats, rebatch
from bloomctl.sources.csv import CsvSource
from bloomctl.sources.sql import SqlSource, normalise_db_url

__all__ = [
    "CsvSource",
    "IncrementalSource",
    "ItemFormatter",
    "Source",
    "SourceStats",
    "SqlSource",
    "normalise_db_url",
    "open_source",
    "rebatch",
]

SQL_OPTIONS = ("column", "template", "prefix")


def open_source(
    *, csv_path: str | None = None, sql: str | None = None, db_url: str | None = None, **options: Any
) -> Source:
    """A CSV source (``csv_path``; ``-`` is stdin) or a SQL one (``sql`` at ``db_url``). ``options``
    are the item recipe (column, template, prefix) and, for CSV, how to read the file."""
    if bool(csv_path) == bool(sql):
        raise UsageError("give exactly one of `csv_path` and `sql`")
    if csv_path:
        return CsvSource(csv_path, **options)
    if not db_url:
        raise UsageError("a SQL source needs `db_url` (or BLOOMCTL_DB_URL)")
    assert sql is not None
    return SqlSource(db_url, sql, **{k: options[k] for k in SQL_OPTIONS if k in options})
