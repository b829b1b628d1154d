"""Sources on real files and real databases: CSV variants, SQLite, PostgreSQL, MariaDB; and what a
rebuild checks of its source before it writes anything (a column beyond the rows, a --since-column
the query does not select, a database URL and its password)."""

from __future__ import annotations

import gzip
import io
import uuid

import pytest
import sqlalchemy

from bloomctl.errors import SourceError, UsageError
from bloomctl.keys import KeyFamily
from bloomctl.sources import CsvSource, SourceStats, SqlSource, normalise_db_url, rebatch
from tests.helpers.files import read, write
from tests.helpers.matrix import SIGNALS_LOCKS_ERRORS

PEOPLE = "id,name,email\n1,alice,a@x\n2,bob,b@x\n3,carol,c@x\n"


def test_header_column_by_name_and_position(tmp_path):
    path = write(tmp_path / "p.csv", PEOPLE)
    assert read(CsvSource(path)) == [b"1", b"2", b"3"]
    assert read(CsvSource(path, column="name")) == [b"alice", b"bob", b"carol"]
    assert read(CsvSource(path, column="3")) == [b"a@x", b"b@x", b"c@x"]
    with pytest.raises(UsageError, match="no column 'nope'; the header has: id, name, email"):
        read(CsvSource(path, column="nope"))


def test_no_header(tmp_path):
    path = write(tmp_path / "p.csv", "1,alice\n2,bob\n")
    assert read(CsvSource(path, header=False, column="2")) == [b"alice", b"bob"]
    with pytest.raises(UsageError, match="by position"):
        read(CsvSource(path, header=False, column="name"))


def test_gzip_crlf_bom_and_delimiter(tmp_path):
    text = "\ufeffid;name\r\n1;alice\r\n2;bob\r\n"
    path = tmp_path / "p.csv.gz"
    path.write_bytes(gzip.compress(text.encode("utf-8")))
    source = CsvSource(str(path), column="name", delimiter=";")
    assert read(source) == [b"alice", b"bob"]
    assert source.count() == 2


def test_stdin(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(PEOPLE.encode())))
    source = CsvSource("-", column="name")
    assert read(source) == [b"alice", b"bob", b"carol"]
    with pytest.raises(UsageError, match="not stdin"):
        source.count()


def test_template_and_prefix(tmp_path):
    path = write(tmp_path / "p.csv", PEOPLE)
    assert read(CsvSource(path, template="user:{id}:{name}")) == [b"user:1:alice", b"user:2:bob", b"user:3:carol"]
    assert read(CsvSource(path, template="{2}@{1}")) == [b"alice@1", b"bob@2", b"carol@3"]
    assert read(CsvSource(path, column="name", prefix="u:")) == [b"u:alice", b"u:bob", b"u:carol"]
    with pytest.raises(UsageError):
        read(CsvSource(path, template="x:{missing}"))
    with pytest.raises(UsageError):
        CsvSource(path, template="{id}", prefix="x").batches(1).__next__()


def test_blank_values_are_skipped_and_counted(tmp_path):
    path = write(tmp_path / "p.csv", "id,name\n1,alice\n2,\n\n3,carol\n4,\n")
    source = CsvSource(path, column="name")
    assert read(source) == [b"alice", b"carol"]
    assert (source.stats.blank, source.stats.items) == (3, 2)


def test_quoted_fields_with_delimiters_and_newlines(tmp_path):
    path = write(tmp_path / "p.csv", 'id,name\n1,"smith, john"\n2,"multi\nline"\n3,plain\n')
    assert read(CsvSource(path, column="name")) == [b"smith, john", b"multi\nline", b"plain"]


def test_unicode_and_other_encodings(tmp_path):
    path = write(tmp_path / "p.csv", "name\nünï\n日本\n")
    assert read(CsvSource(path)) == ["ünï".encode(), "日本".encode()]
    latin = write(tmp_path / "l.csv", "name\ncafé\n".encode("latin-1"))
    assert read(CsvSource(latin, encoding="latin-1")) == ["café".encode()]  # stored as UTF-8


