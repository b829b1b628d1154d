"""A missing optional dependency (issue 23): one line naming the extra to install, exit 9, never a
traceback; `config validate`, `apply --dry-run` and `check` name it for the declared filters that
need it, and `rebuild --all` records it and goes on with the other filters.

Each command runs in a process of its own in which some installed packages are hidden: a
``sitecustomize`` that the test writes puts None in ``sys.modules`` for each, which is what an
absent package gives both ``import`` (ModuleNotFoundError) and ``importlib.util.find_spec`` (None).
Redis, PostgreSQL and MariaDB are the real servers of the other tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.fixtures.sql import MYSQL_URL, PG_URL
from tests.helpers.files import write_csv
from tests.helpers.redis import add, client_of, snapshot

ROOT = Path(__file__).resolve().parent.parent
HIDE_ENV = "BLOOMCTL_TEST_HIDE"
HIDER = f"""\
import os, sys

for name in filter(None, os.environ.get({HIDE_ENV!r}, "").split(",")):
    sys.modules[name] = None
"""
# what `pip install '.[fast]'` leaves out of the SQL stack
WITHOUT_SQL = ("sqlalchemy", "psycopg", "pymysql")
MYSQL = MYSQL_URL.replace("mysql+pymysql://", "mysql://", 1)  # as a user writes it
POSTGRESQL = PG_URL.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture
def hidden(tmp_path):
    """Runs ``bloomctl ARGS`` in a process where the packages ``hide`` names are not installed."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDER)

    def run(*args: str, hide: tuple[str, ...] = (), env: dict[str, str] | None = None, path: Path | None = None):
        environ = {k: v for k, v in os.environ.items() if not k.startswith("BLOOMCTL_")}
        before = [str(path)] if path else []
        environ.update(PYTHONPATH=os.pathsep.join([*before, str(site), str(ROOT)]), **{HIDE_ENV: ",".join(hide)})
        environ.update(env or {})
        command = [sys.executable, "-m", "bloomctl", *args]
        return subprocess.run(command, capture_output=True, text=True, env=environ, timeout=120, cwd=ROOT)

    return run


def one_line(result, extra: str) -> str:
    """The run's error: one stderr line that names the extra to install, and no traceback."""
    lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode == 9, result.stderr
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    assert f"pip install 'redis-bloomctl[{extra}]'" in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def users(plain, cli):
    """An active filter `users` holding 100 items: what a failed rebuild must leave as it is."""
    client = client_of(plain)
    client.flushall()
    made = cli("reserve", "users", "-c", "1000", "-e", "1%", url=plain.url)
    assert made.exit_code == 0, made.output
    add(client, "users", range(100))
    return client


SQL_ARGS = ("rebuild", "users", "--from-sql", "SELECT 1 AS id", "--swap")


def test_a_mysql_source_after_the_fast_extra_names_the_mysql_extra(plain, users, hidden):
    """The issue's reproduction: `pip install '.[fast]'` (no SQLAlchemy, no PyMySQL), then a
    `--from-sql` rebuild: it was exit 70 with a traceback."""
    before = snapshot(users)
    result = hidden("--url", plain.url, *SQL_ARGS, "--db-url", MYSQL, hide=WITHOUT_SQL)
    line = one_line(result, "mysql")
    assert "SQLAlchemy and PyMySQL are not installed" in line
    assert snapshot(users) == before  # nothing written: not even a standby


