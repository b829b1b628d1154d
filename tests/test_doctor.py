"""`bloomctl doctor` on real servers: a healthy one, an evicting policy, no persistence, a replica cut
off from its master, a Cluster, a restricted ACL user, and the ACL SETUSER lines it prints, created
on the server and used for the whole lifecycle. The command table is checked against what bloomctl
really sends (MONITOR) and against its source."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
import redis

from bloomctl.cli import main
from bloomctl.doctor.commands import APPLICATION, COMMANDS, DOCTOR, DOCTOR_CLUSTER, acl_name, command_table_markdown
from bloomctl.keys import KeyFamily
from tests.fixtures.redis import Cli
from tests.servers import RedisServer

pytestmark = pytest.mark.matrix

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "doctor-s3cr3t/pw"


@contextlib.contextmanager
def server_config(client: redis.Redis, **values: str):
    """CONFIG SET for the block, the old values put back after it."""
    old = {name: client.config_get(name)[name] for name in values}
    try:
        for name, value in values.items():
            client.config_set(name, value)
        yield
    finally:
        for name, value in old.items():
            client.config_set(name, value)


@contextlib.contextmanager
def acl_user(client: redis.Redis, name: str, *rules: str):
    client.execute_command("ACL", "SETUSER", name, "reset", "on", f">{PASSWORD}", *rules)
    try:
        yield f"redis://{name}:{PASSWORD.replace('/', '%2F')}@127.0.0.1:{client.connection_pool.connection_kwargs['port']}/0"
    finally:
        client.execute_command("ACL", "DELUSER", name)


def doctor_json(cli: Cli, *args: str, url: str | None = None) -> tuple[int, dict]:
    result = cli("doctor", *args, "--format", "json", url=url)
    assert "Traceback" not in result.stderr, result.stderr
    return result.exit_code, json.loads(result.stdout)


def levels(data: dict, check: str) -> list[str]:
    return [f["level"] for f in data["findings"] if f["check"] == check]


def reserve(cli: Cli, key: str = "users", url: str | None = None) -> None:
    result = cli("reserve", key, "-c", "10000", "-e", "1%", "--nonscaling", "--format", "json", url=url)
    assert result.exit_code == 0, result.stderr


# --- the server's settings ------------------------------------------------------------------


def test_a_healthy_server_exits_0_and_says_why(plain, cli_plain):
    reserve(cli_plain)
    with server_config(plain.client(), save="3600 1", maxmemory="1gb"):
        result = cli_plain("doctor", "users", "--format", "text")
        assert result.exit_code == 0, result.stdout + result.stderr
        assert "ERROR" not in result.stdout
        assert re.search(r"ok +RDB \(save 3600 1\)", result.stdout), result.stdout
        assert re.search(r"ok +maxmemory-policy noeviction", result.stdout)
        assert re.search(r"ok +room to rebuild the largest filter 'users'", result.stdout)
        assert "0 error(s)" in result.stdout and "fit for Bloom filters" in result.stdout
        code, data = doctor_json(cli_plain, "users")
    assert code == 0 and data["summary"] == {"errors": 0, "warnings": data["summary"]["warnings"], "ok": True}
    assert levels(data, "persistence") == ["ok"] and levels(data, "eviction") == ["ok"]
    server = data["server"]
    assert server["line"] in ("bitmap", "redis8", "redisbloom2") and server["product"] in ("redis", "valkey")
    assert server["backends"]["in_use"] == [data["filters"][0]["backend"]]


def test_no_persistence_is_a_warning_that_says_how_to_enable_it(plain, cli_plain):
    code, data = doctor_json(cli_plain)  # the test servers run with save "" and appendonly no
    persistence = [f for f in data["findings"] if f["check"] == "persistence"]
    assert [f["level"] for f in persistence] == ["warning"], persistence
    assert "lost when the server restarts" in persistence[0]["message"]
    assert "appendonly yes" in persistence[0]["fix"]
    assert code == 0  # a warning alone


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lfu"])
def test_an_evicting_policy_is_an_error_naming_it(plain, cli_plain, policy):
    reserve(cli_plain)
    with server_config(plain.client(), **{"maxmemory-policy": policy, "maxmemory": "1gb"}):
        result = cli_plain("doctor", "users")
        assert result.exit_code == 1, result.stdout + result.stderr
        line = next(line for line in result.stdout.splitlines() if line.startswith("  ERROR"))
        assert f"maxmemory-policy {policy}" in line
        assert ("filters and their standbys" in line) if policy.startswith("allkeys") else ("rollback" in line)
        assert "maxmemory-policy noeviction" in result.stdout  # the fix
        assert "NOT fit" in result.stdout
        with server_config(plain.client(), maxmemory="0"):  # no limit: nothing is evicted yet
            code, data = doctor_json(cli_plain, "users")
            assert code == 0 and levels(data, "eviction") == ["warning"]


def test_no_room_to_rebuild_the_largest_filter_is_an_error(plain, cli_plain):
    client = plain.client()
    cli_plain("reserve", "small", "-c", "1000", "-e", "1%", "--nonscaling")
    result = cli_plain("reserve", "big", "-c", "2M", "-e", "1%", "--nonscaling", "--format", "json")
    assert result.exit_code == 0, result.stderr
    size = json.loads(result.stdout)["filter"]["size_bytes"]
    used = client.info("memory")["used_memory"]
    with server_config(client, maxmemory=str(used + size // 2)):
        code, data = doctor_json(cli_plain)
    memory = [f for f in data["findings"] if f["check"] == "memory"]
    assert code == 1 and [f["level"] for f in memory] == ["error"], memory
    assert "no room to rebuild 'big'" in memory[0]["message"] and memory[0]["detail"]["size_bytes"] == size
    assert sorted(f["key"] for f in data["filters"]) == ["big", "small"]  # found by the bounded SCAN


def test_a_missing_key_is_a_clear_error(plain, cli_plain):
    reserve(cli_plain)
    code, data = doctor_json(cli_plain, "users", "userz")
    keys = [f for f in data["findings"] if f["check"] == "keys"]
    assert code == 1
    assert [(f["level"], f["detail"]["key"]) for f in keys] == [("ok", "users"), ("error", "userz")]
    assert keys[1]["message"].startswith("filter 'userz' does not exist")
    assert keys[1]["message"].endswith("; did you mean 'users'?")  # on Valkey too (topology.scan_type)


def test_a_replica_cut_off_from_its_master_is_an_error(workdir, plain):
    dead = plain.port + 1 if plain.port < 65535 else plain.port - 1
    replica = RedisServer(workdir, extra=["--replicaof", "127.0.0.1", str(dead)])
    try:
        code, data = doctor_json(Cli(replica.url))
    finally:
        replica.stop()
    replication = [f for f in data["findings"] if f["check"] == "replication"]
    assert code == 1 and [f["level"] for f in replication] == ["error"], replication
    assert f"link to its master 127.0.0.1:{dead} is down" in replication[0]["message"]


@pytest.mark.cluster
def test_a_cluster_covers_every_slot_and_every_master_answers(cluster):
    cli = Cli(cluster.url)
    reserve(cli)
    code, data = doctor_json(cli, "users")
    messages = [f["message"] for f in data["findings"] if f["check"] == "cluster" and f["level"] == "ok"]
    assert code == 0, data["findings"]
    assert "cluster_state ok, all 16,384 slots covered by 3 masters" in messages
    assert "every master answers (3)" in messages
    persistence = [f for f in data["findings"] if f["check"] == "persistence"]
    assert len(persistence[0]["detail"]["nodes"]) == 3  # one verdict for the three masters
    lines = data["acl"]["setuser"]
    assert "+cluster|slots" in lines["operator"] and "+cluster|slots" in lines["application"]
    for node in cluster.nodes:  # ACL users are each node's own
        _setuser(node.client(), lines["operator"], "op-pw")
        _setuser(node.client(), lines["application"], "app-pw")
    try:
        _cluster_lifecycle(cluster)
    finally:
        for node in cluster.nodes:
            node.client().execute_command("ACL", "DELUSER", "bloomctl-operator", "bloomctl-app")


def _cluster_lifecycle(cluster) -> None:
    op = Cli(f"redis://bloomctl-operator:op-pw@127.0.0.1:{cluster.nodes[0].port}/0")
    assert op("info", "users", "--format", "json").exit_code == 0
    # a standby as a rebuild leaves it (made by the admin: reserving a companion by name is no operator's step)
    result = Cli(cluster.url)("reserve", "{users}:standby", "-c", "10000", "-e", "1%", "--nonscaling")
    assert result.exit_code == 0, result.stderr
    result = op("swap", "users", "--yes", "--min-ratio", "0")
    assert result.exit_code == 0 and op("rollback", "users", "--yes").exit_code == 0, result.stderr
    from bloomctl import open_filter
    from bloomctl.server.connection import connect, settings_from

    url = f"redis://bloomctl-app:app-pw@127.0.0.1:{cluster.nodes[0].port}/0"
    users = open_filter(connect(settings_from(url, cluster=True)), "users")  # (no INFO: say it is a Cluster)
    assert users.madd(["a"], dual_write=True) == [True] and users.mexists(["a", "b"]) == [True, False]


def test_json_is_one_stable_object(plain, cli_plain):
    code, data = doctor_json(cli_plain)
    assert set(data) == {"url", "server", "findings", "filters", "acl", "summary"}
    assert {"product", "version", "line", "modules", "backends", "cluster", "scan"} <= set(data["server"])
    for finding in data["findings"]:
        assert set(finding) == {"check", "level", "message", "detail", "fix"}
        assert finding["level"] in ("ok", "info", "warning", "error")
    assert {"user", "method", "groups", "setuser", "password_note"} <= set(data["acl"])
    groups = [g["command"] for g in data["acl"]["groups"]]
    assert groups == [g for g in COMMANDS if g in main.commands and g != "plan"]
    assert set(data["summary"]) == {"errors", "warnings", "ok"} and code == 0


# --- the user's rights -----------------------------------------------------------------------


def test_a_restricted_user_is_told_what_it_cannot_run_without_a_crash(plain, cli_plain):
    reserve(cli_plain)
    rules = ["~*", "&*", "+@all", "-@dangerous", "-@scripting", "+function|list"]
    with acl_user(plain.client(), "reader", *rules) as url:
        result = Cli(url)("doctor", "users")
        code, data = doctor_json(Cli(url), "users")
    assert result.exit_code == code == 0, result.stdout + result.stderr  # warnings: it may be meant to read only
    assert "Traceback" not in result.stderr and result.stderr == "", result.stderr
    assert "not allowed to read the persistence settings (INFO persistence)" in result.stdout
    assert "not allowed to read maxmemory-policy (INFO memory)" in result.stdout
    access = {g["command"]: g for g in data["acl"]["groups"]}
    assert data["acl"]["user"] == "reader" and data["acl"]["method"] == "queued"  # no ACL DRYRUN for this user
    assert access["swap"]["allowed"] is False and access["rebuild"]["allowed"] is False
    assert {"evalsha", "info"} <= {d["command"] for d in access["swap"]["denied"]}
    assert re.search(r"reader cannot run `bloomctl swap`: no permission for .*EVALSHA", result.stdout)
    assert re.search(r"^  swap +no: needs .*EVALSHA", result.stdout, re.M)


def test_an_admin_checks_another_user_with_acl_dryrun(plain, cli_plain):
    reserve(cli_plain)
    with acl_user(plain.client(), "looker", "~users", "~{users}:*", "+@read"):
        code, data = doctor_json(cli_plain, "users", "--acl-user", "looker")
    access = {g["command"]: g for g in data["acl"]["groups"]}
    assert data["acl"]["method"] == "dryrun" and data["acl"]["user"] == "looker"
    assert access["reserve"]["allowed"] is False and access["fill-ratio"]["allowed"] is False  # no INFO, no SCAN of ~*
    denied = {d["call"].split()[0] for d in access["reserve"]["denied"]}
    assert {"HSET", "DEL"} <= denied and "TYPE" not in denied
    assert code == 0


def _setuser(client: redis.Redis, line: str, password: str) -> None:
    assert "CHANGE_ME" in line and password not in line
    words = shlex.split(line.replace(">CHANGE_ME", f">{password}"))
    assert words[:2] == ["ACL", "SETUSER"]
    assert client.execute_command(*words) in (b"OK", "OK")


@pytest.mark.parametrize("server_fixture", ["plain", pytest.param("bloom", marks=pytest.mark.redisbloom)])
def test_the_printed_acl_lines_work(request, tmp_path, server_fixture):
    """The operator line runs the whole lifecycle on the filter's keys, and nothing else; the
    application line looks up and adds (dual writes too), and may not delete, flush or reserve."""
    from bloomctl import open_filter
    from bloomctl.server.connection import connect, settings_from

    server = request.getfixturevalue(server_fixture)
    admin, cli = server.client(), Cli(server.url)
    reserve(cli)
    _, data = doctor_json(cli, "users")
    lines, backends = data["acl"]["setuser"], data["server"]["backends"]["in_use"]
    needed = {g["command"]: g["needed"] for g in data["acl"]["groups"]}
    assert needed["functions"] == ("bitmap" in backends) and needed["swap"]
    assert "+@all" not in lines["operator"] and "CHANGE_ME" in lines["operator"]
    _setuser(admin, lines["operator"], "op-pw")
    _setuser(admin, lines["application"], "app-pw")
    if "functions" in lines:  # installing bloomctl's library is a line of its own (FUNCTION LOAD)
        _setuser(admin, lines["functions"], "fn-pw")
    try:
        op = Cli(f"redis://bloomctl-operator:op-pw@127.0.0.1:{server.port}/0")
        if "functions" in lines:
            installer = Cli(f"redis://bloomctl-functions:fn-pw@127.0.0.1:{server.port}/0")
            assert installer("functions", "install").exit_code == 0
            assert installer("functions", "status").exit_code == 0
        csv = tmp_path / "users.csv"
        csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(3000)))
        for args in (
            ["info", "users", "--format", "json"],
            ["info", "users", "--exact", "--format", "json"],
            ["fill-ratio", "users"],  # (a pattern is first tried as a key: EXISTS 'use*' needs ~use* too)
            ["rebuild", "users", "--from-csv", str(csv), "--swap"],
            ["rollback", "users", "--yes"],
            ["swap", "users", "--yes"],
            ["rebuild", "users", "--from-csv", str(csv), "--swap", "--build", "server"],
            *([["functions", "status"]] if "bitmap" in backends else []),
            ["dump", "users", "-o", str(tmp_path / "users.bfdump")],
            ["restore", "users", "-i", str(tmp_path / "users.bfdump"), "--swap", "--allow-shrink"],
            ["copy", "users", "--to", f"redis://bloomctl-operator:op-pw@127.0.0.1:{server.port}/0", "--swap"],
        ):
            result = op(*args)
            assert result.exit_code == 0, (args, result.stdout, result.stderr)
        assert admin.exists("{users}:old")
        outside = op("reserve", "orders", "-c", "1000", "-e", "1%")
        assert outside.exit_code == 3 and "no permissions" in outside.stderr.lower()
        code, mine = doctor_json(op, "users")
        assert mine["acl"]["user"] == "bloomctl-operator"
        refused = [g for g in mine["acl"]["groups"] if g["needed"] and not g["allowed"]]
        assert [g["command"] for g in refused] in ([], ["functions"]), refused  # FUNCTION LOAD is not the operator's
        assert levels(mine, "persistence") == ["warning"]  # CONFIG GET is not the operator's: said, not fatal
        assert code == 0

        app_client = connect(settings_from(f"redis://bloomctl-app:app-pw@127.0.0.1:{server.port}/0"))
        users = open_filter(app_client, "users")
        assert users.madd(["new:1", "user:1"], dual_write=True) == [True, False]
        assert users.mexists(["new:1", "user:2", "nobody"]) == [True, True, False]
        with pytest.raises(redis.exceptions.NoPermissionError):
            app_client.execute_command("GET", "{users}:old")  # a read: harmless where a line lets it through
        for command in (("DEL", "users"), ("FLUSHALL",), ("SET", "users", "x"), ("UNLINK", "{users}:old")):
            assert admin.execute_command("ACL", "DRYRUN", "bloomctl-app", *command) != b"OK", command
        if data["server"]["backends"]["redisbloom"]:
            assert app_client.execute_command("BF.EXISTS", "users", "new:1") == 1
            assert (
                admin.execute_command("ACL", "DRYRUN", "bloomctl-app", "BF.RESERVE", "users2", "0.01", "100") != b"OK"
            )
        else:
            assert app_client.execute_command("FCALL_RO", "bloomctl_exists", 1, "users", "new:1") == 1
            reserve_call = ("FCALL", "bloomctl_reserve", 1, "users", 64, 1, 1, "0.01")
            assert admin.execute_command("ACL", "DRYRUN", "bloomctl-app", *reserve_call) != b"OK"
        app_client.close()
    finally:
        admin.execute_command("ACL", "DELUSER", "bloomctl-operator", "bloomctl-app", "bloomctl-functions")


def test_secrets_are_never_printed(plain):
    with acl_user(plain.client(), "ops", "~*", "&*", "+@all") as url:
        cli = Cli(url)
        reserve(cli)
        for fmt in ("text", "json"):
            result = cli("doctor", "users", "--format", fmt)
            assert result.exit_code == 0, result.stderr
            for secret in (PASSWORD, PASSWORD.replace("/", "%2F")):
                assert secret not in result.stdout and secret not in result.stderr
            assert "redis://ops:***@127.0.0.1" in result.stdout
        wrong = cli("doctor", url=url.replace("s3cr3t", "wrong"))
        assert wrong.exit_code == 3 and "wrong" not in wrong.stderr + wrong.stdout


# --- the command table ----------------------------------------------------------------------

NOT_CHECKED = {"hello", "auth", "client|setinfo"}  # the connection's handshake: never subject to ACL rules


def _monitor(server: RedisServer, runs: list[tuple[str, list[str]]]) -> dict[str, set[str]]:
    """The ACL names MONITOR saw for each run, commands inside scripts and functions included."""
    seen: list[str] = []
    ready = threading.Event()

    def listen() -> None:
        with server.client().monitor() as monitor:
            ready.set()
            for entry in monitor.listen():
                seen.append(entry["command"])
                if entry["command"] == "ECHO doctor:stop":
                    return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.1)
    marker, cli = server.client(), Cli(server.url)
    for index, (_group, args) in enumerate(runs):
        marker.echo(f"doctor:{index}")
        result = cli(*args)
        assert result.exit_code in (0, 5), (args, result.stderr)
    marker.echo("doctor:stop")
    thread.join(10)
    found: dict[str, set[str]] = defaultdict(set)
    group = None
    for command in seen:
        if command.startswith("ECHO doctor:"):
            tail = command.split(":", 1)[1]
            group = runs[int(tail)][0] if tail.isdigit() else None
        elif group is not None:
            found[group].add(acl_name(command.replace('"', "")))
    return found


@pytest.mark.parametrize("server_fixture", ["plain", pytest.param("bloom", marks=pytest.mark.redisbloom)])
def test_the_table_lists_every_command_bloomctl_sends(request, tmp_path, server_fixture):
    server = request.getfixturevalue(server_fixture)
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"u{i}\n" for i in range(2000)))
    rebuild = ["rebuild", "users", "--from-csv", str(csv)]
    config = tmp_path / "bloomctl.toml"
    config.write_text(
        '[filters.app]\ncapacity = 5000\nerror_rate = "1%"\nsource.csv = "u.csv"\nthresholds.max_fpr = "1%"\n'
        '[filters.fed]\ntype = "cuckoo"\ncapacity = 1000\n[filters.days]\ntype = "windowed"\ncapacity = 100\n'
        'error_rate = "1%"\nwindow.period = "1d"\nwindow.keep = 2\n[filters.big]\ncapacity = 2000\n'
        'error_rate = "1%"\nshards = 2\n'
    )
    runs = [
        ("functions", ["functions", "install"]),
        ("reserve", ["reserve", "users", "-c", "10000", "-e", "1%", "--nonscaling"]),
        ("reserve", ["reserve", "orders", "-c", "10000", "-e", "1%", "--nonscaling", "--shards", "2"]),
        ("info", ["info", "users", "--exact"]),
        ("info", ["info", "orders"]),
        ("fill-ratio", ["fill-ratio", "users", "ord*", "nothing"]),
        ("rebuild", [*rebuild, "--build", "client"]),
        ("swap", ["swap", "users", "--yes"]),
        ("rollback", ["rollback", "users", "--yes"]),
        ("rebuild", [*rebuild, "--swap", "--build", "server", "--keep-old", "60"]),
        ("rebuild", [*rebuild, "--swap", "--build", "client"]),
        ("rebuild", ["rebuild", "orders", "--from-csv", str(csv), "--swap"]),
        ("functions", ["functions", "status"]),
        ("dump", ["dump", "users", "-o", str(tmp_path / "users.bfdump")]),
        ("dump", ["dump", "orders", "-o", str(tmp_path / "orders.bfdump")]),
        ("restore", ["restore", "users", "-i", str(tmp_path / "users.bfdump"), "--swap", "--allow-shrink"]),
        ("restore", ["restore", "orders2", "-i", str(tmp_path / "orders.bfdump"), "--swap"]),
        ("copy", ["copy", "users", "--to", server.url, "--to-key", "users3", "--swap"]),
        # cuckoo filters (CF.* with the module, else the module-free one) and windows of either type
        ("reserve", ["reserve", "cf", "--type", "cuckoo", "-c", "10000"]),
        ("info", ["info", "cf", "--exact"]),
        ("fill-ratio", ["fill-ratio", "cf"]),
        ("rebuild", ["rebuild", "cf", "--from-csv", str(csv), "--swap"]),
        ("rollback", ["rollback", "cf", "--yes"]),
        ("swap", ["swap", "cf", "--yes", "--allow-shrink"]),
        ("dump", ["dump", "cf", "-o", str(tmp_path / "cf.bfdump")]),
        ("restore", ["restore", "cf2", "-i", str(tmp_path / "cf.bfdump"), "--swap"]),
        ("window", ["window", "create", "w", "--period", "1h", "--keep", "3", "-c", "1000", "-e", "1%"]),
        ("window", ["window", "create", "wc", "--period", "1d", "--keep", "2", "-c", "1000", "--type", "cuckoo"]),
        ("window", ["window", "rotate", "w", "wc"]),
        ("window", ["window", "info", "w"]),
        # the declared filters of a config file: created, then checked
        ("apply", ["--config", str(config), "apply"]),
        ("check", ["--config", str(config), "check"]),
    ]
    found = _monitor(server, runs)
    assert {"rename", "fcall" if "fcall" in found["reserve"] else "bf.reserve"} <= found["rebuild"] | found["reserve"]
    assert "rename" in found["swap"] and "rename" in found["rollback"]  # scripts' own commands are seen
    for group, names in found.items():
        unlisted = sorted(names - NOT_CHECKED - {acl_name(call) for call in COMMANDS[group]})
        assert unlisted == [], f"bloomctl {group} sends {unlisted}: add them to COMMANDS in bloomctl/doctor/commands.py"


def test_every_command_of_the_command_line_has_a_row():
    assert set(main.commands) - {"doctor"} <= set(COMMANDS)


def test_every_command_in_the_source_is_in_the_table():
    """What MONITOR never shows (admin commands such as MODULE LIST) is read from the source: every
    literal command bloomctl sends, in Python or in Lua, is a row of some command's table."""
    listed = {acl_name(call) for rows in (*COMMANDS.values(), DOCTOR, DOCTOR_CLUSTER, APPLICATION) for call in rows}
    listed |= {"config|get", "acl|dryrun"}  # doctor's own reads, never in an operator's line
    pattern = re.compile(r"""(?:redis\.p?call\(|execute_command\()\s*['"]([A-Za-z_.]+(?: [A-Za-z_]+)?)['"]""")
    sources = [*sorted((ROOT / "bloomctl").rglob("*.py")), *sorted((ROOT / "bloomctl").rglob("*.lua"))]
    sent = {acl_name(m) for path in sources for m in pattern.findall(path.read_text(encoding="utf-8"))}
    assert sent, "the pattern found nothing: is it still right?"
    assert {"rename", "module|list", "bf.loadchunk", "bitfield"} <= sent
    assert sorted(sent - listed) == []