def test_bad_rows_stop_with_file_and_line(tmp_path):
    path = write(tmp_path / "p.csv", "id,name\n1,alice\n2\n3,carol\n")
    with pytest.raises(SourceError, match=r"p\.csv:3: 1 field\(s\), column 2 needed.*`skip_bad_rows`"):
        read(CsvSource(path, column="name"))
    source = CsvSource(path, column="name", skip_bad_rows=1)
    assert read(source) == [b"alice", b"carol"]
    assert source.stats.bad_rows == 1 and source.stats.examples[0].endswith("p.csv:3: 1 field(s), column 2 needed")


def test_bad_encoding_and_bad_quoting(tmp_path):
    path = write(tmp_path / "p.csv", b"name\nalice\n\xff\xfebad\ncarol\n")
    with pytest.raises(SourceError, match=r"p\.csv:3: not valid utf-8"):
        read(CsvSource(path))
    source = CsvSource(path, skip_bad_rows=1)
    assert read(source) == [b"alice", b"carol"]
    quoting = write(tmp_path / "q.csv", 'name\nalice\n"bad"quote\ncarol\n')
    with pytest.raises(SourceError, match=r"q\.csv:3: malformed CSV"):
        read(CsvSource(quoting))


def test_missing_file_and_broken_gzip(tmp_path):
    with pytest.raises(SourceError, match="cannot read"):
        read(CsvSource(str(tmp_path / "absent.csv")))
    broken = write(tmp_path / "b.csv.gz", b"this is not gzip")
    with pytest.raises(SourceError):
        read(CsvSource(broken))


def test_large_file_crosses_blocks_with_exact_counts(tmp_path):
    """Many 1 MiB blocks, the fast path, a bad row far in: its line number is still exact."""
    lines = [f"{i},user:{i},x" for i in range(300_000)]
    lines[250_000] = "broken-row"
    path = write(tmp_path / "big.csv", "id,user,extra\n" + "\n".join(lines) + "\n")
    with pytest.raises(SourceError, match=r"big\.csv:250002: 1 field"):
        read(CsvSource(path, column="user"), 5000)
    source = CsvSource(path, column="user", skip_bad_rows=1)
    items = read(source, 5000)
    assert len(items) == 299_999 and items[0] == b"user:0" and items[-1] == b"user:299999"
    assert source.count() == 300_000


def test_rebatch():
    stats = SourceStats()
    assert list(rebatch(iter([[1, 2, 3], [4], [5, 6, 7, 8, 9], [], [10]]), 4, stats)) == [
        [1, 2, 3, 4],
        [5, 6, 7, 8],
        [9, 10],
    ]
    assert stats.items == 10


def test_db_url_normalisation():
    assert normalise_db_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_db_url("mysql://root@h/db") == "mysql+pymysql://root@h/db"
    assert normalise_db_url("sqlite:///x.db") == "sqlite:///x.db"
    with pytest.raises(UsageError):
        normalise_db_url("nonsense")


# --- SQL ------------------------------------------------------------------------------------


def make_table(engine, rows: int, *, with_nulls: bool = False) -> str:
    table = f"bloomctl_{uuid.uuid4().hex[:10]}"
    with engine.begin() as conn:
        conn.execute(
            sqlalchemy.text(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, email VARCHAR(100), updated_at TIMESTAMP)")
        )
        data = [{"id": i, "email": None if with_nulls and i % 10 == 0 else f"u{i}@example.com"} for i in range(rows)]
        conn.execute(
            sqlalchemy.text(f"INSERT INTO {table} (id, email, updated_at) VALUES (:id, :email, CURRENT_TIMESTAMP)"),
            data,
        )
    return table


def drop(engine, table: str) -> None:
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(f"DROP TABLE IF EXISTS {table}"))


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def engine(request):
    return request.getfixturevalue(
        {"sqlite": "sqlite_engine", "postgresql": "pg_engine", "mysql": "mysql_engine"}[request.param]
    )