def test_a_missing_driver_inside_create_engine_names_its_extra(plain, users, hidden):
    """SQLAlchemy installed (the sql extra) but not the dialect's driver, which SQLAlchemy
    imports inside create_engine: it was exit 2, with a hint for a checkout."""
    before = snapshot(users)
    for url, extra in ((MYSQL, "mysql"), (MYSQL.replace("mysql://", "mariadb://", 1), "mysql")):
        line = one_line(hidden("--url", plain.url, *SQL_ARGS, "--db-url", url, hide=("pymysql",)), extra)
        assert "PyMySQL is not installed" in line and "checkout" not in line
    no_adbc = ("psycopg", "adbc_driver_postgresql")
    line = one_line(hidden("--url", plain.url, *SQL_ARGS, "--db-url", POSTGRESQL, hide=no_adbc), "postgresql")
    assert "psycopg is not installed" in line
    nothing = one_line(
        hidden("--url", plain.url, *SQL_ARGS, "--db-url", POSTGRESQL, hide=(*WITHOUT_SQL, *no_adbc)), "postgresql"
    )
    assert "SQLAlchemy and psycopg are not installed" in nothing
    assert snapshot(users) == before


def test_a_driver_no_extra_installs_is_named_with_exit_9(plain, users, hidden):
    result = hidden("--url", plain.url, *SQL_ARGS, "--db-url", "postgresql+asyncpg://u@127.0.0.1/db", hide=("asyncpg",))
    assert result.returncode == 9 and "Traceback" not in result.stderr, result.stderr
    assert "the driver for postgresql is not installed (asyncpg)" in result.stderr


def test_postgresql_through_adbc_needs_psycopg_only_for_the_columns_adbc_cannot_read(plain, users, pg_engine, hidden):
    """With the fast extra alone, ADBC reads an integer column; a timestamp column needs the
    postgresql extra, and the line says which column."""
    read = hidden("--url", plain.url, *SQL_ARGS, "--db-url", POSTGRESQL, "--no-swap", hide=WITHOUT_SQL)
    assert read.returncode == 0, read.stderr
    before = snapshot(users)
    query = ("--from-sql", "SELECT now() AS moment")
    result = hidden("--url", plain.url, "rebuild", "users", *query, "--db-url", POSTGRESQL, hide=WITHOUT_SQL)
    line = one_line(result, "postgresql")
    assert "the column 'moment' is of type timestamptz" in line
    assert snapshot(users) == before


