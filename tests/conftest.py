"""Fixtures: real redis-server processes (standalone, Cluster, with and without RedisBloom).

Tiers:
- plain Redis (standalone and a 3-master Cluster): always; under CI=true a missing
  redis-server fails the run instead of skipping.
- RedisBloom: when BLOOMCTL_TEST_REDISBLOOM_MODULE names the module file; otherwise those
  tests skip with one visible reason (CI may skip them: RedisBloom is in no registry here).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.servers import MODULE_ENV, REDIS_SERVER, RedisCluster, RedisServer, in_ci, module_path

SKIP_NO_MODULE = f"RedisBloom tier skipped: set {MODULE_ENV}=/path/to/redisbloom.so to run it"


def pytest_report_header(config: pytest.Config) -> list[str]:
    module = module_path()
    return [
        f"redis-server: {REDIS_SERVER or 'NOT FOUND'}",
        f"RedisBloom tier: {'ON, module ' + module if module else 'OFF (' + SKIP_NO_MODULE + ')'}",
    ]


def _require_redis_server() -> None:
    if not REDIS_SERVER:
        message = "redis-server is not installed (apt-get install redis-server)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("servers")


@pytest.fixture(scope="session")
def plain_server(workdir: Path) -> Iterator[RedisServer]:
    """A redis-server without modules, shared by the session (flushed per test by `plain`)."""
    _require_redis_server()
    server = RedisServer(workdir)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def bloom_server(workdir: Path) -> Iterator[RedisServer]:
    module = module_path()
    if os.environ.get(MODULE_ENV) and not module:
        pytest.fail(f"{MODULE_ENV}={os.environ[MODULE_ENV]!r} is not a file")
    if not module:
        pytest.skip(SKIP_NO_MODULE)
    _require_redis_server()
    server = RedisServer(workdir, module=module)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def plain_cluster(workdir: Path) -> Iterator[RedisCluster]:
    _require_redis_server()
    cluster = RedisCluster(workdir, masters=3)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def bloom_cluster(workdir: Path) -> Iterator[RedisCluster]:
    module = module_path()
    if not module:
        pytest.skip(SKIP_NO_MODULE)
    _require_redis_server()
    cluster = RedisCluster(workdir, masters=3, module=module)
    yield cluster
    cluster.stop()


@pytest.fixture
def plain(plain_server: RedisServer) -> RedisServer:
    plain_server.client().flushall()
    return plain_server


@pytest.fixture
def bloom(bloom_server: RedisServer) -> RedisServer:
    bloom_server.client().flushall()
    return bloom_server


@pytest.fixture
def cluster(plain_cluster: RedisCluster) -> RedisCluster:
    plain_cluster.flush()
    return plain_cluster


@pytest.fixture
def bcluster(bloom_cluster: RedisCluster) -> RedisCluster:
    bloom_cluster.flush()
    return bloom_cluster


class Cli:
    """Runs bloomctl in-process with CliRunner; stdout and stderr stay separate."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url
        self.runner = CliRunner()

    def __call__(self, *args: str, env: dict[str, str] | None = None, input: str | None = None, url: str | None = None):
        from bloomctl.cli import main

        argv = ["--url", url or self.url] if (url or self.url) else []
        full_env: dict[str, str | None] = {"BLOOMCTL_URL": None, "BLOOMCTL_PASSWORD": None}
        full_env.update(env or {})
        return self.runner.invoke(main, [*argv, *args], env=full_env, input=input, catch_exceptions=False)


@pytest.fixture
def cli_plain(plain: RedisServer) -> Cli:
    return Cli(plain.url)


@pytest.fixture
def cli_bloom(bloom: RedisServer) -> Cli:
    return Cli(bloom.url)


@pytest.fixture
def cli() -> Cli:
    return Cli()


# --- the lifecycle suite runs on every backend and topology --------------------------------

TARGETS = [
    pytest.param(("bitmap", "standalone"), id="bitmap-standalone"),
    pytest.param(("bitmap", "cluster"), id="bitmap-cluster", marks=pytest.mark.cluster),
    pytest.param(("redisbloom", "standalone"), id="redisbloom-standalone", marks=pytest.mark.redisbloom),
    pytest.param(
        ("redisbloom", "cluster"), id="redisbloom-cluster", marks=[pytest.mark.redisbloom, pytest.mark.cluster]
    ),
]


class Target:
    """A server (standalone or Cluster) and the backend under test, with helpers that go through the library."""

    def __init__(self, backend_name: str, topology: str, url: str) -> None:
        from bloomctl import backends
        from bloomctl.connection import connect, settings_from

        self.backend = backends.get(backend_name)
        self.topology = topology
        self.url = url
        self.client = connect(settings_from(url))
        self.cli = Cli(url)

    @property
    def cluster(self) -> bool:
        return self.topology == "cluster"

    def reserve(self, key, capacity: int, error_rate: float = 0.01) -> None:
        from bloomctl.planner import plan

        expansion = 2 if self.backend.name == "redisbloom" else None
        self.backend.reserve(self.client, _b(key), plan(capacity, error_rate, expansion))

    def add(self, key, items) -> list[bool]:
        items = list(items)
        added: list[bool] = []
        for start in range(0, len(items), 1000):
            added += self.backend.madd(self.client, _b(key), items[start : start + 1000])
        return added

    def card(self, key) -> int:
        return self.backend.card(self.client, _b(key))


def _b(key) -> bytes:
    from bloomctl.keys import to_bytes

    return to_bytes(key)


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest) -> Target:
    backend_name, topology = request.param
    fixture = {
        ("bitmap", "standalone"): "plain",
        ("bitmap", "cluster"): "cluster",
        ("redisbloom", "standalone"): "bloom",
        ("redisbloom", "cluster"): "bcluster",
    }[request.param]
    server = request.getfixturevalue(fixture)
    return Target(backend_name, topology, server.url)


# --- SQL services (the machine's PostgreSQL and MariaDB; SQLite needs none) ---------------------

PG_URL = os.environ.get("BLOOMCTL_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("BLOOMCTL_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")


def _sql_engine(url: str, what: str):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
    except Exception as exc:  # the service is not there
        engine.dispose()
        message = f"{what} not reachable at {url}: {str(exc).splitlines()[0]}"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return engine


@pytest.fixture(scope="session")
def pg_engine():
    engine = _sql_engine(PG_URL, "PostgreSQL")
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def mysql_engine():
    engine = _sql_engine(MYSQL_URL, "MariaDB/MySQL")
    yield engine
    engine.dispose()


@pytest.fixture
def sqlite_engine(tmp_path):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'source.db'}")
    with engine.begin() as conn:  # WAL: a writer does not wait for a streaming reader (as on a real database)
        conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    yield engine
    engine.dispose()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line per backend x topology: which halves of the lifecycle suite ran here."""
    counts: dict[str, dict[str, int]] = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            for target in ("bitmap-standalone", "bitmap-cluster", "redisbloom-standalone", "redisbloom-cluster"):
                if f"[{target}" in nodeid and getattr(report, "when", "call") in ("call", "setup"):
                    if outcome == "passed" and report.when != "call":
                        continue
                    counts.setdefault(target, {}).setdefault(outcome, 0)
                    counts[target][outcome] += 1
    if counts:
        terminalreporter.write_sep("-", "backend x topology")
        for target, by_outcome in counts.items():
            detail = ", ".join(f"{n} {outcome}" for outcome, n in sorted(by_outcome.items()))
            terminalreporter.write_line(f"{target}: {detail}")
