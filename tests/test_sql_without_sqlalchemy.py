"""A PostgreSQL source that ADBC serves never imports SQLAlchemy: its URL is read by SQLAlchemy's
rules without it (held here to ``make_url`` over many URLs), and the columns, the count, the
database's clock and the catch-up's narrowed queries go through ADBC. MariaDB and SQLite keep
SQLAlchemy's path. The rebuilds run in a fresh interpreter, which then says whether it loaded
SQLAlchemy. libpq is given the options SQLAlchemy's psycopg dialect connects with (several hosts
included), and no message shows a secret of the URL."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote, quote_plus
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy
from sqlalchemy.engine import make_url

from bloomctl.errors import SourceError, UsageError
from bloomctl.sources import SqlSource, adbc
from bloomctl.sources.urls import libpq_uri, parse_db_url
from tests.fixtures.sql import MYSQL_URL, PG_URL
from tests.helpers.files import read

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "p@ss:w/o%rd?#1 +x"  # trust auth takes any password
PASSWORD_FORMS = (PASSWORD, quote(PASSWORD, safe=""), quote_plus(PASSWORD), "p@ss", "w/o%rd", "rd?#1", "%rd", " +x")

URLS = [
    "postgresql://u:p@h/db",
    "postgresql+psycopg://scott:tiger@localhost:5432/test",
    "postgresql+psycopg2://u:p%40ss%3Aw%2Fo%25rd%3F@h:1/db",  # @ : / % ? encoded
    "postgresql://u:pa:ss@h/db",  # a raw colon in the password
    "postgresql://u:p/ss@h/db",  # a raw slash: no user, SQLAlchemy reads this differently
    "postgresql://u:p?ss@h/db",
    "postgresql://u:p%zz@h/db",  # a broken escape stays as typed
    "postgresql://u:p+q%2B%20r@h/db",  # '+' is not a space in the user part
    "postgresql://u:@h/db",  # an empty password
    "postgresql://:pw@h/db",  # an empty user
    "postgresql://@h/db",
    "postgresql://u@h/db",
    "postgresql://h/db",
    "postgresql://h",
    "postgresql:///db",
    "postgresql://",
    "postgresql://u:p@[::1]:5433/db",
    "postgresql://u:p@[fe80::1%25eth0]/db",
    "postgresql://u@[2001:db8::7]/db?sslmode=require",
    "postgresql://u@h:0/db",
    "postgresql://u@h:/db",  # refused: an empty port
    "postgresql://u@h:abc/db",  # refused
    "postgresql://u@h:١٢/db",  # int() reads other scripts' digits
    "postgresql://u@/db?host=/var/run/postgresql",
    "postgresql://u@/db?host=%2Ftmp&port=5433",
    "postgresql://u@h/db?sslmode=verify-full&sslrootcert=/etc/ca.pem&application_name=a+b%20c",
    "postgresql://u@h/db?host=a&host=b&host=c",  # a key given three times
    "postgresql://u:pw@/db?host=127.0.0.1:5432",  # a host and its port in the query
    "postgresql://u@/db?host=a:5432&host=b:5433",  # several, each with its port
    "postgresql://u@/db?host=a,b&port=5432,5433",
    "postgresql://u@h:5433/db?host=a&host=b",
    "postgresql://u@/db?host=a:1&port=2",  # refused by the dialect: two ways of giving ports
    "postgresql://u@/db?host=a,b,c&port=1,2",  # refused: three hosts, two ports
    "postgresql://u@/db?host=a:1:2&host=b:3:4",  # refused
    "postgresql://u@/db?sslmode=disable&sslmode=require",  # a key twice that libpq takes once
    "postgresql://u@[fe80::1%eth0]/db",  # a zone id, raw
    "postgresql://u@h/db?a=1&b=&c",  # blank values are dropped
    "postgresql://u@h/db?",
    "postgresql://u@h/db?options=-c%20TimeZone%3DAmerica/New_York",
    "postgresql://u@h/d%20b%2Fx?application_name=%26%3D",
    "postgresql://u@h/db#fragment",
    "postgresql://u@h/db/extra",
    "postgres://u:p@h/db",
    "POSTGRESQL://u@h/db",
    "postgresql+asyncpg://u@h/db",
    "mysql+pymysql://root:s%40cret@127.0.0.1:3306/test?charset=utf8mb4",
    "mariadb+pymysql://root@127.0.0.1/test",
    "sqlite://",
    "sqlite:///:memory:",
    "sqlite:////tmp/x.db",
    "sqlite:///relative/p%20ath.db",
    "postgres ql://h/db",  # refused: no scheme SQLAlchemy reads
    "://h/db",
    "postgresql:/h/db",
    "nonsense",
    "",
    "postgresql://ü:ß@hôst/dä?ä=ö",
    "postgresql://u:p@h:5432:6543/db",
    "postgresql://u:p@[::1/db",
    "postgresql://u:p@h?db",
]


def _sqlalchemys(url: str):
    try:
        parsed = make_url(url)
    except Exception as exc:
        return type(exc).__name__
    return (*tuple(parsed)[:6], dict(parsed.query))


def _ours(url: str):
    try:
        parsed = parse_db_url(url)
    except ValueError as exc:
        return "ArgumentError" if "Could not parse" in str(exc) else type(exc).__name__
    return (*tuple(parsed)[:6], parsed.query)


def _random_urls(count: int, seed: int = 20261203) -> list[str]:
    """URLs made of the characters that decide where a part ends, raw and percent-encoded."""
    rng = random.Random(seed)
    pieces = ["a", "Z", "0", "9", "_", "-", ".", "~", " ", "+", "@", ":", "/", "?", "#", "&", "=", "%", "%40", "%3A"]
    pieces += ["%2F", "%3F", "%25", "%20", "%2B", "%zz", "[", "]", "::1", "é", "%C3%A9", "\\", ";", ","]

    def part(limit: int) -> str:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(0, limit)))

    urls = []
    for _ in range(count):
        scheme = rng.choice(["postgresql", "postgresql+psycopg", "mysql+pymysql", "sqlite", "pg sql", "x+y+z"])
        text = f"{scheme}://"
        if rng.random() < 0.8:
            text += part(5) + (f":{part(8)}" if rng.random() < 0.7 else "") + "@"
        text += rng.choice(["h", "127.0.0.1", "[::1]", "[fe80::1%25x]", "", part(3)])
        text += rng.choice(["", ":5432", ":", ":x", f":{part(2)}"])
        text += rng.choice(["", "/db", f"/{part(4)}"])
        text += rng.choice(["", "?", f"?{part(3)}={part(3)}", f"?k={part(2)}&k={part(2)}&j={part(2)}"])
        urls.append(text if rng.random() < 0.9 else part(12))
    return urls


@pytest.mark.parametrize("url", URLS)
def test_the_url_is_read_as_sqlalchemy_reads_it(url):
    assert _ours(url) == _sqlalchemys(url)


def test_random_urls_are_read_as_sqlalchemy_reads_them():
    differ = [url for url in _random_urls(4000) if _ours(url) != _sqlalchemys(url)]
    assert differ == []


def _libpq_reads(uri: str) -> dict[str, str]:
    from psycopg.conninfo import conninfo_to_dict

    return {key: str(value) for key, value in conninfo_to_dict(uri).items() if value}


def _what_sqlalchemy_connects_with(url: str) -> dict[str, str] | str:
    """The options SQLAlchemy's psycopg dialect hands the driver for ``url`` (empty ones left out),
    or "refused" where it refuses the URL or would hand it a key given twice (a tuple)."""
    parsed = make_url(url).set(drivername="postgresql+psycopg")
    try:
        _args, options = sqlalchemy.create_engine(parsed).dialect.create_connect_args(parsed)
    except (ValueError, sqlalchemy.exc.ArgumentError):
        return "refused"
    options.pop("context", None)
    if not all(isinstance(value, str | int) for value in options.values()):
        return "refused"
    return {key: str(value) for key, value in options.items() if value != ""}


def _what_we_connect_with(url: str) -> dict[str, str] | str:
    try:
        return _libpq_reads(libpq_uri(parse_db_url(url)))
    except ValueError:
        return "refused"


LIBPQ_KEYS = {"host", "port", "sslmode", "sslrootcert", "application_name", "options", "client_encoding"}
LIBPQ_URLS = [
    url
    for url in URLS
    if url.lower().startswith("postgres")
    and isinstance(_sqlalchemys(url), tuple)
    and set(make_url(url).query) <= LIBPQ_KEYS
]


@pytest.mark.parametrize("url", LIBPQ_URLS)
def test_libpq_reads_the_uri_as_sqlalchemys_dialect_connects(url):
    """Every option percent-encoded whole: libpq decodes the URI to the strings SQLAlchemy's psycopg
    dialect hands psycopg, a space in a password, a user or an option included (``+`` would have
    stayed a plus), the query's hosts and ports as its comma lists (``host=h:6432`` is host h,
    port 6432; libpq would have read "h:6432" as a host name), a zone id as it was typed."""
    assert _what_we_connect_with(url) == _what_sqlalchemy_connects_with(url)
    with contextlib.suppress(ValueError):  # SQLAlchemy's URL has the same fields
        assert libpq_uri(parse_db_url(url)) == libpq_uri(make_url(url))


def test_random_urls_connect_as_sqlalchemys_dialect_connects():
    """Refusals included: a URL the dialect refuses goes to SQLAlchemy's path, which says why."""
    urls = [url for url in _random_urls(4000) if url.lower().startswith("postgres")]
    urls += [f"postgresql://u@/db?{query}" for query in _random_host_queries(1500)]
    checked, differ = 0, []
    for url in urls:
        parsed = _sqlalchemys(url)
        if not isinstance(parsed, tuple) or not set(parsed[6]) <= LIBPQ_KEYS:
            continue
        checked += 1
        if _what_we_connect_with(url) != _what_sqlalchemy_connects_with(url):
            differ.append(url)
    assert differ == [] and checked > 1000