def test_the_docs_show_the_table():
    assert command_table_markdown() in (ROOT / "docs" / "doctor.md").read_text(encoding="utf-8")


COMPANIONS = [
    b"{users}:standby",
    b"{users}:old",
    b"{users}:lock",
    b"{users}:meta",
    b"{users}:standby:meta",
    b"{users}:old:meta",
    b"{users}:standby:log",
    b"{users}:restore",
    b"{users}:restore:meta",
    b"{users}:build",
    b"{users}:build:*",  # a build's own key, build:<generation>, and the bitmap merge's build:or
    b"{users}:probe:*",  # the compatibility probe: probe:<random id>
]
DAY_BUCKETS = b"{users}:[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]"


def test_key_patterns_name_each_companion_and_escape_glob_characters():
    """Each companion by its name, never `{users}:*` (other keys of the hash tag are someone
    else's); a window's settings and its buckets by their labels, the other name of its buckets
    read only; a name that is nothing yet gets both."""
    from bloomctl.doctor.access import Target, operator_keys

    assert operator_keys([Target(b"users", "bitmap")]) == ([b"users", *COMPANIONS], [])
    assert operator_keys([Target(b"users", "bitmap", period=86400)]) == ([b"users", DAY_BUCKETS], [b"{users}"])
    assert operator_keys([Target(b"users", "bitmap", period=3600)])[0] == [b"users", DAY_BUCKETS + b"T[0-9][0-9]"]
    new = operator_keys([Target(b"users")])
    assert new == ([b"users", *COMPANIONS, DAY_BUCKETS, DAY_BUCKETS + b"T[0-9][0-9]"], [b"{users}"])
    sharded = Target(b"orders", "bitmap", (b"{0}:orders:shard:0",))  # members by their manifest's names
    keys, _read = operator_keys([sharded])
    assert keys[:2] == [b"orders", b"{orders}:standby"] and b"{0}:orders:shard:0:standby" in keys
    assert [k for k in keys if k.endswith(b":*") and not k.endswith((b":build:*", b":probe:*"))] == []
    assert operator_keys([Target(b"bf:{u}", "bitmap")])[0][:2] == [b"bf:{u}", b"bf:{u}:standby"]
    assert operator_keys([Target(b"a*b", "bitmap")])[0][0] == rb"a\*b"
    assert operator_keys([Target(b"{users}")])[1] == [b"users"]  # the window `users` would share its buckets
    family = KeyFamily.of("users")
    assert {name for role, name in family.all_keys().items() if role != "active"} <= set(COMPANIONS)