def test_sql_source_streams_counts_and_skips_nulls(engine):
    table = make_table(engine, 2500, with_nulls=True)
    try:
        url = engine.url.render_as_string(hide_password=False)
        source = SqlSource(url, f"SELECT email, id FROM {table} ORDER BY id")
        items = read(source, 1000)
        assert len(items) == 2250 and items[:2] == [b"u1@example.com", b"u2@example.com"]  # u0 is NULL
        assert source.stats.blank == 250
        assert source.count() == 2500
        by_column = read(SqlSource(url, f"SELECT email, id FROM {table} ORDER BY id", column="id", prefix="id:"), 1000)
        assert by_column[:2] == [b"id:0", b"id:1"] and len(by_column) == 2500
        templated = read(SqlSource(url, f"SELECT id, email FROM {table} ORDER BY id", template="{id}/{email}"), 1000)
        assert templated[0] == b"1/u1@example.com" and len(templated) == 2250
    finally:
        drop(engine, table)


def test_sql_errors_are_source_errors_without_passwords(sqlite_engine):
    url = sqlite_engine.url.render_as_string(hide_password=False)
    with pytest.raises(SourceError, match="the query failed"):
        read(SqlSource(url, "SELECT nope FROM missing_table"))
    with pytest.raises(SourceError) as excinfo:
        read(SqlSource("postgresql://bob:hunter2-secret@127.0.0.1:1/none", "SELECT 1"))
    assert "hunter2-secret" not in str(excinfo.value) and "***" in str(excinfo.value)


def test_postgres_streams_with_copy(pg_engine):
    """Rows arrive while the server is still sending them (COPY TO STDOUT): memory stays flat."""
    table = f"bloomctl_{uuid.uuid4().hex[:10]}"
    with pg_engine.begin() as conn:  # 1M rows (~25 MB): more than socket buffers hold, so COPY is still running
        conn.execute(
            sqlalchemy.text(
                f"CREATE TABLE {table} AS SELECT i AS id, 'u' || i || '@example.com' AS email "
                "FROM generate_series(1, 1000000) AS i"
            )
        )
    try:
        source = SqlSource(
            pg_engine.url.render_as_string(hide_password=False), f"SELECT id, email FROM {table}", column="email"
        )
        batches = source.batches(1000)
        first = next(batches)
        assert len(first) == 1000 and first[0].endswith(b"@example.com")
        with pg_engine.connect() as conn:  # the other session is in the middle of its COPY
            queries = (
                conn.execute(
                    sqlalchemy.text(
                        "SELECT query FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active'"
                    )
                )
                .scalars()
                .all()
            )
        batches.close()
        assert any(q.startswith("COPY (SELECT c1 FROM") for q in queries), queries  # email, by position
        assert sum(len(b) for b in source.batches(100_000)) == 1_000_000
    finally:
        drop(pg_engine, table)


def test_postgres_copy_unescapes_values(pg_engine):
    table = f"bloomctl_{uuid.uuid4().hex[:10]}"
    values = ["tab\there", "new\nline", "back\\slash", "ünï", "", None, "plain"]
    with pg_engine.begin() as conn:
        conn.execute(sqlalchemy.text(f"CREATE TABLE {table} (n INTEGER, v TEXT)"))
        conn.execute(
            sqlalchemy.text(f"INSERT INTO {table} VALUES (:n, :v)"), [{"n": i, "v": v} for i, v in enumerate(values)]
        )
    try:
        url = pg_engine.url.render_as_string(hide_password=False)
        source = SqlSource(url, f"SELECT v FROM {table} ORDER BY n")
        assert read(source, 100) == [v.encode() for v in values if v]
        assert source.stats.blank == 2
        cursor_path = SqlSource(url, f"SELECT v FROM {table} ORDER BY n", template="{v}")  # no COPY with a template
        assert read(cursor_path, 100) == [v.encode() for v in values if v]
    finally:
        drop(pg_engine, table)


def test_missing_driver_says_what_to_install():
    from bloomctl.errors import MissingExtra

    with pytest.raises(MissingExtra, match="driver for mssql is not installed"):
        read(SqlSource("mssql+pyodbc://u@h/db", "SELECT 1"))