def _random_host_queries(count: int, seed: int = 5) -> list[str]:
    rng = random.Random(seed)
    pieces = ["a", "b.c", "1", "5432", ":", ",", "", "[::1]", "%3A", "%2C", "x-y", "٥"]

    def value() -> str:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(1, 4)))

    queries = []
    for _ in range(count):
        pairs = [(rng.choice(["host", "host", "port", "sslmode"]), value()) for _ in range(rng.randint(1, 4))]
        queries.append("&".join(f"{key}={text}" for key, text in pairs))
    return queries


def test_libpq_reads_random_users_passwords_and_databases_as_sqlalchemy_did():
    rng = random.Random(7)
    pieces = [
        "a",
        " ",
        "+",
        "@",
        ":",
        "/",
        "?",
        "#",
        "&",
        "=",
        "%",
        "%40",
        "%2F",
        "%25",
        "%20",
        "%2B",
        "%zz",
        "é",
        "\\",
    ]
    checked = 0
    for _ in range(1500):
        user, password, database = ("".join(rng.choices(pieces, k=rng.randint(1, 6))) for _ in range(3))
        url = f"postgresql+psycopg://{user}:{password}@h:5432/{database}?application_name={password}"
        parsed = _sqlalchemys(url)
        if not isinstance(parsed, tuple) or parsed[3] != "h" or not set(parsed[6]) <= LIBPQ_KEYS:
            continue
        assert _what_we_connect_with(url) == _what_sqlalchemy_connects_with(url), url
        checked += 1
    assert checked > 500


