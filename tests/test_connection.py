"""Connections on real servers: passwords (URL, env, file), ACL users, unix sockets, TLS, Cluster detection."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from bloomctl.server.capabilities import detect
from bloomctl.server.connection import ConnectionSettings, connect, redact_url, settings_from
from tests.servers import REDIS_SERVER, RedisServer

pytestmark = pytest.mark.matrix  # CI runs this module on every server of the matrix

SECRET = "s3cr3t-p@ss"


@pytest.fixture(scope="module")
def locked_server(workdir):
    server = RedisServer(
        workdir, extra=["--requirepass", SECRET, "--user", "ops", "on", f">{SECRET}-ops", "~*", "&*", "+@all"]
    )
    yield server
    server.stop()


def test_redact_url_hides_passwords():
    assert redact_url("redis://user:pw@host:1/0") == "redis://user:***@host:1/0"
    assert redact_url("redis://:pw@host:1/0") == "redis://:***@host:1/0"
    assert redact_url("redis://host:1/0?password=pw&db=1") == "redis://host:1/0?password=***&db=1"
    assert redact_url("unix:///tmp/r.sock") == "unix:///tmp/r.sock"
    assert "pw" not in repr(ConnectionSettings(url="redis://u:pw@h:1/0", password="pw"))


@pytest.mark.parametrize("password", ["Sup3r/Secret", "has#hash", "has?query", "at@sign", "col:on"])
def test_passwords_with_url_delimiters_never_leak(cli, password):
    url = f"redis://user:{password}@127.0.0.1:1/0"
    assert password not in redact_url(url)
    result = cli("info", "k", url=url)
    assert result.exit_code in (2, 3)
    _no_secret(result, password)
    assert len(result.stderr.strip().splitlines()) == 1


def test_malformed_urls_are_usage_errors(cli):
    for url in ("redis://[::1/0", "redis://host:notaport/0"):
        result = cli("info", "k", url=url)
        assert result.exit_code == 2, (url, result.stderr)
        assert result.stderr.startswith("bloomctl: error: invalid --url")


def test_settings_precedence(tmp_path):
    env = {"BLOOMCTL_URL": "redis://env:1/0", "BLOOMCTL_PASSWORD": "from-env"}
    assert settings_from(None, environ=env).url == "redis://env:1/0"
    assert settings_from("redis://flag:1/0", environ=env).url == "redis://flag:1/0"
    assert settings_from(None, environ={}).url == "redis://localhost:6379/0"
    assert settings_from(None, environ=env).password == "from-env"
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    assert settings_from(None, password_file=str(secret), environ=env).password == "from-file"


def _no_secret(result, *secrets):
    for secret in secrets:
        assert secret not in result.stdout
        assert secret not in result.stderr


def test_password_in_url_env_and_file(cli, locked_server, tmp_path):
    port = locked_server.port
    # `info` of a missing key exits 5 only after connecting and authenticating: that proves the login worked.
    ok = cli("info", "k", url=f"redis://:{SECRET}@127.0.0.1:{port}/0")
    assert ok.exit_code == 5 and "does not exist" in ok.stderr, ok.stderr
    ok = cli("info", "k", url=f"redis://ops:{SECRET}-ops@127.0.0.1:{port}/0")
    assert ok.exit_code == 5 and "does not exist" in ok.stderr, ok.stderr
    ok = cli("info", "k", url=f"redis://127.0.0.1:{port}/0", env={"BLOOMCTL_PASSWORD": SECRET})
    assert ok.exit_code == 5 and "does not exist" in ok.stderr, ok.stderr
    secret_file = tmp_path / "password"
    secret_file.write_text(SECRET + "\n")
    ok = cli("--password-file", str(secret_file), "info", "k", url=f"redis://127.0.0.1:{port}/0")
    assert ok.exit_code == 5 and "does not exist" in ok.stderr, ok.stderr


def test_wrong_or_missing_password_exits_3_without_leaking(cli, locked_server):
    port = locked_server.port
    bad = cli("info", "k", url=f"redis://:wrong-{SECRET}@127.0.0.1:{port}/0")
    assert bad.exit_code == 3
    assert "authentication failed" in bad.stderr
    _no_secret(bad, SECRET, f"wrong-{SECRET}")
    bad = cli("info", "k", url=f"redis://ops:nope-{SECRET}@127.0.0.1:{port}/0")
    assert bad.exit_code == 3
    _no_secret(bad, f"nope-{SECRET}")
    missing = cli("info", "k", url=f"redis://127.0.0.1:{port}/0")
    assert missing.exit_code == 3
    assert "password" in missing.stderr


def test_help_never_shows_the_password_from_the_environment(cli):
    result = cli("--help", env={"BLOOMCTL_PASSWORD": SECRET, "BLOOMCTL_URL": f"redis://:{SECRET}@h:1/0"})
    assert result.exit_code == 0
    _no_secret(result, SECRET)


def test_unix_socket(cli, plain):
    result = cli("info", "k", url=f"unix://{plain.socket_path}")
    assert result.exit_code == 5 and "does not exist" in result.stderr
    client = connect(settings_from(f"unix://{plain.socket_path}"))
    assert client.ping()


@pytest.fixture(scope="module")
def tls_server(workdir):
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed")
    certs = Path(workdir) / "tls"
    certs.mkdir(exist_ok=True)

    def run(*args):
        subprocess.run(["openssl", *args], cwd=certs, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=bloomctl-test-ca",
    )
    for name in ("server", "client"):
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        )
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "2",
            "-copy_extensions",
            "copy",
        )
    from tests.servers import free_port

    tls_port = free_port()
    try:
        server = RedisServer(
            workdir,
            extra=[
                "--tls-port",
                str(tls_port),
                "--tls-cert-file",
                str(certs / "server.crt"),
                "--tls-key-file",
                str(certs / "server.key"),
                "--tls-ca-cert-file",
                str(certs / "ca.crt"),
                "--tls-auth-clients",
                "yes",
            ],
        )
    except RuntimeError as exc:
        if "Failed finding TLS support" in str(exc):  # a build without TLS (BUILD_TLS=no): the matrix's PyPI servers
            pytest.skip(f"this redis-server build has no TLS support: {REDIS_SERVER}")
        raise
    server.tls_port = tls_port
    server.certs = certs
    yield server
    server.stop()


@pytest.mark.matrix("TLS (rediss://, client certificates)")
def test_tls_with_client_certificate(cli, tls_server):
    certs = tls_server.certs
    url = f"rediss://127.0.0.1:{tls_server.tls_port}/0"
    result = cli(
        "--tls-ca",
        str(certs / "ca.crt"),
        "--tls-cert",
        str(certs / "client.crt"),
        "--tls-key",
        str(certs / "client.key"),
        "info",
        "k",
        url=url,
    )
    assert result.exit_code == 5 and "does not exist" in result.stderr  # connected over TLS
    refused = cli("--tls-ca", str(certs / "ca.crt"), "info", "k", url=url)  # no client certificate
    assert refused.exit_code == 3


@pytest.mark.matrix("TLS (rediss://, client certificates)")
def test_tls_options_need_rediss(cli, tls_server):
    result = cli(
        "--tls-ca", str(tls_server.certs / "ca.crt"), "info", "k", url=f"redis://127.0.0.1:{tls_server.port}/0"
    )
    assert result.exit_code == 2
    assert "rediss://" in result.stderr


@pytest.mark.cluster
def test_cluster_is_detected_from_any_node(cluster):
    from redis.cluster import RedisCluster

    for node in cluster.nodes:
        client = connect(settings_from(node.url))
        assert isinstance(client, RedisCluster)
        info = detect(client)
        assert info.cluster and info.flavour == "none"
    forced_standalone = connect(settings_from(cluster.url, cluster=False))
    assert not isinstance(forced_standalone, RedisCluster)


@pytest.mark.cluster
def test_cluster_cli_reports_the_missing_module_once(cli, cluster):
    result = cli("reserve", "users", "-c", "100", "-e", "1%", "--backend", "redisbloom", url=cluster.url)
    assert result.exit_code == 4
    assert "(cluster)" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def acl_server(workdir):
    """A server whose application user may not run @dangerous commands (INFO, MODULE, ...)."""
    server = RedisServer(workdir, extra=["--user", "app", "on", ">app-pass", "~*", "&*", "+@all", "-@dangerous"])
    yield server
    server.stop()


def test_an_acl_user_without_info_can_work(cli, acl_server):
    url = f"redis://app:app-pass@127.0.0.1:{acl_server.port}/0"
    assert cli("reserve", "users", "-c", "1000", "-e", "1%", url=url).exit_code == 0
    info = cli("info", "users", "--format", "json", url=url)
    assert info.exit_code == 0, info.stderr
    assert cli("fill-ratio", "users", url=url).exit_code == 0
    status = cli("functions", "status", url=url)  # the library that reserve loaded for this user
    assert status.exit_code == 0 and "(current" in status.stdout, status.stderr


def test_a_server_that_never_answers_times_out(cli):
    import socket

    with socket.socket() as silent:  # accepts connections (the kernel does) and never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        result = cli("--timeout", "0.3", "info", "k", url=f"redis://127.0.0.1:{port}/0")
    assert result.exit_code == 3
    assert "timed out" in result.stderr and len(result.stderr.strip().splitlines()) == 1
