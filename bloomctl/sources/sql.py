"""SQL queries (PostgreSQL, MySQL/MariaDB, SQLite, anything SQLAlchemy reaches) as a source.

Rows stream through a server-side cursor (PostgreSQL text and integer columns through COPY, see
``pgcopy``); the query can be narrowed to the rows changed since a moment, for the rebuild's
catch-up. Driver errors become one line without the password.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bloomctl.errors import SourceError, UsageError
from bloomctl.server.connection import redact_url
from bloomctl.sources import adbc, pgcopy
from bloomctl.sources.base import Batch, ItemFormatter, SourceStats, cancellable, dbapi_cancel, item_list

if TYPE_CHECKING:  # pragma: no cover - annotations only: SQLAlchemy loads when the source is read
    from sqlalchemy.engine import Connection, Engine

DRIVER_HINTS = {
    "postgresql": ("postgresql+psycopg", "psycopg", "pip install '.[postgresql]' in bloomctl's checkout"),
    "mysql": ("mysql+pymysql", "pymysql", "pip install '.[mysql]' in bloomctl's checkout"),
    "mariadb": ("mariadb+pymysql", "pymysql", "pip install '.[mysql]' in bloomctl's checkout"),
}
DRIVER_HINTS["postgres"] = DRIVER_HINTS["postgresql"]  # libpq's and Heroku's spelling; SQLAlchemy refuses it


def normalise_db_url(url: str) -> str:
    """``postgresql://`` (or ``postgres://``) and ``mysql://`` name drivers bloomctl does not ship:
    use the ones it does."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise UsageError("`db_url` must look like postgresql://user@host/db, mysql://..., or sqlite:///path")
    # SQLAlchemy ends the password at its first '@': the rest would be taken for the host (and a
    # part of the password would show in its errors). Refused, echoing nothing of it.
    parsed = re.match(r"[^:/]*:[^@]*@([^/?]*)", rest)
    if parsed and "@" in parsed.group(1):
        raise UsageError(
            "the `db_url`'s password holds an unencoded @ (%s://***@...): percent-encode it as %%40", scheme
        )
    if scheme in DRIVER_HINTS:
        return f"{DRIVER_HINTS[scheme][0]}://{rest}"
    return url