def test_adbc_forces_utf8_whatever_the_url_says():
    uri = adbc.uri_of(parse_db_url("postgresql://u:p%20w@h/db?client_encoding=latin1&sslmode=disable"))
    assert _libpq_reads(uri) == {"user": "u", "password": "p w", "host": "h", "dbname": "db"} | {
        "client_encoding": "UTF8",
        "sslmode": "disable",
    }


# --- on the real PostgreSQL ----------------------------------------------------------------------


@pytest.fixture
def adbc_installed():
    pytest.importorskip("adbc_driver_postgresql")
    pytest.importorskip("pyarrow")


def _pg_url(password: str | None = PASSWORD, **parts: str | int) -> str:
    """The test database's URL with ``password`` percent-encoded (trust auth takes any), and any
    of user, host, port, database replaced."""
    parsed = make_url(PG_URL)
    user = quote(str(parts.get("user", parsed.username or "postgres")), safe="")
    secret = f":{quote(password, safe='')}" if password else ""
    host, port = parts.get("host", parsed.host), parts.get("port", parsed.port)
    address = f"{host}:{port}" if port else f"{host}"
    return f"postgresql://{user}{secret}@{address}/{parts.get('database', parsed.database)}"


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2024, 3, 1, 12, 30, 15, 123456, tzinfo=UTC),
        datetime(2024, 3, 1, 12, 30, 15, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        datetime(2024, 11, 3, 1, 30, 0, 1, tzinfo=ZoneInfo("America/New_York")),
        datetime(1999, 12, 31, 23, 59, 59, 999999),
        date(2024, 2, 29),
        datetime(1, 1, 1, 2, 0, tzinfo=timezone(timedelta(hours=5))),  # before year 1 in UTC
        datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5))),  # after 9999 in UTC
    ],
    ids=["utc", "plus-0530", "new-york", "naive", "date", "year-1", "year-9999"],
)
def test_a_literal_is_what_psycopg_binds(pg_engine, moment):
    """The narrowing's moment, written into ADBC's query, has the type and the value the cursor
    path's bound parameter has."""
    _same_as_bound(moment)
    assert adbc.literal(7) is None and adbc.literal("2024-01-01") is None  # these keep the bound parameter


