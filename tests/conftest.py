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
