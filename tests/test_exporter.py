"""`bloomctl exporter`: the metrics of every declared filter at scrape time (parsed with
prometheus_client's own parser), the bounded cache, the last rebuild's state from the metadata,
and a server that goes away and comes back while the endpoint stays up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bloomctl import backends
from bloomctl.declared.config import load
from bloomctl.declared.exporter import Exporter, serve
from bloomctl.server.capabilities import detect
from bloomctl.server.connection import connect, settings_from
from tests.servers import RedisServer, free_port


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(found, name: str, **labels: str) -> float | None:
    for (sample, sample_labels), number in found.items():
        if sample == name and all(dict(sample_labels).get(k) == v for k, v in labels.items()):
            return number
    return None


def scrape(exporter: Exporter) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    return samples(generate_latest(registry).decode())


def connector(url: str):
    def open_profile(_name: str):
        client = connect(settings_from(url, timeout=2, connect_timeout=1))
        return client, detect(client)

    return open_profile


def write_config(tmp_path: Path, url: str) -> Path:
    rows = "id\n" + "".join(f"{i}\n" for i in range(300))
    (tmp_path / "u.csv").write_bytes(rows.encode() + b"\xff\xfe\n")  # a last row that is not UTF-8
    path = tmp_path / "bloomctl.toml"
    path.write_text(
        f"""\