def test_a_pandas_timestamp_loses_its_nanoseconds_as_psycopg_drops_them(pg_engine):
    pd = pytest.importorskip("pandas")
    for moment in (pd.Timestamp("2024-01-01 00:00:00.123456999"), pd.Timestamp("2024-01-01 00:00:00.999999999+01:00")):
        _same_as_bound(moment)
        assert ".123456'" in adbc.literal(moment) or ".999999+" in adbc.literal(moment)


def _same_as_bound(moment: object) -> None:
    """The literal's type and text (the session's, beyond Python's years too) are the bound parameter's."""
    import psycopg

    literal = adbc.literal(moment)
    assert literal is not None
    with psycopg.connect(libpq_uri(parse_db_url(_pg_url(None)))) as conn:
        bound = conn.execute("SELECT pg_typeof(%s)::text, %s::text", (moment, moment)).fetchone()
        written = conn.execute(f"SELECT pg_typeof({literal})::text, {literal}::text").fetchone()
    assert written == bound, literal


@pytest.fixture
def changes(pg_engine):
    """A table of 1,000 ids changed a day ago and 3 changed an hour from now, in three column types."""
    table = f"bloomctl_{uuid.uuid4().hex[:10]}"
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {table} (id text, updated_at timestamptz, local_at timestamp, day date)")
        conn.exec_driver_sql(
            f"INSERT INTO {table} SELECT 'u' || g, now() - interval '1 day', now() - interval '1 day', "
            "current_date - 1 FROM generate_series(1, 1000) g"
        )
        conn.exec_driver_sql(
            f"INSERT INTO {table} SELECT 'late' || g, now() + interval '1 hour', now() + interval '1 hour', "
            "current_date + 1 FROM generate_series(1, 3) g"
        )
    yield table
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {table}")


def test_adbc_and_sqlalchemy_narrow_to_the_same_rows(adbc_installed, changes, monkeypatch):
    """since/before through ADBC (the moment a literal) and through the cursor (a bound parameter)
    give the same rows, on a session whose time zone is not the server's (a ``timestamp`` column is
    compared in it); the count and the clock agree too."""
    url = _pg_url() + "?options=" + quote("-c TimeZone=America/New_York", safe="")
    query = f"SELECT id, updated_at, local_at, day FROM {changes}"
    now = SqlSource(url, query).now()
    moments = [now, now.replace(tzinfo=None), now.astimezone(ZoneInfo("Asia/Kolkata")), now.date()]

    def narrowed() -> list[object]:
        source = SqlSource(url, query)
        seen: list[object] = [source.count()]
        for column in ("updated_at", "local_at", "day"):
            for moment in moments:
                seen.append(sorted(read(source.since(column, moment), 500)))
                seen.append(len(read(source.before(column, moment), 500)))
        return seen

    through_adbc = narrowed()
    monkeypatch.setattr(adbc, "available", lambda dialect, params: False)
    assert narrowed() == through_adbc
    assert through_adbc[0] == 1003 and through_adbc[1] == [f"late{i}".encode() for i in (1, 2, 3)]
    assert abs(SqlSource(url, query).now() - now) < timedelta(minutes=1)


