"""SQL queries (PostgreSQL, MySQL/MariaDB, SQLite, anything SQLAlchemy reaches) as a source.

Rows stream through a server-side cursor (PostgreSQL text and integer columns through COPY, see
``pgcopy``); the query can be narrowed to the rows changed since a moment, for the rebuild's
catch-up. Where ADBC serves a PostgreSQL URL, everything (columns, count, clock, rows, the
narrowed queries) goes through it and SQLAlchemy is never imported. Driver errors become one
line without the password; a driver that is not installed, the line naming the extra to install
(``missing_for`` tells it from the URL alone, for the commands that check a file of filters).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from bloomctl import extras
from bloomctl.errors import MissingExtra, SourceError, UsageError, first_line
from bloomctl.sources import adbc, pgcopy
from bloomctl.sources.base import Batch, ItemFormatter, SourceStats, cancellable, dbapi_cancel, item_list
from bloomctl.sources.urls import parse_db_url, redact_db_url, secrets_of

if TYPE_CHECKING:  # pragma: no cover - annotations only: SQLAlchemy and ADBC load when the source is read
    from adbc_driver_manager.dbapi import Connection as AdbcConnection
    from sqlalchemy.engine import Connection, Engine

T = TypeVar("T")

# a URL inside a driver's message (libpq quotes the whole URI it could not parse, password and all)
_URL_IN_MESSAGE = re.compile(r"[A-Za-z][\w+.-]*://[^\s\"']*")

# the drivers the postgresql and mysql extras install, for URLs that name none
DEFAULT_DRIVERS = {
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",  # libpq's and Heroku's spelling; SQLAlchemy refuses it
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
}
# what SQLAlchemy's path needs, by the URL's dialect and driver; any other URL needs SQLAlchemy and
# a driver of the user's own choosing (SQLite's is Python's), which create_engine names when missing
SQLALCHEMY_FEATURES = {
    ("postgresql", "psycopg"): extras.POSTGRESQL,
    ("mysql", "pymysql"): extras.MYSQL,
    ("mariadb", "pymysql"): extras.MYSQL,
}


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
    if scheme in DEFAULT_DRIVERS:
        return f"{DEFAULT_DRIVERS[scheme]}://{rest}"
    return url


def sqlalchemy_feature(url: str) -> str:
    """The feature (``bloomctl.extras``) SQLAlchemy's path needs for the normalised ``url``."""
    try:
        parsed = parse_db_url(url)
    except ValueError:
        return extras.SQL  # SQLAlchemy says what is wrong with the URL
    return SQLALCHEMY_FEATURES.get((parsed.dialect, parsed.driver), extras.SQL)


def adbc_may_serve(url: str) -> bool:
    """Whether ADBC, when installed, serves the normalised ``url``: PostgreSQL through one of the
    drivers ADBC stands in for."""
    try:
        parsed = parse_db_url(url)
    except ValueError:
        return False
    return parsed.dialect == "postgresql" and parsed.driver in adbc.DRIVERS


def missing_for(url: str) -> MissingExtra | None:
    """What this machine lacks to read a SQL source at ``url``, as far as the URL tells; None for
    nothing. A PostgreSQL URL that ADBC serves needs nothing more, though a query whose item
    columns ADBC does not read exactly (a timestamp, a UUID) still needs SQLAlchemy and psycopg:
    the source's preflight says so, before anything is written."""
    try:
        url = normalise_db_url(url)
    except UsageError:
        return None  # the source itself words what is wrong with the URL
    if adbc_may_serve(url) and extras.available(extras.ADBC):
        return None
    lacking = extras.missing(sqlalchemy_feature(url))
    if lacking is not None:
        return lacking
    return _dialect_driver_missing(url)


def _dialect_driver_missing(url: str) -> MissingExtra | None:
    """The driver the URL's dialect imports (``mysql+mysqldb``, ``postgresql+psycopg2``), asked of
    SQLAlchemy without connecting: an extra's own driver is checked above, another one here."""
    from sqlalchemy.engine import make_url

    try:
        dialect = make_url(url).get_dialect()
    except ImportError as exc:  # SQLAlchemy has no such dialect: the source says so when it runs
        return _driver_missing(url, exc)
    except Exception:  # an URL SQLAlchemy cannot read: the source words it when it runs
        return None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        return _driver_missing(url, exc)
    return None