class SqlSource:
    """Items from the first (or ``column``) column of a query, streamed with a server-side cursor."""

    def __init__(
        self,
        url: str,
        query: str,
        *,
        column: str | None = None,
        template: str | None = None,
        prefix: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> None:
        if not query.strip():
            raise UsageError("`query` is empty")
        self.url = normalise_db_url(url)
        self.query = query.strip().rstrip(";")
        self.params = params or {}
        self.column, self.template, self.prefix = column, template, prefix
        self.stats = SourceStats()
        self._engine: Engine | None = None
        self.rewindable = True

    @property
    def description(self) -> str:
        return f"SQL at {redact_url(self.url)}"

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            try:
                import sqlalchemy
            except ImportError:
                raise UsageError("SQL sources need SQLAlchemy: pip install '.[sql]' in bloomctl's checkout") from None
            try:
                self._engine = sqlalchemy.create_engine(self.url)
            except ImportError as exc:
                scheme = self.url.split("+")[0].split(":")[0]
                hint = DRIVER_HINTS.get(scheme, ("", "", "install the database driver"))[2]
                raise UsageError("the driver for %s is not installed (%s): %s", scheme, exc.name, hint) from None
            except Exception as exc:  # ArgumentError and friends: an unparsable URL
                raise UsageError("invalid `db_url` %s: %s", redact_url(self.url), self._scrub(exc)) from None
        return self._engine

    def _scrub(self, exc: BaseException) -> str:
        """The first line of a driver's message without the password, as typed or percent-encoded."""
        from urllib.parse import quote, quote_plus

        text = str(exc).split("\n")[0]
        try:
            from sqlalchemy.engine import make_url

            password = make_url(self.url).password
        except Exception:
            password = None
        if password:
            forms = {
                password,
                quote(password, safe=""),
                quote_plus(password),
                quote(password),
                quote(password, safe=" +"),
            }
            for form in sorted(forms, key=len, reverse=True):  # SQLAlchemy's own rendering among them
                text = text.replace(form, "***")
        return text

    def _error(self, exc: BaseException, what: str) -> SourceError:
        return SourceError("%s failed at %s: %s", what, redact_url(self.url), self._scrub(exc))

    def _scalar(self, sql: str, **params: Any) -> Any:
        from sqlalchemy import text

        try:
            with self.engine.connect() as conn:
                return conn.execute(text(sql), params).scalar()
        except UsageError:
            raise
        except Exception as exc:
            raise self._error(exc, "the query") from None

    def preflight(self) -> None:
        """Connect, and check the query's columns against the column or template before anything is written."""
        from sqlalchemy import text

        try:
            with self.engine.connect() as conn:
                names = list(
                    conn.execute(text(f"SELECT * FROM ({self.query}) AS bloomctl_cols WHERE 1 = 0"), self.params).keys()
                )
        except (UsageError, SourceError):
            raise
        except Exception as exc:
            raise self._error(exc, "the query") from None
        ItemFormatter(names, self.column, self.template, self.prefix)
        self.selected = names

    selected: list[str] | None = None  # the query's column names, once ``preflight`` has run

    def check_selected(self, column: str, option: str) -> None:
        """``column`` (of ``option``) must be one the query selects: the catch-up and a split narrow
        the query by it, which would fail only after the whole load."""
        if self.selected is not None and column.lower() not in {name.lower() for name in self.selected}:
            raise UsageError(  # the option is one of ours, so it may sit in the template (read as its flag)
                "`" + option + "` %r is not a column the query selects (it selects: %s)",
                column,
                ", ".join(self.selected),
            )

    def count(self) -> int:
        return int(self._scalar(f"SELECT COUNT(*) FROM ({self.query}) AS bloomctl_count"))

    def now(self) -> datetime:
        """The database's clock: catch-up compares against it, not against this machine's."""
        moment = self._scalar("SELECT CURRENT_TIMESTAMP")
        if isinstance(moment, str):  # SQLite answers text: 'YYYY-MM-DD HH:MM:SS'
            moment = datetime.fromisoformat(moment)
        return moment

    @staticmethod
    def check_column_name(column: str) -> str:
        if not column.replace("_", "").isalnum():
            raise UsageError("`since_column` %r must be a plain column name", column)
        return column

    def since(self, column: str, moment: Any) -> SqlSource:
        """The same source restricted to rows whose ``column`` is at or after ``moment`` (the catch-up)."""
        return self._narrowed(column, ">=", moment)

    def before(self, column: str, moment: Any) -> SqlSource:
        """The rows whose ``column`` is before ``moment``: what a full verification can demand on a live table."""
        return self._narrowed(column, "<", moment)

    shared_parse = False

    def part(self, index: int, parts: int, split_column: str | None = None) -> SqlSource:
        """The rows whose ``split_column``, cast to an integer, is ``index`` modulo ``parts`` (rows
        where it is NULL go to part 0): each part runs its own query on the database. The cast
        gives every number one part (2.5 % 2 is 0.5, which no part would match); a column that
        cannot be cast (text) fails in the database, with its message."""
        if split_column is None:
            raise UsageError("`jobs` with a SQL source needs `split_column`, an integer column to split the rows by")
        column = self.check_column_name(split_column)
        scheme = self.url.split("+")[0].split(":")[0]
        integer = {"mysql": "SIGNED", "mariadb": "SIGNED", "sqlite": "INTEGER"}.get(scheme, "BIGINT")
        whole = f"CAST({column} AS {integer})"
        condition = f"ABS({whole} % {parts}) = {index}" + (f" OR {column} IS NULL" if index == 0 else "")
        return self._where(condition, self.params)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_engine"] = None  # engines do not cross processes: each part makes its own
        return state

    def _narrowed(self, column: str, operator: str, moment: Any) -> SqlSource:
        narrowed = self._where(f"{self.check_column_name(column)} {operator} :moment", {"moment": moment})
        narrowed._engine = self._engine
        return narrowed

    def _where(self, condition: str, params: dict[str, Any] | None) -> SqlSource:
        """The same recipe over the query's rows that meet ``condition``."""
        return SqlSource(
            self.url,
            f"SELECT * FROM ({self.query}) AS bloomctl_src WHERE {condition}",
            column=self.column,
            template=self.template,
            prefix=self.prefix,
            params=params,
        )

    def batches(self, size: int) -> Iterator[list[bytes]]:
        for batch in self.fast_batches(size):
            yield item_list(batch)

    def fast_batches(self, size: int) -> Iterator[Batch]:
        """Arrow batches through ADBC where it renders every value the recipe uses exactly as the
        cursor path does; else psycopg's COPY (text and integer columns) or the cursor."""
        self.stats = SourceStats()
        try:
            if adbc.available(self.engine.dialect.name, self.params):
                connection = adbc.connect(adbc.uri_of(self.engine.url))
                try:
                    names, kinds = adbc.column_types(connection, self.query)
                    fmt = ItemFormatter(names, self.column, self.template, self.prefix)
                    if adbc.exact(fmt, kinds):
                        for items in adbc.batches(connection, self.query, names, fmt, self.stats):
                            for start in range(0, len(items), size):
                                yield items.slice(start, size)
                        return
                finally:
                    connection.close()
            fast = (
                pgcopy.copy_column(self.engine, self.query, self.column, self.prefix) if self._copy_possible() else None
            )
            if fast is not None:
                yield from pgcopy.copy_batches(self.engine, self.query, size, *fast, self.stats)
            else:
                yield from self._cursor_batches(size)
        except (UsageError, SourceError, GeneratorExit):
            raise
        except Exception as exc:  # the driver's errors, one line each and without the password
            raise self._error(exc, "the query") from None

    def _copy_possible(self) -> bool:
        """PostgreSQL through psycopg, without bound parameters: COPY ... TO STDOUT is 2x faster."""
        return pgcopy.available(self.engine, self.params, self.template)

    def _cursor_batches(self, size: int) -> Iterator[list[bytes]]:
        from sqlalchemy import text

        with self.engine.connect() as conn, cancellable(_cancel_of(conn)):
            result = conn.execution_options(stream_results=True, yield_per=size).execute(text(self.query), self.params)
            names = list(result.keys())
            fmt = ItemFormatter(names, self.column, self.template, self.prefix)
            index = fmt.index
            for rows in result.partitions(size):
                self.stats.rows += len(rows)
                if fmt.template is not None:
                    texts = [[_text(v) for v in row] for row in rows]
                    items = [fmt.text_item(row) for row in texts if all(row[i] for i in fmt.indexes)]
                else:
                    items = [_item(row[index], fmt.prefix) for row in rows]
                    items = [item for item in items if item]
                self.stats.blank += len(rows) - len(items)
                self.stats.items += len(items)
                if items:
                    yield items


def _cancel_of(conn: Connection) -> Callable[[], object]:
    """The cancel of a SQLAlchemy connection's driver connection (a no-op where there is none)."""
    driver = getattr(getattr(conn, "connection", None), "dbapi_connection", None)
    return dbapi_cancel(driver) or (lambda: None)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def _item(value: Any, prefix: bytes) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes):
        raw = value
    elif isinstance(value, memoryview):
        raw = value.tobytes()
    else:
        raw = str(value).encode("utf-8")
    return prefix + raw if raw and prefix else raw