def test_a_window_is_found_and_reported_as_one(plain, cli_plain):
    """A window's settings hash is a window, not "a hash": given as KEY, or found by the SCAN,
    which reports its buckets through it; it is not sized as a filter a rebuild copies."""
    result = cli_plain("window", "create", "dedupe", "--period", "1d", "--keep", "3", "-c", "1000", "-e", "1%")
    assert result.exit_code == 0, result.stderr
    for keys in (["dedupe"], []):
        code, data = doctor_json(cli_plain, *keys)
        assert code == 0 and [(f["key"], f["window"]) for f in data["filters"]] == [("dedupe", True)], data["filters"]
        assert levels(data, "memory") == ["info"]  # no filter to size a rebuild against
    found = [f["message"] for f in data["findings"] if f["check"] == "keys"]
    assert len(found) == 1 and found[0].startswith("found 1 filter(s) in "), found  # not its 3 buckets
    _code, data = doctor_json(cli_plain, "dedupe")
    message = next(f["message"] for f in data["findings"] if f["check"] == "keys")
    assert message.startswith("'dedupe': a window of 3 ") and "a bucket every 1d, 3 kept" in message, message


def test_a_key_that_is_not_utf8_gets_lines_redis_cli_reads(plain):
    """A key name is bytes: the line writes what is not UTF-8 as \\xHH in double quotes, and
    redis-cli, given the line, grants that key (and not the text `\\xff`)."""
    import subprocess

    from bloomctl.doctor.report import diagnose
    from bloomctl.server.connection import connect, settings_from

    admin, key = plain.client(), b"caf\xffe"
    report = diagnose(connect(settings_from(plain.url)), [key])
    lines, notes = report.acl["setuser"], report.acl["notes"]
    assert '"~caf\\xffe"' in lines["operator"].split(), lines["operator"]
    assert any("not UTF-8" in note and "redis-cli" in note for note in notes["operator"]), notes
    try:
        for line in (lines["operator"], lines["application"]):
            done = subprocess.run(
                ["redis-cli", "-p", str(plain.port)], input=line.encode() + b"\n", capture_output=True, check=True
            )
            assert done.stdout.strip() == b"OK", done.stdout + done.stderr
        for user in ("bloomctl-operator", "bloomctl-app"):
            assert admin.execute_command("ACL", "DRYRUN", user, "TYPE", key) == b"OK"
            assert admin.execute_command("ACL", "DRYRUN", user, "TYPE", b"caf\\xffe") != b"OK"
    finally:
        admin.execute_command("ACL", "DELUSER", "bloomctl-operator", "bloomctl-app")