def test_connections_are_reused_but_not_one_that_stopped_part_way(adbc_installed, pg_engine):
    """Opening an ADBC connection reads the server's type catalogue: the source keeps its
    connections, each query in a transaction of its own (the clock moves), and one left in the
    middle of a query is closed instead."""
    import time

    source = SqlSource(_pg_url(), "SELECT g::text AS id FROM generate_series(1, 200000) g")
    source.preflight()
    pool = source._adbc_connections
    assert pool is not None and len(pool._idle) == 1
    first = pool._idle[0]
    assert source.count() == 200_000 and pool._idle == [first]
    clock = source.now()
    time.sleep(0.02)
    assert source.since("id", clock)._adbc_connections is pool and source.now() > clock
    batches = source.fast_batches(1000)
    next(batches)
    assert pool._idle == []
    batches.close()
    assert pool._idle == []  # closed mid-COPY, not put back
    assert source.count() == 200_000 and len(pool._idle) == 1 and pool._idle[0] is not first


@pytest.mark.parametrize(
    "hosts",
    ["host={host}:{port}", "host={host}:1&host={host}:{port}", "host={host},{host}&port=1,{port}"],
    ids=["host-and-port", "two-hosts", "two-hosts-comma-lists"],
)
def test_hosts_and_ports_in_the_query(adbc_installed, pg_engine, monkeypatch, hosts):
    """``?host=h:p`` and several hosts (the first refusing connections) reach libpq as SQLAlchemy's
    dialect hands them to psycopg: through ADBC, and through psycopg's COPY, which builds its
    URI alike."""
    parsed = make_url(PG_URL)
    query = hosts.format(host=parsed.host, port=parsed.port or 5432)
    url = f"postgresql://{parsed.username}:{quote(PASSWORD, safe='')}@/{parsed.database}?{query}"
    source = SqlSource(url, "SELECT g::text AS id FROM generate_series(1, 3) g")
    assert source.count() == 3 and source._adbc_connections is not None  # (ADBC served it)
    assert sorted(read(source, 10)) == [b"1", b"2", b"3"]
    monkeypatch.setattr(adbc, "available", lambda dialect, params: False)
    copied = SqlSource(url, "SELECT g::text AS id FROM generate_series(1, 3) g")
    assert copied._copy_possible() and sorted(read(copied, 10)) == [b"1", b"2", b"3"]


def test_a_unix_socket_in_the_query(adbc_installed, pg_engine):
    """``?host=/path`` (a socket directory, with no host before the path) reaches libpq as it reaches psycopg."""
    socket = Path("/var/run/postgresql")
    if not (socket / ".s.PGSQL.5432").exists() or make_url(PG_URL).port not in (None, 5432):
        pytest.skip("no PostgreSQL socket in /var/run/postgresql for the test database")
    url = f"postgresql://{make_url(PG_URL).username}@/{make_url(PG_URL).database}?host=%2Fvar%2Frun%2Fpostgresql"
    assert SqlSource(url, "SELECT 1 AS one").count() == 1
    assert read(SqlSource(url, "SELECT 'x'::text AS t"), 10) == [b"x"]


# --- rebuilds in a fresh interpreter -------------------------------------------------------------

RUN = """
import sys
from bloomctl.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("sqlalchemy loaded:", "sqlalchemy" in sys.modules)
sys.exit(code)
"""


def _rebuild(redis_url: str, db_url: str, *args: str) -> tuple[subprocess.CompletedProcess[str], bool]:
    """`bloomctl rebuild` through the CLI's main in a fresh interpreter; the URL in the environment."""
    env = {**os.environ, "BLOOMCTL_DB_URL": db_url}
    env.pop("BLOOMCTL_URL", None)
    env.pop("BLOOMCTL_PASSWORD", None)
    argv = [sys.executable, "-c", RUN, "--url", redis_url, "rebuild", *args]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    stdout, _sep, last = result.stdout.rstrip("\n").rpartition("\n")
    assert last.startswith("sqlalchemy loaded: "), result
    result.stdout = stdout
    return result, last.endswith("True")