def test_parquet_without_pyarrow(plain, users, hidden, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "items.parquet"
    pq.write_table(pa.table({"id": ["a", "b"]}), path)
    before = snapshot(users)
    result = hidden("--url", plain.url, "rebuild", "users", "--from-parquet", str(path), hide=("pyarrow",))
    assert "pyarrow is not installed (Parquet sources need it)" in one_line(result, "fast")
    assert snapshot(users) == before


def test_a_client_build_without_numpy(plain, users, hidden, tmp_path):
    """`--build client` names the fast extra (it was exit 4); `--build auto` builds on the server
    and says why."""
    path = write_csv(tmp_path / "items.csv", 500)
    active = users.dump("users")
    args = ("--url", plain.url, "rebuild", "users", "--from-csv", path)
    forced = hidden(*args, "--build", "client", "--swap", hide=("numpy",))
    assert "numpy is not installed (a client build needs it)" in one_line(forced, "fast")
    assert users.dump("users") == active
    auto = hidden(*args, "--no-swap", "--format", "json", hide=("numpy",))
    assert auto.returncode == 0, auto.stderr
    assert json.loads(auto.stdout)["build"] == "server" and "numpy is not installed" in auto.stderr


def test_the_dask_engine_without_dask(plain, users, hidden, tmp_path):
    path = tmp_path / "items.parquet"
    path.write_bytes(b"")  # never read: the engine is refused first
    before = snapshot(users)
    args = ("--url", plain.url, "rebuild", "users", "--from-parquet", str(path), "--engine", "dask")
    assert "dask is not installed (Dask builds need it)" in one_line(hidden(*args, hide=("dask",)), "dask")
    assert snapshot(users) == before


# --- the declared filters: one from MySQL, one from a CSV file --------------------------------------


def shop(tmp_path: Path, url: str) -> Path:
    write_csv(tmp_path / "skus.csv", 50, header="id")
    path = tmp_path / "bloomctl.toml"
    path.write_text(
        f"""\
version = 1

[profiles.default]
url = "{url}"

[filters.users]
capacity = 1000
error_rate = "1%"
source.sql = "SELECT 1 AS id"
source.db_url_env = "SHOP_DB_URL"

[filters.skus]
capacity = 1000
error_rate = "1%"
source.csv = "skus.csv"
"""
    )
    return path


def test_config_validate_names_the_filter_that_needs_an_extra(plain, hidden, tmp_path):
    config = str(shop(tmp_path, plain.url))
    env = {"SHOP_DB_URL": MYSQL}
    result = hidden("--config", config, "config", "validate", hide=WITHOUT_SQL, env=env)
    assert result.returncode == 9, result.stderr
    named = [line for line in result.stdout.splitlines() if "pip install" in line]
    assert len(named) == 1 and re.match(rf"{re.escape(config)}:\d+: filters\.users: SQLAlchemy and PyMySQL", named[0])
    assert "redis-bloomctl[mysql]" in named[0] and "skus" not in named[0]
    assert "1 filter(s) need what is not installed here" in result.stderr and "Traceback" not in result.stderr
    as_json = hidden("--config", config, "config", "validate", "--format", "json", hide=WITHOUT_SQL, env=env)
    report, _end = json.JSONDecoder().raw_decode(as_json.stdout)  # (the error's own JSON object follows it)
    filters = {f["name"]: f for f in report["filters"]}
    assert filters["users"]["missing_extra"]["extra"] == "mysql" and filters["skus"]["missing_extra"] is None
    assert as_json.returncode == 9
    unknown = hidden("--config", config, "config", "validate", hide=WITHOUT_SQL)  # no URL: no driver to tell
    assert unknown.returncode == 0, unknown.stderr
    whole = hidden("--config", config, "config", "validate", env=env)
    assert whole.returncode == 0 and "pip install" not in whole.stdout, whole.stdout


def test_a_dialects_own_driver_is_checked_before_the_rebuild_needs_it(plain, hidden, tmp_path):
    """`mysql+mysqldb://` needs MySQLdb, which no extra installs: validate said OK and the rebuild failed."""
    config = str(shop(tmp_path, plain.url))
    result = hidden(
        "--config", config, "config", "validate", env={"SHOP_DB_URL": "mysql+mysqldb://root@127.0.0.1/test"}
    )
    assert result.returncode == 9, result.stdout + result.stderr
    assert "the driver for mysql is not installed (MySQLdb)" in result.stdout


def test_a_broken_pyarrow_reads_csv_through_the_csv_module(plain, users, hidden, tmp_path):
    """An installed pyarrow that does not import: a plain CSV rebuild needs no extra, and runs."""
    broken = tmp_path / "broken"
    (broken / "pyarrow").mkdir(parents=True)
    (broken / "pyarrow" / "__init__.py").write_text("raise ImportError('libarrow.so: cannot open shared object')\n")
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(300)))
    result = hidden(
        "--url",
        plain.url,
        "rebuild",
        "csvusers",
        "--from-csv",
        str(csv),
        "-c",
        "1000",
        "-e",
        "0.01",
        "--swap",
        path=broken,
    )
    assert result.returncode == 0, result.stderr
    assert plain.client().exists("csvusers")


def test_a_driver_that_is_installed_but_does_not_import_counts_as_missing(plain, hidden, tmp_path):
    broken = tmp_path / "broken"
    (broken / "pymysql").mkdir(parents=True)
    (broken / "pymysql" / "__init__.py").write_text("raise ImportError('libmariadb.so.3: cannot open shared object')\n")
    config = str(shop(tmp_path, plain.url))
    result = hidden("--config", config, "config", "validate", env={"SHOP_DB_URL": MYSQL}, path=broken)
    assert result.returncode == 9, result.stderr
    assert "PyMySQL is installed but does not import (libmariadb.so.3: cannot open shared object)" in result.stdout


