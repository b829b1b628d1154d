"""PostgreSQL through ADBC: the query's rows arrive as Arrow batches, parsed in C.

Used for the column types whose items it renders exactly as the cursor path does (``str()`` of
the value, UTF-8): text types as they are, integers as decimal digits, ``bytea`` as its bytes,
booleans as ``True``/``False``. Any other type the recipe uses (timestamps, floats, numerics,
UUIDs ...) keeps psycopg's paths, whose text is Python's. The connection always speaks UTF8,
whatever the URL's ``client_encoding``, as the COPY path does.

Every call that may wait on the server runs through ``blocking``: on the main thread the driver
would run it under a SIGINT handler of its own, and Ctrl-C or SIGTERM would not stop it the way
they stop the other sources (bloomctl's handler, which cancels the running queries and raises
KeyboardInterrupt, would only run once the call returned).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from bloomctl import extras
from bloomctl.sources.arrow_items import items_of
from bloomctl.sources.arrow_values import binary_scalar
from bloomctl.sources.base import STOP_WAIT, ItemFormatter, SourceStats, cancellable
from bloomctl.sources.urls import UrlParts, libpq_uri

if TYPE_CHECKING:  # pragma: no cover - annotations only: the driver and pyarrow load when a query runs
    import pyarrow as pa
    from adbc_driver_manager.dbapi import Connection

TEXT_TYPES = frozenset({"text", "varchar", "bpchar", "name"})
EXACT_TYPES = TEXT_TYPES | {"int2", "int4", "int8", "bytea", "bool"}
BATCH_BYTES = 8 << 20  # what the driver gathers per Arrow batch
# SQLAlchemy's blocking PostgreSQL drivers: a URL naming one of them (or none) is ADBC's to serve
# without SQLAlchemy; any other name goes to SQLAlchemy, which says what is wrong with it
DRIVERS = frozenset({"", "psycopg", "psycopg2", "psycopg2cffi", "pg8000"})
WAIT_SLICE = 0.05  # seconds the main thread waits on a driver call between looks at its signals

T = TypeVar("T")


def available(dialect: str, params: dict[str, Any]) -> bool:
    """PostgreSQL, no bound parameters, and the driver installed (one that does not import leaves
    the query to SQLAlchemy's path)."""
    if dialect != "postgresql" or params:
        return False
    return extras.available(extras.ADBC)


def uri_of(url: UrlParts) -> str:
    """A libpq URI for the source's URL, UTF8 forced (the password included: it never leaves this
    process); a ValueError where SQLAlchemy's dialect would refuse the URL."""
    return libpq_uri(url, client_encoding="UTF8")


def connect(uri: str) -> Connection:
    """A connection in autocommit: each query its own transaction, so ``CURRENT_TIMESTAMP`` is the
    moment of the query, as on SQLAlchemy's connections, which begin one per use."""
    import adbc_driver_postgresql.dbapi

    return blocking(lambda: adbc_driver_postgresql.dbapi.connect(uri, autocommit=True))


def blocking(call: Callable[[], T], cancel: Callable[[], object] | None = None) -> T:
    """``call()``, a call into the driver that may wait on the server, stoppable by Ctrl-C and
    SIGTERM: ``cancel`` (the statement's) is what ``cancel_running`` calls meanwhile. On the main
    thread the call runs in a thread of its own while the main thread waits in short slices, its
    signal handlers free to run; a KeyboardInterrupt there cancels the query, waits for the call
    to end (so that its connection can be closed), and goes on. A call without a cancel (opening
    a connection) is left to end by itself, in a daemon thread."""
    with cancellable(cancel) if cancel is not None else contextlib.nullcontext():
        if threading.current_thread() is not threading.main_thread():
            return call()
        outcome: list[tuple[bool, Any]] = []

        def run() -> None:
            try:
                outcome.append((True, call()))
            except BaseException as exc:  # raised in the main thread, below
                outcome.append((False, exc))

        worker = threading.Thread(target=run, name="bloomctl-adbc", daemon=True)
        worker.start()
        try:
            while worker.is_alive():
                worker.join(WAIT_SLICE)
        except BaseException:
            if cancel is not None:
                with contextlib.suppress(Exception):
                    cancel()
                worker.join(STOP_WAIT)
            raise
    done, value = outcome[0]
    if not done:
        raise value
    return value


class Connections:
    """Connections to one URI, kept open between queries: opening one costs the driver a read of
    the server's type catalogue, tens of milliseconds, a small query about one. Each serves one
    query at a time; one that stopped part-way (an error, a reader closed early) is closed, not
    reused. The idle ones close when the pool is collected or the interpreter exits."""

    def __init__(self, uri: str) -> None:
        self._uri = uri
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        weakref.finalize(self, _close_all, self._idle)

    @contextlib.contextmanager
    def connection(self) -> Iterator[Connection]:
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            connection = connect(self._uri)
        try:
            yield connection
        except BaseException:
            with contextlib.suppress(Exception):  # the error that stopped it is the one to raise
                connection.close()
            raise
        with self._lock:
            self._idle.append(connection)


def _close_all(connections: list[Connection]) -> None:
    while connections:
        with contextlib.suppress(Exception):
            connections.pop().close()


def column_types(connection: Connection, query: str) -> tuple[list[str], list[str]]:
    """The query's column names and PostgreSQL type names, from a query that returns no rows."""
    return schema_of(connection, f"SELECT * FROM ({query}) AS bloomctl_cols LIMIT 0")


def schema_of(connection: Connection, sql: str) -> tuple[list[str], list[str]]:
    """The column names and PostgreSQL type names of ``sql``'s result (read whole: give one without rows)."""
    with connection.cursor() as cursor:

        def run() -> pa.Schema:
            cursor.execute(sql)
            return cursor.fetch_arrow_table().schema

        schema = blocking(run, cursor.adbc_cancel)
    kinds = []
    for field in schema:
        metadata = field.metadata or {}
        kinds.append(metadata.get(b"POSTGRESQL:type", b"").decode())
    return list(schema.names), kinds


def scalar(connection: Connection, sql: str) -> object:
    """The first value of ``sql``'s first row, as a Python value (a timestamptz is an aware datetime)."""
    with connection.cursor() as cursor:

        def run() -> tuple[Any, ...] | None:
            cursor.execute(sql)
            return cursor.fetchone()

        row = blocking(run, cursor.adbc_cancel)
    return None if row is None else row[0]


def literal(value: Any) -> str | None:
    """``value`` as a PostgreSQL literal of the type and value psycopg binds it as (an aware
    datetime is a ``timestamptz``, a naive one a ``timestamp``, a date a ``date``, a subclass's
    nanoseconds dropped); None for any other value."""
    if isinstance(value, datetime):
        if type(value) is not datetime:  # pandas' Timestamp writes its nanoseconds: psycopg drops them
            value = datetime(*value.timetuple()[:6], value.microsecond, value.tzinfo, fold=value.fold)
        if value.utcoffset() is None:
            return f"'{value.isoformat()}'::timestamp"
        try:
            return f"'{value.astimezone(UTC).isoformat()}'::timestamptz"
        except OverflowError:  # in UTC, before year 1 or after 9999: PostgreSQL reads the offset as given
            return f"'{value.isoformat()}'::timestamptz"
    if isinstance(value, date):
        return f"'{value.isoformat()}'::date"
    return None


def exact(fmt: ItemFormatter, kinds: list[str]) -> bool:
    """Whether every column the recipe uses has a type this path renders as the cursor path does."""
    return inexact(fmt, kinds) is None


def inexact(fmt: ItemFormatter, kinds: list[str]) -> int | None:
    """The first column the recipe uses whose type this path does not render as the cursor path
    does (its position); None when there is none."""
    return next((i for i in (fmt.indexes or [fmt.index]) if kinds[i] not in EXACT_TYPES), None)


def batches(
    connection: Connection, query: str, names: list[str], fmt: ItemFormatter, stats: SourceStats
) -> Iterator[Any]:
    """Binary arrays of items, one per Arrow batch the driver delivers."""
    wanted = fmt.indexes or [fmt.index]
    select = ", ".join(f"c{i}" for i in sorted(set(wanted)))
    with connection.cursor() as cursor:
        cursor.adbc_statement.set_options(**{"adbc.postgresql.batch_size_hint_bytes": str(BATCH_BYTES)})
        cancel = cursor.adbc_cancel
        with cancellable(cancel):  # Ctrl-C or SIGTERM stops the query on the server, between batches too
            blocking(lambda: cursor.execute(f"SELECT {select} FROM ({query}) AS {positional(len(names))}"), cancel)
            reader = cursor.fetch_record_batch()
            while (batch := blocking(lambda: next(reader, None), cancel)) is not None:
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
        return pc.if_else(column, binary_scalar(b"True"), binary_scalar(b"False"))
    if pa.types.is_integer(column.type):
        column = column.cast(pa.string())
    return column.cast(pa.binary())