def _driver_missing(url: str, exc: ImportError) -> MissingExtra:
    """A driver the dialect imports that no extra of redis-bloomctl installs (the extras' own are
    checked before ``create_engine``)."""
    dialect = url.split("+")[0].split(":")[0]
    return MissingExtra(
        "the driver for %s is not installed (%s), and no extra of redis-bloomctl installs it: install it, "
        "or use postgresql:// or mysql://, whose drivers the postgresql and mysql extras install",
        dialect,
        exc.name or first_line(exc),
    )


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
        # The query as ADBC runs it: a narrowing's moment is written into it as a literal (a bound
        # parameter would make the driver hold the whole result in memory). None while bound
        # parameters only SQLAlchemy's drivers send remain.
        self._adbc_query: str | None = None if self.params else self.query
        self._adbc_connections: adbc.Connections | None = None

    @property
    def description(self) -> str:
        return f"SQL at {redact_db_url(self.url)}"

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            extras.require(sqlalchemy_feature(self.url))
            import sqlalchemy

            try:
                self._engine = sqlalchemy.create_engine(self.url)
            except ImportError as exc:  # the dialect imports its driver here
                raise _driver_missing(self.url, exc) from None
            except Exception as exc:  # ArgumentError and friends: an unparsable URL
                raise UsageError("invalid `db_url` %s: %s", redact_db_url(self.url), self._unparsable(exc)) from None
        return self._engine

    def _unparsable(self, exc: BaseException) -> str:
        """Why SQLAlchemy refused the URL. Its parser's own words can quote a part of the URL (the
        "port" of ``user:secret`` without ``@``): where the URL does not parse, ours, which never do."""
        try:
            parse_db_url(self.url)
        except ValueError as own:
            return str(own)
        return self._scrub(exc)

    def _scrub(self, exc: BaseException) -> str:
        """The first line of a driver's message without any URL in it, nor any text of the URL that
        may be a password (``secrets_of``), as typed or percent-encoded."""
        from urllib.parse import quote, quote_plus

        text = _URL_IN_MESSAGE.sub("<URL>", str(exc).split("\n")[0])
        forms = {
            form
            for secret in secrets_of(self.url)
            for form in (secret, quote(secret, safe=""), quote_plus(secret), quote(secret), quote(secret, safe=" +"))
        }
        for form in sorted(forms, key=len, reverse=True):  # SQLAlchemy's own rendering among them
            text = text.replace(form, "***")
        return text

    def _error(self, exc: BaseException, what: str) -> SourceError:
        return SourceError("%s failed at %s: %s", what, redact_db_url(self.url), self._scrub(exc))

    def _adbc(self) -> tuple[str, str] | None:
        """The libpq URI and the query when ADBC serves this source: PostgreSQL through one of
        SQLAlchemy's drivers for it, no bound parameters, ADBC installed. Decided on the URL as
        SQLAlchemy reads it, without SQLAlchemy."""
        if self._adbc_query is None:
            return None
        try:
            url = parse_db_url(self.url)
            uri = adbc.uri_of(url)
        except ValueError:
            return None  # SQLAlchemy's path says what is wrong with it
        if url.driver not in adbc.DRIVERS or not adbc.available(url.dialect, {}):
            return None
        return uri, self._adbc_query

    def _connections(self, uri: str) -> adbc.Connections:
        if self._adbc_connections is None:
            self._adbc_connections = adbc.Connections(uri)
        return self._adbc_connections

    def _through_adbc(self, uri: str, work: Callable[[AdbcConnection], T]) -> T:
        """``work`` on an ADBC connection, the driver's errors worded as the cursor path words them."""
        try:
            with self._connections(uri).connection() as connection:
                return work(connection)
        except (UsageError, SourceError, MissingExtra):
            raise
        except Exception as exc:
            raise self._error(exc, "the query") from None

    def _scalar(self, template: str) -> Any:
        """The first value of ``template`` with this source's query as its ``{query}``."""
        served = self._adbc()
        if served is not None:
            sql = template.format(query=served[1])
            return self._through_adbc(served[0], lambda connection: adbc.scalar(connection, sql))
        engine = self.engine  # first: a missing SQLAlchemy is the extra's line, not an import's traceback
        from sqlalchemy import text

        try:
            with engine.connect() as conn:
                return conn.execute(text(template.format(query=self.query)), {}).scalar()
        except UsageError:
            raise
        except Exception as exc:
            raise self._error(exc, "the query") from None

    def preflight(self) -> None:
        """Connect, and check the query's columns against the column or template before anything is written."""
        columns = "SELECT * FROM ({query}) AS bloomctl_cols WHERE 1 = 0"
        served = self._adbc()
        if served is not None:
            sql = columns.format(query=served[1])
            names, kinds = self._through_adbc(served[0], lambda connection: adbc.schema_of(connection, sql))
            fmt = ItemFormatter(names, self.column, self.template, self.prefix)
            inexact = adbc.inexact(fmt, kinds)
            if inexact is not None:  # psycopg's paths read these columns: their driver must load now
                self._engine = self._engine_for(names[inexact], kinds[inexact])
            self.selected = names
            return
        engine = self.engine
        from sqlalchemy import text

        try:
            with engine.connect() as conn:
                names = list(conn.execute(text(columns.format(query=self.query)), self.params).keys())
        except (UsageError, SourceError, MissingExtra):
            raise
        except Exception as exc:
            raise self._error(exc, "the query") from None
        ItemFormatter(names, self.column, self.template, self.prefix)
        self.selected = names

    def _engine_for(self, column: str, kind: str) -> Engine:
        """The engine for a column ADBC does not read exactly; without its driver, an error that
        says which column needs it."""
        try:
            return self.engine
        except MissingExtra as exc:
            raise MissingExtra(
                "the column %r is of type %s, which only psycopg reads exactly: " + exc.template,
                column,
                kind,
                *exc.values,
                extra=exc.extra,
                install=exc.install,
            ) from None

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
        return int(self._scalar("SELECT COUNT(*) FROM ({query}) AS bloomctl_count"))

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
        return self._where(condition, self.params, condition)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_engine"] = None  # engines and connections do not cross processes: each part makes its own
        state["_adbc_connections"] = None
        return state

    def _narrowed(self, column: str, operator: str, moment: Any) -> SqlSource:
        column = self.check_column_name(column)
        literal = adbc.literal(moment)
        adbc_condition = None if literal is None else f"{column} {operator} {literal}"
        narrowed = self._where(f"{column} {operator} :moment", {"moment": moment}, adbc_condition)
        narrowed._engine, narrowed._adbc_connections = self._engine, self._adbc_connections
        return narrowed

    def _where(self, condition: str, params: dict[str, Any] | None, adbc_condition: str | None) -> SqlSource:
        """The same recipe over the query's rows that meet ``condition`` (``adbc_condition`` as
        ADBC runs it, without bound parameters; None: ADBC cannot)."""
        narrowed = SqlSource(
            self.url,
            f"SELECT * FROM ({self.query}) AS bloomctl_src WHERE {condition}",
            column=self.column,
            template=self.template,
            prefix=self.prefix,
            params=params,
        )
        if self._adbc_query is None or adbc_condition is None:
            narrowed._adbc_query = None
        else:
            narrowed._adbc_query = f"SELECT * FROM ({self._adbc_query}) AS bloomctl_src WHERE {adbc_condition}"
        return narrowed

    def batches(self, size: int) -> Iterator[list[bytes]]:
        for batch in self.fast_batches(size):
            yield item_list(batch)

    def fast_batches(self, size: int) -> Iterator[Batch]:
        """Arrow batches through ADBC where it renders every value the recipe uses exactly as the
        cursor path does; else psycopg's COPY (text and integer columns) or the cursor."""
        self.stats = SourceStats()
        try:
            served = self._adbc()
            if served is not None and (yield from self._adbc_batches(*served, size)):
                return
            fast = (
                pgcopy.copy_column(self.engine, self.query, self.column, self.prefix) if self._copy_possible() else None
            )
            if fast is not None:
                yield from pgcopy.copy_batches(self.engine, self.query, size, *fast, self.stats)
            else:
                yield from self._cursor_batches(size)
        except (UsageError, SourceError, MissingExtra, GeneratorExit):
            raise
        except Exception as exc:  # the driver's errors, one line each and without the password
            raise self._error(exc, "the query") from None

    def _adbc_batches(self, uri: str, query: str, size: int) -> Generator[Batch, None, bool]:
        """The items through ADBC; False, having read none, where a column the recipe uses has a
        type ADBC does not render as the cursor path does."""
        with self._connections(uri).connection() as connection:
            names, kinds = adbc.column_types(connection, query)
            fmt = ItemFormatter(names, self.column, self.template, self.prefix)
            if not adbc.exact(fmt, kinds):
                return False
            for items in adbc.batches(connection, query, names, fmt, self.stats):
                for start in range(0, len(items), size):
                    yield items.slice(start, size)
        return True

    def _copy_possible(self) -> bool:
        """PostgreSQL through psycopg, without bound parameters: COPY ... TO STDOUT is 2x faster."""
        return pgcopy.available(self.engine, self.params, self.template)

    def _cursor_batches(self, size: int) -> Iterator[list[bytes]]:
        engine = self.engine
        from sqlalchemy import text

        with engine.connect() as conn, cancellable(_cancel_of(conn)):
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