def test_a_user_who_may_run_almost_nothing_gets_a_report(plain, cli_plain):
    """No INFO, no COMMAND, no MULTI, no ACL DRYRUN: every check says what it could not read."""
    reserve(cli_plain)
    with acl_user(plain.client(), "nobody", "~*", "+get", "+ping") as url:
        result = Cli(url)("doctor", "users")
        code, data = doctor_json(Cli(url), "users")
    assert result.exit_code == code == 0, result.stdout + result.stderr
    assert "could not check what nobody may run" in result.stdout
    # (BF.INFO on a server without it is an unknown command, before any ACL rule; where it exists, NOPERM)
    assert "not allowed to read which BF.* commands exist" in result.stdout or "no BF.* commands" in result.stdout
    assert data["acl"]["method"] is None and all(g["allowed"] is None for g in data["acl"]["groups"])
    assert "ERROR" not in result.stdout and data["summary"]["warnings"] >= 5


def test_the_queued_access_check_never_runs_a_command(plain, cli_plain):
    """Without ACL DRYRUN, doctor queues each command in a MULTI it discards. EXEC (restore sends
    MULTI/EXEC) queued there would run everything before it: the keyspace must be untouched."""
    admin = plain.client()
    reserve(cli_plain)
    _, data = doctor_json(cli_plain, "users")
    _setuser(admin, data["acl"]["setuser"]["operator"], "op-pw")
    try:
        before = {key: admin.dump(key) for key in admin.keys("*")}
        op = Cli(f"redis://bloomctl-operator:op-pw@127.0.0.1:{plain.port}/0")
        _code, report = doctor_json(op, "users")
        assert report["acl"]["method"] == "queued"
        assert {key: admin.dump(key) for key in admin.keys("*")} == before
    finally:
        admin.execute_command("ACL", "DELUSER", "bloomctl-operator")