def test_fast_path_agrees_with_the_csv_module_on_uneven_rows(tmp_path):
    """Rows with extra or missing fields: the block fast path must give what csv.reader gives."""
    import csv as csvmod

    text = "id,name,email\n" + "".join(
        f"{i},name{i},e{i}\n" if i % 7 else (f"{i},name{i},e{i},extra\n" if i % 2 else f"{i},name{i}\n")
        for i in range(3000)
    )
    path = write(tmp_path / "u.csv", text)
    for column in ("id", "name", "email"):
        source = CsvSource(path, column=column, skip_bad_rows=10_000)
        expected = []
        for row in list(csvmod.reader(text.splitlines()))[1:]:
            index = ["id", "name", "email"].index(column)
            if len(row) > index and row[index]:
                expected.append(row[index].encode())
        assert read(source, 500) == expected, column


def test_cr_only_line_ends(tmp_path):
    path = write(tmp_path / "mac.csv", "user\ra\rb\rc\r")
    assert read(CsvSource(path)) == [b"a", b"b", b"c"]
    assert read(CsvSource(path, header=False)) == [b"user", b"a", b"b", b"c"]


def test_unusable_encodings_and_corrupt_gzip(tmp_path):
    with pytest.raises(UsageError, match="ASCII-compatible"):
        CsvSource(write(tmp_path / "u.csv", "a\n"), encoding="utf-16")
    good = gzip.compress(b"name\n" + b"".join(b"user:%d\n" % i for i in range(50_000)))
    corrupt = good[:200] + bytes(b ^ 0xFF for b in good[200:260]) + good[260:]
    path = tmp_path / "bad.csv.gz"
    path.write_bytes(corrupt)
    with pytest.raises(SourceError, match="cannot read"):
        read(CsvSource(str(path)), 1000)


def test_bad_header_and_template_are_clear(tmp_path):
    path = write(tmp_path / "u.csv", 'id,"na"me\n1,2\n')
    with pytest.raises(SourceError, match=r"u\.csv:1"):
        read(CsvSource(path))
    with pytest.raises(UsageError, match="`template`"):
        CsvSource(write(tmp_path / "v.csv", PEOPLE), template="x{").preflight()


def test_multibyte_delimiter_agrees_with_the_csv_module(tmp_path):
    path = write(tmp_path / "u.csv", "id§name\n1§a£b\n2§c\n")
    assert read(CsvSource(path, column="name", delimiter="§")) == ["a£b".encode(), b"c"]


def test_cr_only_files_are_counted_like_they_are_read(tmp_path):
    path = write(tmp_path / "mac.csv", "user\r" + "".join(f"u{i}\r" for i in range(5000)))
    source = CsvSource(path)
    assert source.count() == 5000 == len(read(source, 1000))


def test_non_text_codecs_are_refused():
    with pytest.raises(UsageError, match="ASCII-compatible"):
        CsvSource("x.csv", encoding="rot13")


def test_stdin_preflight_keeps_what_it_read(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(PEOPLE.encode())))
    source = CsvSource("-", column="name")
    source.preflight()
    assert read(source) == [b"alice", b"bob", b"carol"]
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(PEOPLE.encode())))
    with pytest.raises(UsageError, match="no column"):
        CsvSource("-", column="nope").preflight()


@pytest.mark.parametrize("path", ["adbc", "copy"])
def test_postgres_fast_paths_give_the_cursor_paths_items(pg_engine, monkeypatch, path):
    """Every column type through the fast path (ADBC, or COPY without it) gives the bytes the
    cursor path gives (``str()`` of the value, UTF-8), on a latin1 connection, NULLs and empty
    values included; types a fast path cannot render exactly take the cursor path."""
    from bloomctl.sources import adbc

    if path == "copy":
        monkeypatch.setattr(adbc, "available", lambda dialect, params: False)
    else:
        pytest.importorskip("adbc_driver_postgresql")
    table = f"bloomctl_{uuid.uuid4().hex[:10]}"
    with pg_engine.begin() as conn:
        conn.execute(
            sqlalchemy.text(
                f"CREATE TABLE {table} (k INTEGER, n BIGINT, s SMALLINT, t TEXT, v VARCHAR(9), c CHAR(4), "
                "b BOOLEAN, ts TIMESTAMPTZ, raw BYTEA, u UUID, f DOUBLE PRECISION)"
            )
        )
        conn.execute(
            sqlalchemy.text(
                f"INSERT INTO {table} VALUES "
                "(1, 9223372036854775807, -32768, 'josé', 'ü', 'ab', true, '2024-01-02 03:04:05+00', "
                "'\\x00ff', '12345678-1234-5678-1234-567812345678', 0.1), "
                "(2, -1, 0, '', '', '', false, NULL, '', NULL, -2.5), "
                "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL), "
                "(4, 0, 7, 'ñß', 'x', 'yz', false, '1999-12-31 23:59:59.5+00', '\\x41', "
                "'00000000-0000-0000-0000-000000000000', 1e300)"
            )
        )
    try:
        url = pg_engine.url.render_as_string(hide_password=False) + "?client_encoding=latin1"
        for column in ("n", "s", "t", "v", "c", "b", "ts", "raw", "u", "f"):
            query = f"SELECT {column}, k FROM {table} ORDER BY k"
            fast = SqlSource(url, query, column=column)
            items = read(fast, 10)
            cursor = read(SqlSource(url, query, column=column).before("k", 99), 10)  # bound: the cursor path
            assert items == cursor, column
            assert (fast.stats.rows, fast.stats.blank) == (4, 4 - len(items)), column
        assert read(SqlSource(url, f"SELECT t FROM {table} WHERE k = 1"), 10) == ["josé".encode()]
    finally:
        drop(pg_engine, table)


