"""Where bloomctl connects, and how it says it cannot: redis-cli style -h and -p, a bare
host:port, a database that is not a number, a bad client key file, TLS to a plain server within
--connect-timeout, and a stopped Cluster master within --timeout."""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers.matrix import SIGNALS_LOCKS_ERRORS


@SIGNALS_LOCKS_ERRORS
def test_redis_cli_style_addresses(target, plain):
    """(#10 item 16) `-h HOST -p PORT` as in redis-cli, and a bare `host:port` URL; the password and the
    database of the URL are kept; a unix socket URL takes no port."""
    from bloomctl.server.connection import settings_from

    target.reserve("users", 1000)
    host, port = target.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    wrong = f"redis://127.0.0.1:{plain.port + 1 if plain.port < 65535 else 1}/0"  # nothing there
    by_flags = target.cli("-h", host, "-p", port, "info", "users", "--format", "json", url=wrong)
    assert by_flags.exit_code == 0 and json.loads(by_flags.stdout)["key"] == "users", by_flags.stderr
    bare = target.cli("info", "users", "--format", "json", url=f"{host}:{port}")
    assert bare.exit_code == 0, bare.stderr
    settings = settings_from("redis://ann:s3cret@db.example:6380/4?ssl_cert_reqs=none", host="10.0.0.9", port=7000)
    assert settings.url == "redis://ann:s3cret@10.0.0.9:7000/4?ssl_cert_reqs=none"
    assert settings_from("rediss://db.example/2", port=6390).url == "rediss://db.example:6390/2"
    assert settings_from("redis://x", host="::1").url == "redis://[::1]:6379"
    unix = target.cli("-p", "7000", "info", "users", url="unix:///tmp/redis.sock")
    assert unix.exit_code == 2 and "unix://" in unix.stderr
    help_alone = target.cli("-h")
    assert help_alone.exit_code == 0 and "--host" in help_alone.stdout


def test_a_url_database_must_be_a_number(cli_plain, plain):
    """(#10 item 12) `redis://host/notadb` silently used database 0."""
    result = cli_plain("info", "users", url=plain.url.rsplit("/", 1)[0] + "/notadb")
    assert result.exit_code == 2 and "'notadb': a database is a number" in result.stderr
    assert cli_plain("info", "users", url=plain.url.rsplit("/", 1)[0] + "/3").exit_code == 5  # db 3: no such filter


def test_a_bad_client_key_file_is_named(cli_plain, plain, tmp_path):
    """(#10 item 12) A bad client key file gave "Error 524297 PEM lib" (exit 3): now the file, exit 2."""
    bad = tmp_path / "client.key"
    bad.write_text("not a key\n")
    host = plain.url.split("//", 1)[1]
    result = cli_plain("--tls-cert", str(bad), "--tls-key", str(bad), "info", "users", url=f"rediss://{host}")
    assert result.exit_code == 2 and repr(str(bad)) in result.stderr and "524297" not in result.stderr, result.stderr


def test_rediss_to_a_plain_server_says_so_within_the_connect_timeout(cli_plain, plain):
    """(#10 items 11, 16) `rediss://` against a plain server waited the full --timeout despite
    --connect-timeout 2. The TLS handshake is bounded by --connect-timeout and says what is wrong."""

    host = plain.url.split("//", 1)[1]
    started = time.monotonic()
    result = cli_plain("--connect-timeout", "1", "--timeout", "20", "info", "users", url=f"rediss://{host}")
    assert result.exit_code == 3 and "plain (non-TLS) Redis? then use a redis:// URL" in result.stderr, result.stderr
    assert time.monotonic() - started < 3


@pytest.mark.cluster
def test_a_stopped_cluster_master_costs_the_timeout_not_ten_times_it(cluster, cli):
    """(#10 item 11) With a stopped Cluster master, `--timeout 3` took 33 s for `info` and 56 s for a sharded
    swap: redis-py retried 10 times. bloomctl does not retry: the command fails within --timeout."""
    import os
    import signal

    import redis

    assert cli("reserve", "users", "-c", "1000", "-e", "1%", "--backend", "bitmap", url=cluster.url).exit_code == 0
    seed = redis.RedisCluster.from_url(cluster.url)
    port = seed.get_node_from_key("users").port
    seed.close()
    victim = next(node for node in cluster.nodes if node.port == port)
    os.kill(victim.process.pid, signal.SIGSTOP)
    try:
        seed_url = next(node.url for node in cluster.nodes if node.port != port)
        started = time.monotonic()
        result = cli("--timeout", "1", "info", "users", url=seed_url)
        assert result.exit_code == 3 and "timed out" in result.stderr, result.stderr
        assert time.monotonic() - started < 4
    finally:
        os.kill(victim.process.pid, signal.SIGCONT)
