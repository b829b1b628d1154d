"""`rebuild NAME` from bloomctl.toml (the command line wins), `rebuild --all --due` (schedules, the
first failure's exit code after every filter was tried, the metrics file, SIGTERM), and the
example file of three filters run end to end on a password-protected server and PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bloomctl import backends
from bloomctl.declared.config import load
from bloomctl.keys import KeyFamily
from bloomctl.server.connection import connect, settings_from
from tests.helpers.redis import client_of, snapshot
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "bloomctl.toml"


def items_csv(path: Path, n: int, start: int = 0) -> None:
    path.write_text("id\n" + "".join(f"{i}\n" for i in range(start, start + n)))


def card(client, key: str) -> int:
    return backends.for_key(client, key.encode()).card(client, key.encode())


def contains(client, key: str, items: list[str]) -> list[bool]:
    raw = key.encode()
    return list(backends.for_key(client, raw).mexists(client, raw, [i.encode() for i in items]))


def config(tmp_path: Path, server, body: str) -> Path:
    path = tmp_path / "bloomctl.toml"
    path.write_text(f'version = 1\n[profiles.default]\nurl = "{server.url}"\n\n{body}')
    return path


def test_rebuild_name_takes_everything_from_the_file(plain, tmp_path, cli):
    items_csv(tmp_path / "u.csv", 200)
    path = config(
        tmp_path,
        plain,
        '[filters.users]\nkey = "app:{users}"\ncapacity = 400\nerror_rate = "1%"\n'
        'source.csv = "u.csv"\nsource.column = "id"\nsource.prefix = "user:"\nrebuild.keep_old = 0\n',
    )
    result = cli("--config", str(path), "rebuild", "users", "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["swapped"] is True and report["key"] == "app:{users}"  # a declared rebuild swaps
    client = client_of(plain)
    assert all(contains(client, "app:{users}", [f"user:{i}" for i in range(200)]))
    info = backends.for_key(client, b"app:{users}").info(client, b"app:{users}")
    assert info.reserved_capacity == 400
    # by its key too; and an option of the command line wins over the file's
    bigger = cli("--config", str(path), "rebuild", "app:{users}", "--capacity", "800", "--no-swap", "--format", "json")
    assert bigger.exit_code == 0, bigger.output
    assert json.loads(bigger.stdout)["swapped"] is False
    standby = KeyFamily.of("app:{users}").standby
    assert backends.for_key(client, standby).info(client, standby).reserved_capacity == 800
    assert backends.for_key(client, b"app:{users}").info(client, b"app:{users}").reserved_capacity == 400


def test_rebuild_name_of_what_cannot_be_rebuilt(plain, tmp_path, cli):
    path = config(
        tmp_path,
        plain,
        '[filters.fed]\ncapacity = 10\nerror_rate = "1%"\n'
        '[filters.win]\ntype = "windowed"\ncapacity = 10\nerror_rate = "1%"\nwindow.period = "1d"\nwindow.keep = 2\n'
        '[filters.pg]\ncapacity = 10\nerror_rate = "1%"\nsource.sql = "SELECT 1"\nsource.db_url_env = "NOPE_DB_URL"\n',
    )
    fed = cli("--config", str(path), "rebuild", "fed")
    assert fed.exit_code == 2 and "declares no source to rebuild from (it is fed by the application)" in fed.stderr
    win = cli("--config", str(path), "rebuild", "win")
    assert win.exit_code == 2 and "rotated, not rebuilt" in win.stderr
    pg = cli("--config", str(path), "rebuild", "pg", env={"NOPE_DB_URL": None})
    assert pg.exit_code == 2 and "$NOPE_DB_URL, which is not set" in pg.stderr
    # a key the file does not declare is a key, as without a file
    items_csv(tmp_path / "x.csv", 10)
    other = cli("--config", str(path), "--url", plain.url, "rebuild", "other", "--from-csv", str(tmp_path / "x.csv"),
                "-c", "20", "-e", "1%", "--swap")  # fmt: skip
    assert other.exit_code == 0, other.output
    assert cli("--config", str(path), "rebuild", "--due").exit_code == 2
    assert cli("--config", str(path), "rebuild", "--all", "fed").exit_code == 2
    assert cli("--config", str(path), "rebuild", "--all", "--from-csv", "x.csv").exit_code == 2


SCHEDULED = """\
[filters.daily]
capacity = 200
error_rate = "1%"
source.csv = "a.csv"
rebuild.every = "1h"

[filters.filling]
capacity = 200
error_rate = "1%"
source.csv = "b.csv"
rebuild.when_fill_above = 0.6

[filters.fed]
capacity = 100
error_rate = "1%"

[filters.broken]
capacity = 100
error_rate = "1%"
source.csv = "not-there.csv"