def _no_password(result: subprocess.CompletedProcess[str]) -> None:
    shown = result.stdout + result.stderr
    for form in PASSWORD_FORMS:
        assert form not in shown, (form, shown)


def test_a_rebuild_with_catch_up_and_full_verification_never_imports_sqlalchemy(adbc_installed, plain, changes):
    """Count (capacity auto), columns, load, the database's clock, the catch-up (the 3 rows changed
    after the load's start) and `--verify all` (the rows from before it): all through ADBC."""
    query = f"SELECT id, updated_at FROM {changes}"
    args = ["users", "--from-sql", query, "--capacity", "auto", "-e", "1%", "--since-column", "updated_at"]
    result, loaded = _rebuild(plain.url, _pg_url(), *args, "--verify", "all", "--swap", "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["counted"], report["items_read"], report["catchup_rows"]) == (1003, 1003, 3)
    assert (report["verify_mode"], report["verified"], report["swapped"]) == ("all", 1000, True)
    assert "catching up on rows with updated_at" in result.stderr
    assert not loaded
    _no_password(result)
    dry, loaded = _rebuild(plain.url, _pg_url(), "users", "--from-sql", query, "-c", "2000", "-e", "1%", "--dry-run")
    assert dry.returncode == 0 and not loaded, dry.stderr


def test_a_column_adbc_cannot_render_takes_sqlalchemys_path(adbc_installed, plain, changes):
    """A timestamp item column is read by psycopg's cursor, as without ADBC: SQLAlchemy is loaded."""
    query = f"SELECT updated_at FROM {changes}"
    result, loaded = _rebuild(plain.url, _pg_url(), "users", "--from-sql", query, "-c", "2000", "-e", "1%")
    assert result.returncode == 0 and loaded, result.stderr


@pytest.mark.parametrize(
    ("what", "exit_code"),
    [("unreachable", 8), ("no role", 8), ("no database", 8), ("no table", 8), ("no column", 2)],
)
def test_errors_through_adbc_show_no_password_and_no_sqlalchemy(adbc_installed, plain, pg_engine, what, exit_code):
    url, query, extra = _pg_url(), "SELECT 'a'::text AS id", []
    if what == "unreachable":
        url = _pg_url(host="127.0.0.1", port=1)
    elif what == "no role":
        url = _pg_url(user="bloomctl_nobody")
    elif what == "no database":
        url = _pg_url(database="bloomctl_no_such_db")
    elif what == "no table":
        query = "SELECT id FROM bloomctl_no_such_table"
    else:
        extra = ["--column", "nope"]
    args = ["users", "--from-sql", query, "-c", "100", "-e", "1%", *extra]
    result, loaded = _rebuild(plain.url, url, "--log-format", "json", *args, "--format", "json")
    assert result.returncode == exit_code, result.stderr
    assert not loaded
    assert ("failed at postgresql+psycopg://" in result.stderr) == (exit_code == 8), result.stderr
    _no_password(result)


def test_the_source_error_names_no_password(adbc_installed):
    """The library's own exception, before the CLI words it."""
    with pytest.raises(SourceError) as raised:
        SqlSource(_pg_url(host="127.0.0.1", port=1), "SELECT 1").count()
    assert "***" in str(raised.value)
    for form in PASSWORD_FORMS:
        assert form not in str(raised.value)


SECRET = "s3cret pw+x"
LEAKS = ("s3cret", "client_encoding", "postgresql://?")  # the secret in any form, or the libpq URI
SECRET_URLS = [
    "postgresql://postgres@[::1]x]/test?password={q}",  # libpq quoted the URI it could not parse
    "postgresql://postgres@127.0.0.1/test?sslpassword={q}&sslmode=zz",
    "postgresql://postgres@127.0.0.1/test?ssl%70assword={q}&sslmode=zz",  # the key percent-encoded
    "postgresql://postgres@127.0.0.1/test?password={q}&password={q}2&sslmode=zz",
    "postgresql://postgres@127.0.0.1:1/test?password={q}",
    "postgresql://postgres:a%00{q}@127.0.0.1/test",  # libpq quotes the encoded value it refuses
    "postgresql://user:{q}",  # no '@': SQLAlchemy reads host 'user', port '<the secret>'
    "postgresql://user:{q}/test",
]


def _secret_url(form: str) -> str:
    return form.format(q=quote(SECRET, safe=""))


def _no_secret(text: str) -> None:
    for leak in LEAKS:
        assert leak not in text, (leak, text)


@pytest.mark.parametrize("form", SECRET_URLS)
def test_no_message_shows_a_secret_of_the_url(adbc_installed, plain, form):
    """A password in the query (``password``, ``sslpassword``), or before a missing ``@``, shows in
    no message: not in the URL the message names, nor in the driver's or the parser's words."""
    args = ["users", "--from-sql", "SELECT 'a'::text AS id", "-c", "10", "-e", "1%"]
    result, _loaded = _rebuild(plain.url, _secret_url(form), *args)
    assert result.returncode in (2, 8), result.stderr
    assert result.stderr.startswith("bloomctl: error: "), result.stderr
    _no_secret(result.stdout + result.stderr)


@pytest.mark.parametrize("form", SECRET_URLS)
@pytest.mark.parametrize("path", ["adbc", "sqlalchemy"])
def test_the_source_error_shows_no_secret_of_the_url(adbc_installed, pg_engine, monkeypatch, form, path):
    if path == "sqlalchemy":
        monkeypatch.setattr(adbc, "available", lambda dialect, params: False)
    with pytest.raises((SourceError, UsageError)) as raised:
        SqlSource(_secret_url(form), "SELECT 'a'::text AS id").count()
    _no_secret(str(raised.value))


def test_a_libpq_message_quoting_the_uri_is_not_shown(adbc_installed):
    """libpq quotes a URI it cannot parse, password and all (as it did the URI this module wrote
    before it wrote every part in the query): no URL of a driver's message is shown."""
    url = _secret_url("postgresql://postgres@[::1]x]/test?password={q}")
    with pytest.raises(Exception) as raised:
        adbc.connect(url)
    assert url in str(raised.value)  # (what libpq says)
    message = SqlSource(url, "SELECT 1")._scrub(raised.value)
    assert "<URL>" in message
    _no_secret(message)


@pytest.fixture
def mysql_changes(mysql_engine):
    table = f"bloomctl_{uuid.uuid4().hex[:10]}"
    with mysql_engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {table} (id VARCHAR(20), updated_at DATETIME(6))")
        conn.execute(
            sqlalchemy.text(f"INSERT INTO {table} VALUES (:id, NOW() - INTERVAL 1 DAY)"),
            [{"id": f"u{i}"} for i in range(1, 1001)],
        )
        conn.exec_driver_sql(f"INSERT INTO {table} VALUES ('late1', NOW() + INTERVAL 1 HOUR)")
    yield table
    with mysql_engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {table}")


def test_mariadb_keeps_sqlalchemys_path(plain, mysql_changes):
    query = f"SELECT id, updated_at FROM {mysql_changes}"
    args = ["users", "--from-sql", query, "--capacity", "auto", "-e", "1%", "--since-column", "updated_at"]
    result, loaded = _rebuild(plain.url, MYSQL_URL, *args, "--verify", "all", "--swap", "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["counted"], report["catchup_rows"], report["verified"], report["swapped"]) == (1001, 1, 1000, True)
    assert loaded


def test_sqlite_keeps_sqlalchemys_path(plain, tmp_path):
    path = tmp_path / "users.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE users (id TEXT)")
        conn.exec_driver_sql("INSERT INTO users VALUES ('a'), ('b')")
    engine.dispose()
    result, loaded = _rebuild(
        plain.url, f"sqlite:///{path}", "users", "--from-sql", "SELECT id FROM users", "-c", "10", "-e", "1%"
    )
    assert result.returncode == 0 and loaded, result.stderr
