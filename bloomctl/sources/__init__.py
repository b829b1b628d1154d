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

RECIPE = ("column", "template", "prefix")  # the item recipe, for every kind of source


def open_source(
    *,
    csv_path: str | None = None,
    sql: str | None = None,
    parquet_path: str | None = None,
    db_url: str | None = None,
    **options: Any,
) -> Source:
    """A CSV source (``csv_path``; ``-`` is stdin), a Parquet one (``parquet_path``: a file or a
    directory) or a SQL one (``sql`` at ``db_url``). ``options`` are the item recipe (column,
    template, prefix) and, for CSV, how to read the file."""
    if sum(1 for given in (csv_path, sql, parquet_path) if given) != 1:
        raise UsageError("give exactly one of `csv_path`, `parquet_path` and `sql`")
    recipe = {k: options[k] for k in RECIPE if k in options}
    if csv_path:
        return CsvSource(csv_path, **options)
    if parquet_path:
        from bloomctl.sources.parquet import ParquetSource

        return ParquetSource(parquet_path, **recipe)
    if not db_url:
        raise UsageError("a SQL source needs `db_url` (or BLOOMCTL_DB_URL)")
    assert sql is not None
    return SqlSource(db_url, sql, **recipe)