[filters.seen]
type = "windowed"
capacity = 100
error_rate = "1%"
window.period = "1d"
window.keep = 3

[filters.unscheduled]
capacity = 100
error_rate = "1%"
source.csv = "a.csv"
"""


def test_rebuild_all_due(plain, tmp_path, cli):
    items_csv(tmp_path / "a.csv", 50)
    items_csv(tmp_path / "b.csv", 100)
    path = config(tmp_path, plain, SCHEDULED)
    metrics = tmp_path / "rebuild.prom"
    first = cli("--config", str(path), "rebuild", "--all", "--due", "--format", "json", "--metrics-file", str(metrics))
    assert first.exit_code == 8, first.output  # broken's source: the first failure's code, after every filter
    runs = {r["name"]: r for r in json.loads(first.stdout)["filters"]}
    assert runs["daily"]["action"] == "rebuild" and runs["daily"]["exit_code"] == 0 and runs["daily"]["swapped"]
    assert runs["filling"]["exit_code"] == 0 and runs["unscheduled"]["exit_code"] == 0  # missing: first builds
    assert runs["fed"]["action"] == "skip" and runs["fed"]["exit_code"] is None
    assert runs["broken"]["exit_code"] == 8 and "not-there.csv" in runs["broken"]["detail"]
    assert runs["seen"]["action"] == "rotate" and runs["seen"]["exit_code"] == 0
    client = client_of(plain)
    assert card(client, "daily") == 50 and card(client, "filling") == 100 and client.exists("fed") == 0
    text = metrics.read_text()
    assert (
        'bloomctl_rebuild_exit_code{key="broken"} 8.0' in text and 'bloomctl_rebuild_exit_code{key="daily"} 0.0' in text
    )
    assert 'bloomctl_last_success_timestamp_seconds{command="rebuild",key="daily"}' in text
    assert 'key="fed"' not in text and 'key="seen"' not in text

    path.write_text(path.read_text().replace('source.csv = "not-there.csv"', 'source.csv = "a.csv"'))
    second = cli("--config", str(path), "rebuild", "--all", "--due")
    assert second.exit_code == 0, second.output
    lines = {line.split()[0]: line for line in second.stdout.splitlines() if line and not line.startswith("\n")}
    assert (
        "skipped" in lines["daily"] and "not due: built" in lines["daily"] and "due in 56m" in lines["daily"]
    )  # (every 1h: met from 57m)
    assert "not due: fill 50.0% of 60.0%" in lines["filling"]
    assert "no schedule declared" in lines["unscheduled"]
    assert "rebuilt" in lines["broken"] and "missing: its first build" in second.stderr
    assert "rotated" in lines["seen"]
    assert second.stdout.rstrip().endswith("6 filter(s): 1 rebuilt, 1 rotated, 4 skipped, 0 failed (exit 0)")

    # an hour later, and more items in the second filter
    meta = KeyFamily.of("daily").meta
    client.hset(meta, "created_at", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3700)))
    items_csv(tmp_path / "a.csv", 60)
    raw = b"filling"
    backends.for_key(client, raw).madd(client, raw, [f"x{i}".encode() for i in range(40)])
    third = cli("--config", str(path), "rebuild", "--all", "--due", "--format", "json")
    assert third.exit_code == 0, third.output
    runs = {r["name"]: r for r in json.loads(third.stdout)["filters"]}
    assert runs["daily"]["action"] == "rebuild" and runs["daily"]["exit_code"] == 0
    assert "built 1h 1m ago, due every 1h" in third.stderr
    assert card(client, "daily") == 60
    assert runs["filling"]["action"] == "rebuild" and card(client, "filling") == 100  # rebuilt from its source
    assert runs["unscheduled"]["action"] == "skip"
    every = cli(
        "--config", str(path), "rebuild", "--all", "--format", "json"
    )  # --all alone: every filter with a source
    assert every.exit_code == 0
    assert sorted(r["name"] for r in json.loads(every.stdout)["filters"] if r["action"] == "rebuild") == [
        "broken", "daily", "filling", "unscheduled",
    ]  # fmt: skip


def test_rebuild_all_goes_on_past_a_held_lock(plain, tmp_path, cli):
    items_csv(tmp_path / "a.csv", 20)
    path = config(
        tmp_path,
        plain,
        '[filters.one]\ncapacity = 50\nerror_rate = "1%"\nsource.csv = "a.csv"\n'
        '[filters.two]\ncapacity = 50\nerror_rate = "1%"\nsource.csv = "a.csv"\n',
    )
    client = client_of(plain)
    client.set(KeyFamily.of("one").lock, "another run", px=60_000)
    result = cli("--config", str(path), "rebuild", "--all")
    assert result.exit_code == 6, result.output
    assert client.exists("one") == 0 and card(client, "two") == 20
    assert "FAILED (exit 6)" in result.stdout


def test_sigterm_stops_rebuild_all_between_nothing_half_done(plain, tmp_path):
    """The first filter is built; the second's source blocks (a FIFO nobody writes); SIGTERM: exit
    143, the first filter swapped in, the second's active key never made, the metrics file says so."""
    items_csv(tmp_path / "a.csv", 30)
    fifo = tmp_path / "slow.csv"
    os.mkfifo(fifo)
    path = config(
        tmp_path,
        plain,
        '[filters.first]\ncapacity = 50\nerror_rate = "1%"\nsource.csv = "a.csv"\n'
        '[filters.second]\ncapacity = 50\nerror_rate = "1%"\nsource.csv = "slow.csv"\n',
    )
    metrics = tmp_path / "m.prom"
    code = "import sys; from bloomctl.cli import main; sys.argv[0] = 'bloomctl'; main(prog_name='bloomctl')"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOOMCTL_")}
    process = subprocess.Popen(
        [sys.executable, "-c", code, "--config", str(path), "rebuild", "--all", "--metrics-file", str(metrics)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = client_of(plain)
    deadline = time.monotonic() + 60
    while client.exists("first") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # now blocked opening the FIFO
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 143, (out, err)
    assert "terminated (SIGTERM)" in err
    assert card(client, "first") == 30 and client.exists("second") == 0
    text = metrics.read_text()
    assert (
        'bloomctl_rebuild_exit_code{key="first"} 0.0' in text
        and 'bloomctl_rebuild_exit_code{key="second"} 143.0' in text
    )


# --- the example file, end to end ---------------------------------------------------------------


@pytest.fixture
def shop_db(pg_engine):
    """A database of its own for the example's `users` table (the example's query, as written)."""
    import sqlalchemy

    name = "bloomctl_example"
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    url = pg_engine.url.set(database=name)
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE users (id bigint PRIMARY KEY, deleted_at timestamptz)"))
        conn.execute(
            sqlalchemy.text(
                "INSERT INTO users SELECT g, CASE WHEN g % 10 = 0 THEN now() END FROM generate_series(1, 5000) g"
            )
        )
    yield url.render_as_string(hide_password=False)
    engine.dispose()
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture
def protected(workdir):
    server = RedisServer(workdir, extra=["--requirepass", "shop-secret-pw"])
    yield server
    server.stop()


def test_the_example_file_runs_end_to_end(protected, shop_db, cli, tmp_path):
    url = f"redis://127.0.0.1:{protected.port}/0"
    env = {"SHOP_REDIS_PASSWORD": "shop-secret-pw", "SHOP_DB_URL": shop_db}
    run = lambda *args: cli("--config", str(EXAMPLE), "--url", url, *args, env=env)  # noqa: E731

    assert run("config", "validate").exit_code == 0
    missing = run("check", "--format", "json")
    assert missing.exit_code == 5
    plan = run("apply", "--dry-run")
    assert plan.exit_code == 0 and "dry run: 3 to create, nothing changed" in plan.stdout
    applied = run("apply")
    assert applied.exit_code == 0, applied.output
    client = connect(settings_from(url, environ={"BLOOMCTL_PASSWORD": "shop-secret-pw"}))
    assert card(client, "shop:{users}") == 4500  # deleted users are not in it
    assert contains(client, "shop:{users}", ["user:1", "user:4999"]) == [True, True]
    assert card(client, "shop:{skus}") == 2000 and contains(client, "shop:{skus}", ["SKU-000001"]) == [True]
    from bloomctl.filters.windowed import WindowedFilter

    dedupe = WindowedFilter(client, "shop:dedupe")
    dedupe.add(b"event-1")
    assert dedupe.exists(b"event-1") and not dedupe.exists(b"event-2")
    healthy = run("check", "--format", "json")
    assert healthy.exit_code == 0, healthy.output  # (the test server's persistence: a warning, it passes)
    results = json.loads(healthy.stdout)["results"]
    assert {r["status"] for r in results if not r["subject"].startswith("server")} <= {"ok", "skip"}
    cron = run("rebuild", "--all", "--due")
    assert cron.exit_code == 0, cron.output
    assert "3 filter(s): 0 rebuilt, 1 rotated, 2 skipped, 0 failed (exit 0)" in cron.stdout
    junit = run("check", "--format", "junit")
    assert junit.exit_code == 0 and 'failures="0"' in junit.stdout
    assert "shop-secret-pw" not in "".join(r.output for r in (missing, plan, applied, healthy, cron, junit))
    wrong = cli("--config", str(EXAMPLE), "--url", url, "check", env={**env, "SHOP_REDIS_PASSWORD": "nope"})
    assert wrong.exit_code == 3 and "nope" not in wrong.output


def _section(page: str, heading: str) -> str:
    return page.split(heading + "\n", 1)[1].split("\n## ", 1)[0]


def test_the_operations_page_crontab_line_and_cronjob_run(protected, shop_db, tmp_path):
    """docs/operations.md, "One file per application": the crontab line runs as cron runs it (env -i,
    /bin/sh -c) with the example file; the CronJob manifest parses, its ConfigMap, mount, Secret and
    the file's variables agree, and its command runs."""
    import re
    import shutil

    yaml = pytest.importorskip("yaml")
    page = _section((ROOT / "docs" / "operations.md").read_text(), "## One file per application")
    url = f"redis://127.0.0.1:{protected.port}/0"
    # the example, installed with the test server's URL in place of its own
    shutil.copytree(EXAMPLE.parent / "data", tmp_path / "data")
    installed = tmp_path / "shop.toml"
    installed.write_text(EXAMPLE.read_text().replace('url = "redis://127.0.0.1:6379/0"', f'url = "{url}"'))
    (tmp_path / "shop.env").write_text(f"SHOP_REDIS_PASSWORD=shop-secret-pw\nSHOP_DB_URL={shop_db}\n")
    wrapper = tmp_path / "bloomctl"
    wrapper.write_text(
        f"#!/bin/sh\nexec {sys.executable} -c \"import sys; from bloomctl.cli import main; sys.argv[0] = 'bloomctl'; "
        f'main(prog_name=\'bloomctl\')" "$@"\n'
    )
    wrapper.chmod(0o755)
    line = re.search(r"^\*/15 \* \* \* \* bloomctl (.+)$", page, re.M).group(1)
    command = (
        line.replace("/etc/bloomctl/shop.env", str(tmp_path / "shop.env"))
        .replace("/etc/bloomctl/shop.toml", str(installed))
        .replace("/opt/bloomctl/bin/bloomctl", str(wrapper))
        .replace("/var/log/bloomctl/shop.log", str(tmp_path / "shop.log"))
    )
    crontab = re.search(r"```sh\n(SHELL=.*?)```", page, re.S).group(1)
    variables = dict(re.findall(r"^([A-Z]+)=(\S+)$", crontab, re.M))
    assert variables["SHELL"] == "/bin/sh" and line in crontab
    assert variables["PATH"] == "/usr/bin:/bin"
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    env = {"SHELL": "/bin/sh", "PATH": variables["PATH"], "HOME": str(tmp_path), "LOGNAME": "bloomctl",
           "TEXTFILE": str(textfile), "PYTHONPATH": str(ROOT)}  # fmt: skip
    done = subprocess.run(["env", "-i", *[f"{k}={v}" for k, v in env.items()], "/bin/sh", "-c", command], timeout=300)
    assert done.returncode == 0, (tmp_path / "shop.log").read_text()
    log = [json.loads(line) for line in (tmp_path / "shop.log").read_text().splitlines() if line.startswith("{")]
    assert any("users: rebuild: missing: its first build" in entry["message"] for entry in log)
    metrics = (textfile / "bloomctl-shop.prom").read_text()
    assert 'bloomctl_rebuild_exit_code{key="shop:{users}"} 0.0' in metrics
    assert 'bloomctl_rebuild_exit_code{key="shop:{skus}"} 0.0' in metrics
    assert "shop-secret-pw" not in metrics + (tmp_path / "shop.log").read_text()

    # the CronJob
    blocks = re.findall(r"```yaml\n(.*?)```", page, re.S)
    assert len(blocks) == 1
    (cronjob,) = list(yaml.safe_load_all(blocks[0]))
    assert cronjob["kind"] == "CronJob" and cronjob["apiVersion"] == "batch/v1"
    spec = cronjob["spec"]
    assert spec["concurrencyPolicy"] == "Forbid" and len(spec["schedule"].split()) == 5
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    args = container["command"]
    assert args[0] == "bloomctl" and args[args.index("rebuild") :][:3] == ["rebuild", "--all", "--due"]
    kubectl = " ".join(page.split("```sh\nkubectl", 1)[1].split("```", 1)[0].replace("\\\n", " ").split())
    configmap = re.search(r"create configmap (\S+) --from-file=([^=]+)=examples/bloomctl\.toml", kubectl)
    secret = re.search(r"create secret generic (\S+)((?: --from-literal=[A-Z_]+=\S+)+)", kubectl)
    (volume,) = pod["volumes"]
    (mount,) = container["volumeMounts"]
    assert volume["configMap"]["name"] == configmap.group(1) and mount["name"] == volume["name"]
    assert args[args.index("--config") + 1] == f"{mount['mountPath']}/{configmap.group(2)}"
    assert container["envFrom"] == [{"secretRef": {"name": secret.group(1)}}]
    keys = set(re.findall(r"--from-literal=([A-Z_]+)=", secret.group(2)))
    declared = load(EXAMPLE)
    named = {p.password_env for p in declared.profiles.values()} | {
        d.source["db_url_env"] for d in declared.filters.values() if "db_url_env" in d.source
    }
    assert keys == named
    # its command, as written (the ConfigMap's file and the cluster's URL replaced by the test's)
    words = [str(installed) if w == args[args.index("--config") + 1] else url if w.startswith("redis://") else w
             for w in args[1:]]  # fmt: skip
    ran = subprocess.run(
        [str(wrapper), *words],
        env={**env, "SHOP_REDIS_PASSWORD": "shop-secret-pw", "SHOP_DB_URL": shop_db},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    # with --log-format json the summary is a JSON line too (issue 23 item 4): one record a line
    summary = json.loads(ran.stdout)
    assert summary["exit_code"] == 0 and {run["action"] for run in summary["filters"]} >= {"skip"}


# --- review findings ---------------------------------------------------------------------------


def test_rebuild_all_takes_the_command_lines_options_and_refuses_each_filters_own(plain, tmp_path, cli):
    items_csv(tmp_path / "a.csv", 30)
    path = config(
        tmp_path,
        plain,
        '[filters.one]\ncapacity = 100\nerror_rate = "1%"\nsource.csv = "a.csv"\nrebuild.swap = false\n'
        '[filters.w]\ntype = "windowed"\ncapacity = 10\nerror_rate = "1%"\nwindow.period = "1d"\nwindow.keep = 2\n',
    )
    path.write_text(path.read_text() + '[filters.cf]\ntype = "cuckoo"\ncapacity = 100\nsource.csv = "a.csv"\n')
    metrics = tmp_path / "dry.prom"
    plain.client().execute_command("FUNCTION", "FLUSH")
    before = snapshot(client_of(plain))
    dry = cli("--config", str(path), "rebuild", "--all", "--dry-run", "--metrics-file", str(metrics))
    assert dry.exit_code == 0, dry.output
    assert snapshot(client_of(plain)) == before  # nothing written: no filter, no window, no function library
    assert plain.client().execute_command("FUNCTION", "LIST") == []
    assert not metrics.exists() and "would be rebuilt" in dry.stdout  # a dry run is no success to record
    swapped = cli("--config", str(path), "rebuild", "--all", "--swap", "--format", "json")
    assert swapped.exit_code == 0 and client_of(plain).exists("one") == 1  # --swap wins over rebuild.swap = false
    for flag in (["--capacity", "5000"], ["--prefix", "user:"], ["--column", "id"], ["--allow-recipe-change"]):
        refused = cli("--config", str(path), "rebuild", "--all", *flag)
        assert refused.exit_code == 2 and "each filter's own" in refused.stderr, (flag, refused.stderr)
    client_of(plain).set(KeyFamily.of("one").lock, "another run", px=60_000)
    waited = time.monotonic()
    held = cli("--config", str(path), "rebuild", "--all", "--lock-wait", "1")
    assert held.exit_code == 6 and time.monotonic() - waited >= 1  # --lock-wait reached the rebuild


def test_the_metrics_file_keeps_what_this_run_did_not_touch(plain, tmp_path, cli):
    items_csv(tmp_path / "a.csv", 10)
    path = config(
        tmp_path,
        plain,
        '[filters.one]\ncapacity = 50\nerror_rate = "1%"\nsource.csv = "a.csv"\nrebuild.every = "1d"\n'
        '[filters.two]\ncapacity = 50\nerror_rate = "1%"\nsource.csv = "a.csv"\nrebuild.every = "1d"\n',
    )
    metrics = tmp_path / "m.prom"
    assert cli("--config", str(path), "rebuild", "--all", "--due", "--metrics-file", str(metrics)).exit_code == 0
    first = metrics.read_text()
    nothing_due = cli("--config", str(path), "rebuild", "--all", "--due", "--metrics-file", str(metrics))
    assert nothing_due.exit_code == 0 and "2 skipped" in nothing_due.stdout
    kept = metrics.read_text()
    for key in ("one", "two"):
        for name in ("bloomctl_rebuild_exit_code", "bloomctl_last_success_timestamp_seconds"):
            line = next(line for line in first.splitlines() if line.startswith(name) and f'key="{key}"' in line)
            assert line in kept, (name, key)
    assert "bloomctl_rebuild_all_exit_code 0.0" in kept
    path.write_text("version = 2\n")  # a broken file: the run's code lands in the file, the rest stays
    broken = cli("--config", str(path), "rebuild", "--all", "--due", "--metrics-file", str(metrics))
    assert broken.exit_code == 2
    after = metrics.read_text()
    assert "bloomctl_rebuild_all_exit_code 2.0" in after and 'bloomctl_rebuild_exit_code{key="one"} 0.0' in after


def test_a_source_on_the_command_line_keeps_its_old_meaning(plain, tmp_path, cli, monkeypatch):
    """A bloomctl.toml in the directory (or $BLOOMCTL_CONFIG) never changes what `rebuild KEY
    --from-...` does; with --config given, the declaration's key and profile are used, and the new
    filter is swapped in only with --swap."""
    items_csv(tmp_path / "u.csv", 20)
    monkeypatch.chdir(tmp_path)
    config(tmp_path, plain, '[filters.users]\nkey = "app:{users}"\ncapacity = 100\nerror_rate = "1%"\n')
    plain_run = cli(
        "--url", plain.url, "rebuild", "users", "--from-csv", "u.csv", "-c", "40", "-e", "1%", "--format", "json"
    )
    assert plain_run.exit_code == 0, plain_run.output
    assert json.loads(plain_run.stdout)["key"] == "users" and json.loads(plain_run.stdout)["swapped"] is False
    (tmp_path / "bloomctl.toml").write_text("version = 2\n")  # an invalid file there does not block it
    again = cli("--url", plain.url, "rebuild", "users", "--from-csv", "u.csv", "-c", "40", "-e", "1%", "--swap")
    assert again.exit_code == 0, again.output
    declared = config(tmp_path, plain, '[filters.fed]\nkey = "app:{fed}"\ncapacity = 100\nerror_rate = "1%"\n')
    fed = cli("--config", str(declared), "rebuild", "fed", "--from-csv", "u.csv", "--format", "json")
    assert fed.exit_code == 0, fed.output
    report = json.loads(fed.stdout)
    assert report["key"] == "app:{fed}" and report["swapped"] is False  # an application-fed filter: only with --swap


def test_the_declared_database_and_the_command_lines(plain, pg_engine, tmp_path, cli):
    import sqlalchemy

    with pg_engine.begin() as conn:
        conn.execute(sqlalchemy.text("DROP TABLE IF EXISTS sched_items"))
        conn.execute(sqlalchemy.text("CREATE TABLE sched_items AS SELECT g AS id FROM generate_series(1, 40) g"))
    url = pg_engine.url.render_as_string(hide_password=False)
    path = config(
        tmp_path,
        plain,
        '[filters.pg]\ncapacity = 100\nerror_rate = "1%"\nsource.sql = "SELECT id FROM sched_items"\n'
        'source.db_url_env = "SCHED_DB_URL"\n',
    )
    given = cli("--config", str(path), "rebuild", "pg", "--db-url", url, env={"SCHED_DB_URL": None})
    assert given.exit_code == 0, given.output  # the command line's URL: the declared variable is not needed
    query = cli(
        "--config", str(path), "rebuild", "pg", "--from-sql", "SELECT id FROM sched_items WHERE id <= 40", "--swap",
        "--allow-recipe-change", env={"SCHED_DB_URL": url},
    )  # fmt: skip
    assert query.exit_code == 0, query.output  # the command line's query, on the declared database
    with pg_engine.begin() as conn:
        conn.execute(sqlalchemy.text("DROP TABLE sched_items"))


def test_when_a_filter_is_due(plain, tmp_path, cli):
    from bloomctl.declared.config import load
    from bloomctl.declared.schedule import REBUILD, SKIP, decide

    items_csv(tmp_path / "a.csv", 10)
    path = config(
        tmp_path,
        plain,
        '[filters.daily]\ncapacity = 50\nerror_rate = "1%"\nsource.csv = "a.csv"\nrebuild.every = "24h"\n'
        '[filters.reserved]\ncapacity = 50\nerror_rate = "1%"\nsource.csv = "a.csv"\nrebuild.every = "24h"\n'
        '[filters.big]\ncapacity = 300\nerror_rate = "1%"\nshards = 3\nsource.csv = "a.csv"\nrebuild.every = "24h"\n',
    )
    for name in ("daily", "big"):
        assert cli("--config", str(path), "rebuild", name).exit_code == 0
    assert cli("--url", plain.url, "reserve", "reserved", "-c", "50", "-e", "1%").exit_code == 0
    decls = load(path).filters
    client = client_of(plain)
    built = client.hget(KeyFamily.of("daily").meta, "created_at").decode()
    from bloomctl.declared.schedule import built_at

    made = built_at({"created_at": built})
    assert (
        decide(client, decls["daily"], now=made + 23 * 3600 - 60).action == SKIP
    )  # (met from 23h: an hour early at most)
    assert decide(client, decls["daily"], now=made + 24 * 3600 - 60).action == REBUILD  # a daily job stays daily
    client.hset(KeyFamily.of("daily").meta, "created_at", "2099-01-01T00:00:00Z")
    assert "in the future" in decide(client, decls["daily"]).reason
    assert decide(client, decls["reserved"]).reason == "never built from its source (no item recipe recorded)"
    from bloomctl.lifecycle.manifest import read_manifest

    assert decide(client, decls["big"]).action == SKIP
    client.delete(read_manifest(client, "big").members[1])
    assert decide(client, decls["big"]).reason == "a member of the sharded filter is missing"


@pytest.mark.redisbloom
def test_a_cuckoo_filter_that_grew_is_due(bloom, tmp_path, cli):
    """A cuckoo filter's load is over all its sub-filters: growing lowers it. Grown is due."""
    from bloomctl.declared.config import load
    from bloomctl.declared.schedule import SKIP, decide

    items_csv(tmp_path / "a.csv", 10)
    path = config(
        tmp_path,
        bloom,
        '[filters.cf]\ntype = "cuckoo"\ncapacity = 64\nexpansion = 1\nsource.csv = "a.csv"\nrebuild.when_fill_above = 0.9\n',
    )
    assert cli("--config", str(path), "rebuild", "cf").exit_code == 0
    client = client_of(bloom)
    decl = load(path).filters["cf"]
    assert decide(client, decl).action == SKIP
    backend = backends.for_key(client, b"cf")
    backend.madd(client, b"cf", [f"more{i}".encode() for i in range(200)])
    assert backend.info(client, b"cf").filters > 1
    assert decide(client, decl).reason.startswith("grew to ")


def test_apply_swaps_in_a_first_build_even_with_rebuild_swap_false(plain, tmp_path, cli):
    items_csv(tmp_path / "a.csv", 10)
    path = config(
        tmp_path, plain, '[filters.one]\ncapacity = 50\nerror_rate = "1%"\nsource.csv = "a.csv"\nrebuild.swap = false\n'
    )
    assert cli("--config", str(path), "apply").exit_code == 0
    assert card(client_of(plain), "one") == 10
    assert cli("--config", str(path), "rebuild", "one").exit_code == 0  # a standby waits for its swap
    due = cli("--config", str(path), "rebuild", "--all", "--due")
    assert "a verified standby waits for `bloomctl swap one` (rebuild.swap = false)" in due.stdout


def test_metrics_of_a_declared_filter_are_its_keys_and_the_last_all_run_stays(plain, tmp_path, cli):
    from tests.servers import free_port

    items_csv(tmp_path / "a.csv", 10)
    metrics = tmp_path / "m.prom"
    dead = config(
        tmp_path,
        plain,
        '[filters.users]\nkey = "shop:{users}"\ncapacity = 50\nerror_rate = "1%"\nsource.csv = "a.csv"\n',
    )
    dead.write_text(dead.read_text().replace(plain.url, f"redis://127.0.0.1:{free_port()}/0"))
    failed = cli("--config", str(dead), "--connect-timeout", "0.5", "rebuild", "users", "--metrics-file", str(metrics))
    assert failed.exit_code == 3
    assert 'bloomctl_rebuild_exit_code{key="shop:{users}"} 3.0' in metrics.read_text()
    assert 'key="users"' not in metrics.read_text()
    path = config(
        tmp_path,
        plain,
        '[filters.users]\nkey = "shop:{users}"\ncapacity = 50\nerror_rate = "1%"\nsource.csv = "missing.csv"\n'
        '[filters.two]\ncapacity = 50\nerror_rate = "1%"\nsource.csv = "a.csv"\n',
    )
    assert cli("--config", str(path), "rebuild", "--all", "--metrics-file", str(metrics)).exit_code == 8
    assert cli("--config", str(path), "rebuild", "two", "--metrics-file", str(metrics)).exit_code == 0
    text = metrics.read_text()
    assert "bloomctl_rebuild_all_exit_code 8.0" in text  # a single filter's run keeps the last --all's code
    assert 'bloomctl_rebuild_exit_code{key="two"} 0.0' in text


def test_a_first_build_with_swap_false_waits_for_its_swap(plain, tmp_path, cli):
    items_csv(tmp_path / "a.csv", 10)
    path = config(
        tmp_path,
        plain,
        '[filters.one]\ncapacity = 50\nerror_rate = "1%"\nsource.csv = "a.csv"\nrebuild.swap = false\n'
        'rebuild.every = "1d"\n'
        '[filters.big]\ncapacity = 300\nerror_rate = "1%"\nshards = 2\nsource.csv = "a.csv"\nrebuild.swap = false\n'
        'rebuild.every = "1d"\n',
    )
    assert cli("--url", plain.url, "reserve", "big", "-c", "300", "-e", "1%", "--shards", "2").exit_code == 0
    first = cli("--config", str(path), "rebuild", "--all", "--due")
    assert first.exit_code == 0, first.output
    second = cli("--config", str(path), "rebuild", "--all", "--due", "--format", "json")
    runs = {r["name"]: r for r in json.loads(second.stdout)["filters"]}
    assert runs["one"]["action"] == "skip" and "a verified standby waits" in runs["one"]["reason"]
    assert runs["big"]["action"] == "skip" and "a verified standby waits" in runs["big"]["reason"]
    assert client_of(plain).exists("one") == 0  # (nothing swapped: rebuild.swap = false)


def test_bloomctl_password_reaches_the_server_the_command_line_names(protected, tmp_path, cli):
    path = tmp_path / "p.toml"
    path.write_text(
        '[profiles.default]\nurl = "redis://127.0.0.1:1/0"\n[filters.a]\ncapacity = 10\nerror_rate = "1%"\n'
    )
    url = f"redis://127.0.0.1:{protected.port}/0"
    result = cli("--config", str(path), "--url", url, "apply", env={"BLOOMCTL_PASSWORD": "shop-secret-pw"})
    assert result.exit_code == 0, result.output


def test_a_server_error_names_the_profiles_server_not_the_global_one(plain, tmp_path, cli):
    """A full profile server refused the lock's SET; the error named $BLOOMCTL_URL's server (or
    localhost), which the run never talked to."""
    (tmp_path / "s.csv").write_text("id\n1\n2\n")
    path = tmp_path / "bloomctl.toml"
    path.write_text(
        f'[profiles.default]\nurl = "{plain.url}"\n[filters.s1]\ncapacity = 10\nerror_rate = "1%"\nsource.csv = "s.csv"\n'
    )
    admin = plain.client()
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", str(max(used // 2, 1)))
    try:
        result = cli(
            "--config", str(path), "rebuild", "s1", env={"BLOOMCTL_URL": "redis://:hunter2@elsewhere.invalid:6380/3"}
        )
    finally:
        admin.config_set("maxmemory", "0")
    assert result.exit_code == 3, result.output
    assert f"127.0.0.1:{plain.port}" in result.stderr or f"localhost:{plain.port}" in result.stderr, result.stderr
    assert "elsewhere" not in result.stderr and "hunter2" not in result.output


PASSWORD_ENV_FILE = (
    '[profiles.default]\nurl = "{url}"\npassword_env = "RPW"\n[filters.s1]\ncapacity = 10\nerror_rate = "1%"\n'
)


@contextlib.contextmanager
def requirepass(server, password: str):
    """The server asks for ``password`` inside the block (and for none again after it)."""
    import redis

    server.client().config_set("requirepass", password)
    try:
        yield
    finally:
        redis.Redis(port=server.port, password=password).config_set("requirepass", "")


def test_a_wrong_profile_password_names_its_variable_never_the_password(plain, tmp_path, cli):
    path = tmp_path / "bloomctl.toml"
    path.write_text(PASSWORD_ENV_FILE.format(url=plain.url))
    with requirepass(plain, "right-one"):
        result = cli("--config", str(path), "check", env={"RPW": "wr0ng-s3cret"})
    assert result.exit_code == 3, result.output
    assert "authentication failed" in result.stdout and "$RPW" in result.stdout
    assert "BLOOMCTL_PASSWORD" not in result.output and "wr0ng" not in result.output


def test_the_password_hint_names_what_was_sent(plain, tmp_path, cli):
    """The command line's URL password wins over the profile's $RPW: the hint must not blame $RPW;
    a URL naming a user keeps 'the URL's user' in the hint."""
    path = tmp_path / "bloomctl.toml"
    path.write_text(PASSWORD_ENV_FILE.format(url=plain.url))
    user_url = tmp_path / "u.toml"
    user_url.write_text(PASSWORD_ENV_FILE.format(url=f"redis://alice@127.0.0.1:{plain.port}/0"))
    wrong_url = f"redis://:wr0ng@127.0.0.1:{plain.port}/0"
    with requirepass(plain, "right-one"):
        url_wins = cli("--config", str(path), "--url", wrong_url, "check", env={"RPW": "right-one"})
        no_such_user = cli("--config", str(user_url), "check", env={"RPW": "right-one"})
    assert url_wins.exit_code == 3 and "authentication failed" in url_wins.stdout
    assert "$RPW" not in url_wins.stdout and "wr0ng" not in url_wins.output
    assert no_such_user.exit_code == 3 and "the URL's user and the password in $RPW" in no_such_user.stdout