def test_doctor_never_loads_the_function_library(plain, cli_plain):
    """Sizing a bitmap filter goes through the function library; doctor must not load it (FUNCTION
    LOAD is a write, replicated and persisted), and must report it missing as it found it."""
    reserve(cli_plain)  # a bitmap filter: the library is loaded now
    admin = plain.client()
    admin.execute_command("FUNCTION", "FLUSH")
    _code, data = doctor_json(cli_plain, "users")
    assert admin.execute_command("FUNCTION", "LIST") == []
    assert [f["level"] for f in data["findings"] if f["check"] == "functions"] == ["info"]
    _code, data = doctor_json(cli_plain)  # no KEY: the scan sizes what it finds the same way
    assert admin.execute_command("FUNCTION", "LIST") == [] and "'users'" in json.dumps(data["findings"])


def test_a_user_denied_discard_gets_the_truth_and_a_clean_connection(plain, cli_plain):
    """Without DISCARD the checking MULTI cannot be ended: the connection is closed, never reused,
    and what the user may not run is still reported."""
    from bloomctl.doctor.report import diagnose
    from bloomctl.server.connection import connect, settings_from

    reserve(cli_plain)
    admin = plain.client()
    admin.execute_command(
        "ACL", "SETUSER", "nodiscard", "on", ">pw", "~*", "&*", "+@all", "-acl|dryrun", "-discard", "-hset"
    )
    try:
        url = f"redis://nodiscard:pw@127.0.0.1:{plain.port}/0"
        _code, data = doctor_json(Cli(url), "users")
        reserve_group = next(g for g in data["acl"]["groups"] if g["command"] == "reserve")
        assert not reserve_group["allowed"] and "hset" in json.dumps(reserve_group["denied"]).lower(), reserve_group
        client = connect(settings_from(url))
        diagnose(client, ["users"])
        client.set("after", "1")
        assert client.get("after") == b"1"  # not b'QUEUED': no connection came back inside a MULTI
    finally:
        admin.execute_command("ACL", "DELUSER", "nodiscard")


