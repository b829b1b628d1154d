"""Ctrl-C and SIGTERM while ADBC runs a PostgreSQL query on the main thread (the count for
`--capacity auto`, the read of `--verify all`): exit 130 or 143 at once, the query cancelled on
the server, the standby marked `interrupted`. On the main thread the driver runs each call under a
SIGINT handler of its own: Ctrl-C cancelled the query and surfaced as a query failure (exit 8), and
SIGTERM waited for the query's end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy

from bloomctl.keys import KeyFamily
from bloomctl.lifecycle.metadata import INTERRUPTED, read_metadata
from tests.fixtures.sql import PG_URL

ROOT = Path(__file__).resolve().parent.parent
SIGNALS = [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated (SIGTERM)")]
STOPPED_WITHIN = 2.0  # seconds from the signal to the exit (the query cancelled, not awaited)


@pytest.fixture
def adbc_installed():
    pytest.importorskip("adbc_driver_postgresql")
    pytest.importorskip("pyarrow")


def _start(redis_url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "BLOOMCTL_DB_URL": PG_URL.replace("+psycopg", "")}  # (ADBC serves it)
    env.pop("BLOOMCTL_URL", None)
    argv = [sys.executable, "-m", "bloomctl", "--url", redis_url, "rebuild", "users", *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)


def _running(pg_engine, *fragments: str) -> int:
    """Active queries holding every fragment (this one left out)."""
    conditions = " ".join(f"AND query LIKE :f{i}" for i in range(len(fragments)))
    with pg_engine.connect() as conn:
        return conn.execute(
            sqlalchemy.text(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() " + conditions
            ),
            {f"f{i}": f"%{fragment}%" for i, fragment in enumerate(fragments)},
        ).scalar_one()


def _wait_until_running(proc: subprocess.Popen[str], pg_engine, *fragments: str) -> None:
    deadline = time.monotonic() + 30
    while _running(pg_engine, *fragments) == 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(proc.communicate())
        time.sleep(0.05)
    time.sleep(0.5)  # well inside the driver's call


def _signal_and_wait(proc: subprocess.Popen[str], name: str) -> tuple[float, str]:
    started = time.monotonic()
    proc.send_signal(getattr(signal, name))
    try:
        _out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return time.monotonic() - started, err


def _gone(pg_engine, *fragments: str) -> bool:
    deadline = time.monotonic() + 2
    while _running(pg_engine, *fragments):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize(("name", "code", "said"), SIGNALS)
def test_a_signal_stops_the_count(adbc_installed, plain, pg_engine, name, code, said):
    marker = f"bloomctl-count-{uuid.uuid4().hex[:8]}"
    query = f"SELECT 'a'::text AS id FROM pg_sleep(20) /* {marker} */"
    proc = _start(plain.url, "--from-sql", query, "--capacity", "auto", "-e", "1%")
    _wait_until_running(proc, pg_engine, marker, "COUNT(*)")
    elapsed, err = _signal_and_wait(proc, name)
    assert proc.returncode == code, err
    assert elapsed < STOPPED_WITHIN, (elapsed, err)
    assert err.strip().splitlines()[-1] == f"bloomctl: error: {said}", err
    assert _gone(pg_engine, marker)


@pytest.fixture
def rows_of_yesterday(pg_engine):
    table = f"bloomctl_{uuid.uuid4().hex[:10]}"
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {table} (id text, updated_at timestamptz)")
        conn.exec_driver_sql(
            f"INSERT INTO {table} SELECT 'u' || g, now() - interval '1 day' FROM generate_series(1, 1000) g"
        )
    yield table
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {table}")


@pytest.mark.parametrize(("name", "code", "said"), SIGNALS)
def test_a_signal_stops_the_full_verification(adbc_installed, plain, pg_engine, rows_of_yesterday, name, code, said):
    """The query sleeps only as `--verify all` narrows it (to the rows from before the load): the
    load and the catch-up run, then the verification's read waits on the server."""
    marker = f"bloomctl-verify-{uuid.uuid4().hex[:8]}"
    narrowed = "bloomctl_src WHERE updated_at <"
    pause = f"pg_sleep(CASE WHEN current_query() LIKE '%{narrowed[:-2]}' || ' <%' THEN 20 ELSE 0 END)"
    query = f"SELECT id, updated_at FROM {rows_of_yesterday} CROSS JOIN (SELECT {pause}) AS pause /* {marker} */"
    args = ["-c", "2000", "-e", "1%", "--since-column", "updated_at", "--verify", "all", "--swap"]
    proc = _start(plain.url, "--from-sql", query, *args)
    _wait_until_running(proc, pg_engine, marker, narrowed)
    elapsed, err = _signal_and_wait(proc, name)
    assert proc.returncode == code, err
    assert elapsed < STOPPED_WITHIN, (elapsed, err)
    assert err.strip().splitlines()[-1] == f"bloomctl: error: {said}; the filter's lock is released", err
    family = KeyFamily.of("users")
    assert read_metadata(plain.client(), family.standby_meta)["state"] == INTERRUPTED
    assert not plain.client().exists(family.lock) and not plain.client().exists(family.active)
    assert _gone(pg_engine, marker)
