"""PostgreSQL through ADBC: the query's rows arrive as Arrow batches, parsed in C.

Used for the column types whose items it renders exactly as the cursor path does (``str()`` of
the value, UTF-8): text types as they are, integers as decimal digits, ``bytea`` as its bytes,
booleans as ``True``/``False``. Any other type the recipe uses (timestamps, floats, numerics,
UUIDs ...) keeps psycopg's paths, whose text is Python's. The connection always speaks UTF8,
whatever the URL's ``client_encoding``, as the COPY path does.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from bloomctl.sources.arrow_items import items_of
from bloomctl.sources.base import ItemFormatter, SourceStats, cancellable

if TYPE_CHECKING:  # pragma: no cover - annotations only: the driver and pyarrow load when a query runs
    import pyarrow as pa
    from adbc_driver_manager.dbapi import Connection

TEXT_TYPES = frozenset({"text", "varchar", "bpchar", "name"})
EXACT_TYPES = TEXT_TYPES | {"int2", "int4", "int8", "bytea", "bool"}
BATCH_BYTES = 8 << 20  # what the driver gathers per Arrow batch


def available(dialect: str, params: dict[str, Any]) -> bool:
    """PostgreSQL, no bound parameters, and the driver installed."""
    if dialect != "postgresql" or params:
        return False
    return all(importlib.util.find_spec(name) is not None for name in ("adbc_driver_postgresql", "pyarrow"))


def uri_of(url: Any) -> str:
    """A libpq URI for SQLAlchemy's URL, UTF8 forced (the password included: it never leaves this process)."""
    query = {k: v for k, v in url.query.items() if k != "client_encoding"}
    return libpq_uri(url.set(query={**query, "client_encoding": "UTF8"}))


def libpq_uri(url: Any) -> str:
    """SQLAlchemy's URL as a libpq URI, the password percent-encoded whole (SQLAlchemy leaves a
    space as it is, which libpq refuses)."""
    from urllib.parse import quote

    bare = url.set(drivername="postgresql")._replace(password=None)  # (set() takes None for "unchanged")
    rendered = str(bare.render_as_string(hide_password=False))
    if not url.password:
        return rendered
    scheme, _sep, rest = rendered.partition("://")
    user, at, address = rest.partition("@")
    if not at:  # no user: libpq takes the password in the query as well
        return f"{rendered}{'&' if '?' in rendered else '?'}password={quote(url.password, safe='')}"
    return f"{scheme}://{user}:{quote(url.password, safe='')}@{address}"


def connect(uri: str) -> Connection:
    import adbc_driver_postgresql.dbapi

    return adbc_driver_postgresql.dbapi.connect(uri)


def column_types(connection: Connection, query: str) -> tuple[list[str], list[str]]:
    """The query's column names and PostgreSQL type names, from a query that returns no rows."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM ({query}) AS bloomctl_cols LIMIT 0")
        schema = cursor.fetch_arrow_table().schema
    kinds = []
    for field in schema:
        metadata = field.metadata or {}
        kinds.append(metadata.get(b"POSTGRESQL:type", b"").decode())
    return list(schema.names), kinds


def exact(fmt: ItemFormatter, kinds: list[str]) -> bool:
    """Whether every column the recipe uses has a type this path renders as the cursor path does."""
    return all(kinds[i] in EXACT_TYPES for i in (fmt.indexes or [fmt.index]))


def batches(
    connection: Connection, query: str, names: list[str], fmt: ItemFormatter, stats: SourceStats
) -> Iterator[Any]:
    """Binary arrays of items, one per Arrow batch the driver delivers."""
    wanted = fmt.indexes or [fmt.index]
    select = ", ".join(f"c{i}" for i in sorted(set(wanted)))
    with connection.cursor() as cursor:
        cursor.adbc_statement.set_options(**{"adbc.postgresql.batch_size_hint_bytes": str(BATCH_BYTES)})
        with cancellable(cursor.adbc_cancel):  # Ctrl-C or SIGTERM stops the query on the server too
            cursor.execute(f"SELECT {select} FROM ({query}) AS {positional(len(names))}")
            for batch in cursor.fetch_record_batch():
                columns = [_render(batch.column(f"c{i}")) for i in wanted]
                items, blank = items_of(columns, fmt)
                stats.rows += batch.num_rows
                stats.blank += blank
                stats.items += len(items)
                if len(items):
                    yield items


def positional(width: int) -> str:
    """The query's columns renamed by position (c0, c1, ...): two columns of one name (``?column?``
    of two expressions, a join's two ``id``) cannot be told apart by name."""
    return "bloomctl_src(" + ", ".join(f"c{i}" for i in range(width)) + ")"


def _render(column: pa.Array) -> pa.Array:
    """A column as the binary text of each value, as ``str()`` writes it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_boolean(column.type):
        return pc.if_else(column, pa.scalar(b"True", pa.binary()), pa.scalar(b"False", pa.binary()))
    if pa.types.is_integer(column.type):
        column = column.cast(pa.string())
    return column.cast(pa.binary())
