"""SIGTERM and Ctrl-C during a rebuild: one line, the lock released, the standby marked
`interrupted` (never swapped in), exit 143 or 130; a query running on PostgreSQL or MariaDB is
cancelled on its server."""

from __future__ import annotations

import time

import pytest

from bloomctl.keys import KeyFamily
from tests.helpers.matrix import SIGNALS_LOCKS_ERRORS
from tests.helpers.processes import start_rebuild


@SIGNALS_LOCKS_ERRORS
@pytest.mark.parametrize(
    "signals, code", [(["SIGTERM"], 143), (["SIGINT", "SIGINT"], 130), (["SIGTERM", "SIGTERM"], 143)]
)
def test_sigterm_and_a_double_ctrl_c_stop_cleanly(target, tmp_path, signals, code):
    """(#10 item 9) SIGTERM killed the run silently (no line, the lock held ~30 s, the standby `loading`, a
    retry exited 6); a double Ctrl-C also left the lock held. Now: one line, the lock released, the
    standby marked `interrupted` (never swapped), exit 143 (130 for Ctrl-C); a retry runs."""
    import signal

    from bloomctl.lifecycle.metadata import read_metadata

    target.reserve("users", 10_000)
    target.add("users", ["user:0"])
    proc = start_rebuild(target, tmp_path)
    for name in signals:
        proc.send_signal(getattr(signal, name))
        time.sleep(0.05)
    _out, err = proc.communicate(timeout=30)
    lines = [line for line in err.decode().splitlines() if line.startswith("bloomctl: error")]
    assert proc.returncode == code and len(lines) == 1, err.decode()
    assert ("terminated (SIGTERM)" if code == 143 else "interrupted") in lines[0]
    assert lines[0].endswith("; the filter's lock is released")  # (said only by a run that took one)
    family = KeyFamily.of("users")
    assert not target.client.exists(family.lock)
    assert read_metadata(target.client, family.standby_meta)["state"] == "interrupted"
    assert target.card("users") == 1  # the active filter as it was
    assert target.cli("swap", "users", "--yes").exit_code == 5  # an interrupted standby is never swapped in


@SIGNALS_LOCKS_ERRORS
def test_ctrl_c_cancels_the_postgresql_query(target, pg_engine):
    """(#10 item 9) After Ctrl-C the PostgreSQL query kept running on the server. It is cancelled."""
    import signal

    import sqlalchemy

    query = "SELECT v::text AS v FROM (SELECT 1 AS v, pg_sleep(60) AS pause) AS slow /* bloomctl-cancel-test */"

    def running() -> int:
        with pg_engine.connect() as conn:
            return conn.execute(
                sqlalchemy.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%bloomctl-cancel-test%' AND pid <> pg_backend_pid()"
                )
            ).scalar_one()

    _signal_a_running_query(target, pg_engine, query, running, signal.SIGINT, 130)


@SIGNALS_LOCKS_ERRORS
def test_sigterm_cancels_the_mysql_query(target, mysql_engine):
    """(#10 item 9, review) After SIGTERM a MariaDB/MySQL query kept running on the server (PyMySQL has no
    cancel), and the exit took 10 s: bloomctl sends KILL QUERY from a second connection."""
    import signal

    import sqlalchemy

    query = "SELECT 'x' AS v FROM (SELECT 1 AS one) AS t WHERE SLEEP(60) = 0 /* bloomctl-mysql-cancel */"

    def running() -> int:
        with mysql_engine.connect() as conn:
            rows = conn.execute(sqlalchemy.text("SHOW FULL PROCESSLIST")).all()
        return sum(
            1 for row in rows if "bloomctl-mysql-cancel" in str(row[7] or "") and "PROCESSLIST" not in str(row[7])
        )

    assert _signal_a_running_query(target, mysql_engine, query, running, signal.SIGTERM, 143) < 5


def _signal_a_running_query(target, engine, query: str, running, signum: int, code: int) -> float:
    """Starts a rebuild from ``query``, signals it once the query runs on the database server,
    checks the exit code and that the query is gone from the server within 5 s; returns how long
    the exit took."""
    import subprocess
    import sys

    url = engine.url.render_as_string(hide_password=False)
    command = [sys.executable, "-m", "bloomctl", "--url", target.url, "-q", "rebuild", "users"]
    command += ["--from-sql", query, "--db-url", url, "-c", "100", "-e", "1%"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while running() == 0:
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    started = time.monotonic()
    proc.send_signal(signum)
    _out, err = proc.communicate(timeout=30)
    took = time.monotonic() - started
    assert proc.returncode == code, err.decode()
    deadline = time.monotonic() + 5
    while running():
        assert time.monotonic() < deadline, "the query still runs on the server"
        time.sleep(0.1)
    return took