@pytest.mark.parametrize("path", ["copy", "adbc"])
def test_postgres_error_mid_stream_is_the_servers_message(pg_engine, monkeypatch, path):
    """A row that fails after the rows have started to flow (division by zero at row 30,000) stops
    the source with PostgreSQL's own words, on the COPY path and on the ADBC path."""
    from bloomctl.sources import adbc

    if path == "copy":
        monkeypatch.setattr(adbc, "available", lambda dialect, params: False)
    else:
        pytest.importorskip("adbc_driver_postgresql")
    url = pg_engine.url.render_as_string(hide_password=False)
    query = "SELECT (CASE WHEN i = 30000 THEN 1 / (i - 30000) ELSE i END)::text AS v FROM generate_series(1, 60000) i"
    source = SqlSource(url, query)
    expected = "COPY failed: ERROR:  division by zero" if path == "copy" else "ERROR:  division by zero"
    with pytest.raises(SourceError, match=expected):
        read(source, 1000)


@pytest.mark.parametrize("path", ["adbc", "copy"])
def test_postgres_fast_paths_take_columns_by_position(pg_engine, monkeypatch, path):
    """Two columns of one name (two expressions are both ``?column?``) are told apart by position;
    a value with a newline keeps it with a prefix, even alone in its batch."""
    from bloomctl.sources import adbc

    if path == "copy":
        monkeypatch.setattr(adbc, "available", lambda dialect, params: False)
    else:
        pytest.importorskip("adbc_driver_postgresql")
    url = pg_engine.url.render_as_string(hide_password=False)
    assert read(SqlSource(url, "SELECT 'a' || 'b', 'c' || 'd'", column="2"), 10) == [b"cd"]
    assert read(SqlSource(url, "SELECT 1 AS id, 'x' AS id", column="2"), 10) == [b"x"]
    assert read(SqlSource(url, "SELECT E'a\\nb'::text AS t", prefix="p:"), 10) == [b"p:a\nb"]


# --- rebuild: the item recipe and the database URL, checked before anything is written --------


def verified_standby(target, tmp_path):
    csv = tmp_path / "three.csv"
    csv.write_text("id,name,email\n1,a,x\n2,b,y\n")
    first = target.cli("rebuild", "users", "--from-csv", str(csv), "--column", "name", "-c", "100", "-e", "1%")
    assert first.exit_code == 0, first.stderr
    return csv


@SIGNALS_LOCKS_ERRORS
@pytest.mark.parametrize(
    "args",
    [
        ["--column", "5"],
        ["--template", "{7}"],
        ["--no-header", "--column", "5"],
        ["--column", "5", "--build", "server"],
    ],
)
def test_a_column_beyond_the_rows_is_refused_before_the_standby_is_touched(target, tmp_path, args):
    """(#10 item 6) `--column 5` / `--template '{7}'` on a 3-column file replaced a verified standby with an
    empty `loading` one, then exited 8. Now: exit 2, the verified standby as it was."""
    from bloomctl.lifecycle.metadata import read_metadata

    csv = verified_standby(target, tmp_path)
    family = KeyFamily.of("users")
    before = target.client.dump(family.standby)
    result = target.cli("rebuild", "users", "--from-csv", str(csv), *args)
    assert result.exit_code == 2 and "the item needs column" in result.stderr, result.stderr
    assert read_metadata(target.client, family.standby_meta)["state"] == "verified"
    assert target.client.dump(family.standby) == before