[profiles.default]
url = "{url}"
[filters.users]
capacity = 1000
error_rate = "1%"
source.csv = "u.csv"
thresholds.warn = 0.2
thresholds.max = 0.5
[filters.orders]
capacity = 100
error_rate = "1%"
[filters.seen]
type = "windowed"
capacity = 100
error_rate = "1%"
window.period = "1d"
window.keep = 2
"""
    )
    return path


def test_the_metrics_of_every_declared_filter(plain, tmp_path, cli):
    path = write_config(tmp_path, plain.url)
    built = cli("--config", str(path), "rebuild", "users", "--skip-bad-rows", "1")
    assert built.exit_code == 0, built.output
    assert cli("--config", str(path), "apply", "seen").exit_code == 0
    exporter = Exporter(load(path), connector(plain.url), cache_seconds=0)
    found = scrape(exporter)
    assert value(found, "bloomctl_up", profile="default") == 1
    assert value(found, "bloomctl_filter_present", filter="users") == 1
    assert value(found, "bloomctl_filter_present", filter="orders") == 0
    assert value(found, "bloomctl_items", filter="users", key="users") == 300
    assert value(found, "bloomctl_fill_ratio", filter="users") == pytest.approx(0.3)
    assert value(found, "bloomctl_fill_threshold_ratio", filter="users", level="max") == 0.5
    assert value(found, "bloomctl_last_rebuild_state", filter="users", state="verified") == 1
    assert value(found, "bloomctl_last_rebuild_state", filter="users", state="failed") == 0
    built_at = value(found, "bloomctl_filter_built_timestamp_seconds", filter="users")
    assert built_at is not None and abs(built_at - time.time()) < 120
    assert value(found, "bloomctl_window_current_bucket_present", filter="seen") == 1
    assert value(found, "bloomctl_window_buckets", filter="seen") == 3  # today and two ahead
    assert value(found, "bloomctl_filter_type", filter="seen", type="bloom") == 1
    assert value(found, "bloomctl_items", filter="orders") is None


def test_a_failed_rebuild_shows_in_the_last_rebuild_state(plain, tmp_path, cli):
    path = write_config(tmp_path, plain.url)
    assert cli("--config", str(path), "rebuild", "users", "--skip-bad-rows", "1").exit_code == 0
    failed = cli("--config", str(path), "rebuild", "users")  # the bad last row, none tolerated: exit 8
    assert failed.exit_code == 8, failed.output
    found = scrape(Exporter(load(path), connector(plain.url), cache_seconds=0))
    state = {dict(labels)["state"]: v for (name, labels), v in found.items() if name == "bloomctl_last_rebuild_state"}
    assert state["failed"] + state["interrupted"] + state["loading"] == 1 and state["verified"] == 0
    assert value(found, "bloomctl_items", filter="users") == 300  # the active filter is untouched


def test_the_cache_asks_the_servers_at_most_once_per_interval(plain, tmp_path):
    path = write_config(tmp_path, plain.url)
    now = [1000.0]
    exporter = Exporter(load(path), connector(plain.url), cache_seconds=10, clock=lambda: now[0])
    scrape(exporter)
    scrape(exporter)
    now[0] += 9.9
    scrape(exporter)
    assert exporter.collections == 1
    now[0] += 0.2
    scrape(exporter)
    assert exporter.collections == 2


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.read().decode()


def test_the_endpoint_stays_up_while_the_server_is_away(workdir, tmp_path):
    first = RedisServer(tmp_path / "one")
    port = first.port
    path = write_config(tmp_path, first.url)
    client = first.client()
    from bloomctl.sizing.bloom import plan

    settings = settings_from(first.url)
    redis_client = connect(settings)
    backends.get("bitmap").reserve(redis_client, b"orders", plan(100, 0.01, None))
    first.client().save()  # the second server, on the same port, starts from this snapshot
    exporter = Exporter(load(path), connector(first.url), cache_seconds=0)
    http, thread = serve(exporter, "127.0.0.1", 0)
    endpoint = f"http://127.0.0.1:{http.server_port}/metrics"
    second = None
    try:
        status, text = get(endpoint)
        found = samples(text)
        assert status == 200 and value(found, "bloomctl_up", profile="default") == 1
        assert value(found, "bloomctl_filter_present", filter="orders") == 1
        client.close()
        first.stop()
        status, text = get(endpoint)
        found = samples(text)
        assert status == 200 and value(found, "bloomctl_up", profile="default") == 0
        assert value(found, "bloomctl_filter_present", filter="orders") is None  # nothing stale
        second = RedisServer(tmp_path / "two", port=port, extra=["--dir", str(first.dir)])
        status, text = get(endpoint)
        found = samples(text)
        assert value(found, "bloomctl_up", profile="default") == 1
        assert value(found, "bloomctl_filter_present", filter="orders") == 1
    finally:
        http.shutdown()
        http.server_close()
        thread.join(5)
        if second is not None:
            second.stop()
        first.stop()


def test_the_exporter_command_serves_and_stops_on_sigterm(plain, tmp_path):
    path = write_config(tmp_path, plain.url)
    port = free_port()
    code = "import sys; from bloomctl.cli import main; sys.argv[0] = 'bloomctl'; main(prog_name='bloomctl')"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOOMCTL_")}
    process = subprocess.Popen(
        [sys.executable, "-c", code, "--config", str(path), "exporter", "--listen", f"127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        text = None
        while time.monotonic() < deadline:
            try:
                _status, text = get(f"http://127.0.0.1:{port}/metrics")
                break
            except OSError:
                time.sleep(0.1)
        assert text is not None and value(samples(text), "bloomctl_up", profile="default") == 1
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert "exporter: serving http://127.0.0.1:" in err and "exporter: stopped" in err


def test_the_exporter_refuses_a_bad_listen_address(cli, plain, tmp_path):
    path = write_config(tmp_path, plain.url)
    bad = cli("--config", str(path), "exporter", "--listen", "localhost")
    assert bad.exit_code == 2 and "HOST:PORT" in bad.stderr
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = cli("--config", str(path), "exporter", "--listen", f"127.0.0.1:{taken.getsockname()[1]}")
    assert busy.exit_code == 2 and "cannot listen on 127.0.0.1:" in busy.stderr


def test_a_filter_that_cannot_be_read_is_its_own_error_not_the_profiles(plain, tmp_path, cli):
    """NOPERM on one filter: bloomctl_filter_error 1 for it, the others reported, bloomctl_up 1, and
    the reason logged once."""
    path = write_config(tmp_path, plain.url)
    assert cli("--config", str(path), "apply", "orders").exit_code == 0
    admin = plain.client()
    admin.execute_command(
        "ACL", "SETUSER", "nogetrange", "reset", "on", ">pw", "~*", "+@all", "-evalsha", "-fcall_ro", "-getrange"
    )
    logged = []
    try:
        limited = f"redis://nogetrange:pw@127.0.0.1:{plain.port}/0"
        exporter = Exporter(
            load(path), connector(limited), cache_seconds=0, log=lambda m, level: logged.append((level, m))
        )
        found = scrape(exporter)
        scrape(exporter)
    finally:
        admin.execute_command("ACL", "DELUSER", "nogetrange")
    assert value(found, "bloomctl_up", profile="default") == 1
    assert value(found, "bloomctl_filter_error", filter="orders") == 1
    assert value(found, "bloomctl_items", filter="orders") is None
    assert value(found, "bloomctl_filter_present", filter="users") == 0  # (missing: TYPE says so)
    assert value(found, "bloomctl_filter_error", filter="users") == 0
    assert len([m for level, m in logged if "orders" in m]) == 1 and logged[0][0] == "warning"


def test_a_sharded_filters_failed_rebuild_and_a_dead_runs_standby_show(plain, tmp_path, cli):
    """A sharded filter's failed rebuild read as `verified` (only the key's own standby was read,
    which a sharded filter has not); a standby marked loading by a run that died (kill -9: its lock
    expired) read as `loading` for ever."""
    from bloomctl.keys import KeyFamily

    rows = "id\n" + "".join(f"{i}\n" for i in range(300))
    (tmp_path / "s.csv").write_bytes(rows.encode() + b"\xff\xfe\n")  # a last row that is not UTF-8
    path = tmp_path / "bloomctl.toml"
    path.write_text(
        f'[profiles.default]\nurl = "{plain.url}"\n'
        '[filters.sh]\ncapacity = 3000\nerror_rate = "1%"\nshards = 3\nsource.csv = "s.csv"\n'
        '[filters.one]\ncapacity = 3000\nerror_rate = "1%"\nsource.csv = "s.csv"\n'
    )
    for name in ("sh", "one"):
        assert cli("--config", str(path), "rebuild", name, "--skip-bad-rows", "1").exit_code == 0
    assert cli("--config", str(path), "rebuild", "sh").exit_code == 8  # the bad row, none tolerated

    def states(found, name):
        return {
            dict(labels)["state"]: v
            for (n, labels), v in found.items()
            if n == "bloomctl_last_rebuild_state" and dict(labels)["filter"] == name
        }

    client = plain.client()
    family = KeyFamily.of("one")
    client.hset(family.standby_meta, mapping={"state": "loading", "generation": "9", "created_by": "bloomctl 0.1.0"})
    found = scrape(Exporter(load(path), connector(plain.url), cache_seconds=0))
    assert states(found, "sh")["failed"] == 1 and states(found, "sh")["verified"] == 0
    assert states(found, "one")["interrupted"] == 1 and states(found, "one")["loading"] == 0
    client.set(family.lock, "a running rebuild's token", px=30_000)
    found = scrape(Exporter(load(path), connector(plain.url), cache_seconds=0))
    assert states(found, "one")["loading"] == 1