def test_apply_dry_run_names_the_filter_and_plans_the_other(plain, hidden, tmp_path):
    config = str(shop(tmp_path, plain.url))
    client_of(plain).flushall()
    result = hidden("--config", config, "apply", "--dry-run", hide=WITHOUT_SQL, env={"SHOP_DB_URL": MYSQL})
    assert result.returncode == 9, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    users = next(line for line in lines if line.startswith("! users"))
    assert "invalid" in users and "SQLAlchemy and PyMySQL are not installed" in users
    assert any(line.strip() == "resolve: pip install 'redis-bloomctl[mysql]'" for line in lines)
    assert any(line.startswith("+ skus") and "create" in line for line in lines)
    assert "Traceback" not in result.stderr and client_of(plain).keys("*") == []


def test_check_fails_the_extras_check_of_the_filter_that_needs_one(plain, hidden, tmp_path, cli):
    config = str(shop(tmp_path, plain.url))
    client_of(plain).flushall()
    for name in ("users", "skus"):  # both exist as declared: only this machine is wrong
        assert cli("reserve", name, "-c", "1000", "-e", "1%", url=plain.url).exit_code == 0
    env = {"SHOP_DB_URL": MYSQL}
    result = hidden("--config", config, "check", "--format", "json", "--no-server-checks", hide=WITHOUT_SQL, env=env)
    assert result.returncode == 9, result.stdout + result.stderr
    report = json.loads(result.stdout)
    extra = [r for r in report["results"] if r["check"] == "extras"]
    assert [(r["subject"], r["status"]) for r in extra] == [("users", "fail")]  # a CSV source needs none
    assert extra[0]["fix"] == "pip install 'redis-bloomctl[mysql]'" and "PyMySQL" in extra[0]["message"]
    assert report["summary"]["exit_code"] == 9
    fine = hidden("--config", config, "check", "--format", "json", "--no-server-checks", env=env)
    assert fine.returncode == 0, fine.stdout
    assert [r["status"] for r in json.loads(fine.stdout)["results"] if r["check"] == "extras"] == ["ok"]


def test_rebuild_all_records_the_missing_extra_and_builds_the_other_filters(plain, hidden, tmp_path):
    """It stopped at the SQL filter with exit 70; now that filter fails with 9, the CSV one is
    built, and the run's code is the first failure's."""
    config = str(shop(tmp_path, plain.url))
    client = client_of(plain)
    client.flushall()
    result = hidden("--config", config, "rebuild", "--all", hide=WITHOUT_SQL, env={"SHOP_DB_URL": MYSQL})
    assert result.returncode == 9, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert re.search(
        r"^users\s+FAILED \(exit 9\)\s+SQLAlchemy and PyMySQL .*redis-bloomctl\[mysql\]", result.stdout, re.M
    )
    assert re.search(r"^skus\s+rebuilt\s+50 items", result.stdout, re.M), result.stdout
    assert "2 filter(s): 1 rebuilt, 0 rotated, 0 skipped, 1 failed (exit 9)" in result.stdout
    assert client.exists("skus") and not client.exists("users")


# --- the one table of what each feature needs --------------------------------------------------------

DISTRIBUTIONS = {  # the requirement of pyproject.toml that installs each module
    "sqlalchemy": "sqlalchemy",
    "psycopg": "psycopg",
    "pymysql": "pymysql",
    "pyarrow": "pyarrow",
    "numpy": "numpy",
    "pandas": "pandas",
    "adbc_driver_postgresql": "adbc-driver-postgresql",
    "adbc_driver_manager": "adbc-driver-manager",
    "dask": "dask",
    "dask.dataframe": "dask",
    "distributed": "distributed",
    "pyspark": "pyspark",
}


def test_every_feature_names_an_extra_of_pyproject_that_installs_its_modules():
    from bloomctl import extras

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == extras.DISTRIBUTION
    for name, feature in extras.FEATURES.items():
        listed = project["optional-dependencies"][feature.extra]
        installed = {re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower() for requirement in listed}
        lacking = [module for module in feature.modules if DISTRIBUTIONS[module] not in installed]
        assert lacking == [], f"{name}: the {feature.extra} extra does not install {lacking}"