@pytest.mark.cluster
def test_an_unhealthy_cluster_is_reported_not_crashed_on(workdir, cli):
    """Slots not covered, then a master down: doctor says so (exit 1), with the other checks."""
    from tests.servers import RedisCluster

    cluster = RedisCluster(workdir, masters=3)
    try:
        for node in cluster.nodes:
            node.client().execute_command("CLUSTER", "DELSLOTS", 100)
        code, data = doctor_json(cli, url=cluster.url)
        assert code == 1 and any("not covered" in f["message"] for f in data["findings"] if f["level"] == "error")
        cluster.nodes[2].stop()
        code, data = doctor_json(cli, url=cluster.url)
        assert "findings" in data, data
        errors = [f["message"] for f in data["findings"] if f["level"] == "error"]
        assert code == 1 and any("answer" in m for m in errors), errors
    finally:
        cluster.stop()


def test_the_printed_operator_is_told_to_name_its_filters(plain, cli_plain):
    """The operator's line has no SCAN (it lists every key name of the database): doctor without KEY
    says so and how to go on; with KEY it checks the filter."""
    reserve(cli_plain)
    admin = plain.client()
    _, data = doctor_json(cli_plain, "users")
    _setuser(admin, data["acl"]["setuser"]["operator"], "op-pw")  # its patterns: users only
    try:
        op = Cli(f"redis://bloomctl-operator:op-pw@127.0.0.1:{plain.port}/0")
        _code, mine = doctor_json(op)
        keys = [f for f in mine["findings"] if f["check"] == "keys"]
        assert [f["level"] for f in keys] == ["warning"] and "SCAN" in keys[0]["message"], keys
        assert "bloomctl doctor KEY" in keys[0]["fix"]
        _code, mine = doctor_json(op, "users")
        assert [f["level"] for f in mine["findings"] if f["check"] == "keys"] == ["ok"]
    finally:
        admin.execute_command("ACL", "DELUSER", "bloomctl-operator")


def test_a_key_with_a_space_gets_an_acl_line_redis_takes(plain, cli_plain):
    """No ACL rule may hold whitespace: a key with a space becomes a pattern with `?` there, which
    Redis accepts and which matches the key."""
    reserve(cli_plain, "my users")
    _, data = doctor_json(cli_plain, "my users")
    admin = plain.client()
    _setuser(admin, data["acl"]["setuser"]["operator"], "op-pw")
    try:
        op = Cli(f"redis://bloomctl-operator:op-pw@127.0.0.1:{plain.port}/0")
        assert op("info", "my users", "--format", "json").exit_code == 0
    finally:
        admin.execute_command("ACL", "DELUSER", "bloomctl-operator")