@SIGNALS_LOCKS_ERRORS
def test_a_since_column_the_query_does_not_select_is_refused_up_front(target, sqlite_engine):
    """(#10 item 6) A `--since-column` the query does not select failed only after the full load."""
    import sqlalchemy

    with sqlite_engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE users (email TEXT, updated_at TEXT)"))
        conn.execute(sqlalchemy.text("INSERT INTO users VALUES ('a@x', '2026-01-01')"))
    url = sqlite_engine.url.render_as_string(hide_password=False)
    args = ["--from-sql", "SELECT email FROM users", "--db-url", url, "-c", "100", "-e", "1%"]
    result = target.cli("rebuild", "users", *args, "--since-column", "updated_at")
    assert result.exit_code == 2 and "'updated_at' is not a column the query selects" in result.stderr
    assert "--since-column" in result.stderr and not target.client.exists(KeyFamily.of("users").standby)
    selected = target.cli(
        "rebuild", "users", *args[:1], "SELECT email, updated_at FROM users", *args[2:], "--since-column", "UPDATED_AT"
    )
    assert selected.exit_code == 0, selected.stderr


@SIGNALS_LOCKS_ERRORS
def test_a_postgres_url_is_accepted(target, pg_engine):
    """(#10 item 16) `postgres://` (libpq's and many platforms' spelling) was refused by SQLAlchemy."""
    from tests.fixtures.sql import PG_URL

    url = "postgres://" + PG_URL.split("://", 1)[1]
    result = _rebuild_from_a_pg_table(target, pg_engine, "hardening_pg_scheme", 300, url)
    assert result.exit_code == 0, result.stderr
    assert target.card("users") == 300


@SIGNALS_LOCKS_ERRORS
def test_a_database_password_never_shows_and_may_hold_any_character(target, pg_engine):
    """(#10 item 8, review) A PostgreSQL password with a space failed on the ADBC and COPY paths (libpq
    refused the URI) and its percent-encoded form showed in the error; an unencoded @ showed a
    part of it."""
    from tests.fixtures.sql import PG_URL

    user_host = PG_URL.split("://", 1)[1].split("@", 1)
    url = f"postgresql://{user_host[0]}:p%40ss%2Fw%3Frd%231%20x@{user_host[1]}"  # p@ss/w?rd#1 x (trust auth)
    ok = _rebuild_from_a_pg_table(target, pg_engine, "hardening_pw", 200, url)
    assert ok.exit_code == 0, ok.stderr
    bad = target.cli("rebuild", "users", "--from-sql", "SELECT id FROM no_such_table_here", "--db-url", url)
    assert bad.exit_code == 8
    broken = target.cli(
        "--log-format",
        "json",
        "rebuild",
        "users",
        "--from-sql",
        "SELECT 1",
        "--format",
        "json",
        "--db-url",
        f"postgresql://{user_host[0]}:p@ss@{user_host[1]}",
    )
    assert broken.exit_code == 2
    for result in (ok, bad, broken):
        shown = result.stdout + result.stderr
        for fragment in ("p@ss", "p%40ss", "w?rd", "w%3Frd", "rd#1", "%231", "1 x", "1%20x", "ss@"):
            assert fragment not in shown, (fragment, shown)


def _rebuild_from_a_pg_table(target, pg_engine, table: str, rows: int, url: str):
    """A table of ``rows`` ids ('u1'...), and `rebuild users --swap` from it through ``url``."""
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        conn.exec_driver_sql(f"CREATE TABLE {table} (id text)")
        conn.exec_driver_sql(f"INSERT INTO {table} SELECT 'u' || g FROM generate_series(1, {rows}) g")
    query = f"SELECT id FROM {table}"
    return target.cli("rebuild", "users", "--from-sql", query, "--db-url", url, "-c", "1000", "-e", "1%", "--swap")
