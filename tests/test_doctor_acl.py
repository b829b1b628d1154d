"""(#23 item 3) The `ACL SETUSER` lines `bloomctl doctor` prints, created on real servers and used:
each user runs every documented operation of its role on every backend, and is refused what its
role must not do.

- operator: the CLI's reserve, info, fill-ratio, rebuild (client and server build), swap, rollback,
  dump, restore, copy and doctor on its filter, and window create, rotate and info (apply too) on its
  window; no FLUSHALL, CONFIG SET, KEYS, SCAN, bare INFO, other filters' keys, other keys of its own
  hash tag (`{KEY}:session:42`), a foreign `{x}:KEY:shard:...` key, another library's functions, or
  FUNCTION LOAD over another library.
- application: `open_filter`, add/madd/exists/mexists, `WindowedFilter`'s adds and lookups, a
  cuckoo filter's deletes and counts, dual writes into a rebuild's standby (a cuckoo filter's three ways: direct, logged, and one that fails
  on the standby); no FLUSHALL, CONFIG SET, KEYS, SCAN, another filter's keys, and no DEL, RENAME,
  PEXPIRE or SET of its own filter. On RedisBloom, where nothing needs them, no SETRANGE or BITFIELD.
- functions admin: `bloomctl functions install` and nothing on any key.

On the module-free backends the application's line holds the plain commands bloomctl's functions
send (Redis checks them against the caller's ACL): the test checks that doctor says so.

A refusal that would change the shared server if a line let it through (FLUSHALL, CONFIG SET, a
write) is checked with ACL DRYRUN, which runs nothing; reads are sent for real, at least one per role.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fixtures.redis import Cli

pytestmark = pytest.mark.matrix

KEY = "carts"
WINDOW = "dedupe"
DECLARED_WINDOW = "recent"  # a window the operator makes with `apply`
OPTIONS = {  # how each backend's filter is reserved
    "bitmap": ("-c", "20000", "-e", "1%", "--nonscaling"),
    "lua-cuckoo": ("--type", "cuckoo", "-c", "20000"),
    "redisbloom": ("-c", "20000", "-e", "1%", "--nonscaling"),
    "redisbloom-cuckoo": ("--type", "cuckoo", "-c", "20000"),
}
BACKENDS = [
    pytest.param(("bitmap", "plain"), id="bitmap"),
    pytest.param(("lua-cuckoo", "plain"), id="lua-cuckoo"),
    pytest.param(("redisbloom", "bloom"), id="redisbloom", marks=pytest.mark.redisbloom),
    pytest.param(("redisbloom-cuckoo", "bloom"), id="redisbloom-cuckoo", marks=pytest.mark.redisbloom),
]
# Another application's library: the operator must not be able to replace it.
OTHER_LIBRARY = "#!lua name=otherapp\nredis.register_function('otherapp_ping', function() return 'pong' end)\n"


# --- helpers ---------------------------------------------------------------------------------------


def doctor(cli: Cli, *keys: str) -> dict:
    result = cli("doctor", *keys, "--format", "json")
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def user_of(line: str) -> str:
    return shlex.split(line)[2]


@contextlib.contextmanager
def users(admins: list[redis.Redis], lines: dict[str, str]) -> Iterator[dict[str, str]]:
    """Each printed line run on every node (ACL users are each node's own), the password put in:
    the role's name and ``-pw``. Yields the user name of each role; deletes them after."""
    names = {role: user_of(line) for role, line in lines.items()}
    try:
        for admin in admins:
            for role, line in lines.items():
                assert ">CHANGE_ME" in line and "+@all" not in line
                words = shlex.split(line.replace(">CHANGE_ME", f">{role}-pw"))
                assert admin.execute_command(*words) in (b"OK", "OK"), line
        yield names
    finally:
        for admin in admins:
            admin.execute_command("ACL", "DELUSER", *names.values())


def url_of(port: int, names: dict[str, str], role: str) -> str:
    return f"redis://{names[role]}:{role}-pw@127.0.0.1:{port}/0"


def assert_refused(client, commands) -> None:
    """Reads the ACL must refuse, each sent for real (only what does no harm if it gets through)."""
    allowed = not_refused(client, commands)
    assert allowed == [], f"allowed, and should not be: {allowed}"


def not_refused(client, commands) -> list[tuple]:
    """Those of ``commands`` the ACL lets through, sent for real: the list names them all rather
    than stopping at the first."""
    allowed = []
    for command in commands:
        try:
            client.execute_command(*command)
        except redis.exceptions.NoPermissionError:
            continue
        except redis.exceptions.ResponseError:
            pass  # allowed, then refused by the command itself (a wrong type, a missing key)
        allowed.append(command)
    return allowed


def assert_dry_refused(admin: redis.Redis, user: str, commands) -> None:
    """Commands that would change the server, checked with ACL DRYRUN (Redis 7+): nothing runs,
    even where a line lets one through."""
    allowed = [
        command for command in commands if admin.execute_command("ACL", "DRYRUN", user, *command) in (b"OK", "OK")
    ]
    assert allowed == [], f"{user} may run these, and should not: {allowed}"


def run_ok(cli: Cli, *args: str) -> None:
    result = cli(*args)
    assert result.exit_code == 0, (args, result.stdout, result.stderr)


def source_csv(tmp_path: Path, count: int = 3000) -> Path:
    csv = tmp_path / "items.csv"
    csv.write_text("id\n" + "".join(f"item:{i}\n" for i in range(count)))
    return csv


def prepare_others(admin: redis.Redis, cli: Cli, backend: str, functions: bool) -> None:
    """What belongs to others: a filter of its own, a plain key, and (with Functions) a library."""
    run_ok(cli, "reserve", "other", *OPTIONS[backend])
    admin.set("unrelated", "x")
    if functions:
        admin.execute_command("FUNCTION", "LOAD", "REPLACE", OTHER_LIBRARY)


def has_functions(admin: redis.Redis) -> bool:
    try:
        admin.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "none")
    except redis.exceptions.ResponseError:
        return False
    return True


# --- a server with the printed users ----------------------------------------------------------------


@dataclass
class Scene:
    """A server with the filter KEY (created by the printed operator), others' keys and library, and
    the users of the lines doctor printed once KEY existed."""

    server: Any
    backend: str
    data: dict
    names: dict[str, str]
    functions: bool  # the server has Redis Functions

    @property
    def admin(self) -> redis.Redis:
        return self.server.client()

    def url(self, role: str) -> str:
        return url_of(self.server.port, self.names, role)

    def cli(self, role: str) -> Cli:
        return Cli(self.url(role))

    def client(self, role: str) -> redis.Redis:
        return redis.Redis(port=self.server.port, username=self.names[role], password=f"{role}-pw")

    def refuses(self, role: str, reads, writes) -> None:
        """``reads`` sent for real as the role's user, ``writes`` checked with ACL DRYRUN: all refused."""
        client = self.client(role)
        try:
            assert_refused(client, reads)
        finally:
            client.close()
        assert_dry_refused(self.admin, self.names[role], writes)


@pytest.fixture(params=BACKENDS)
def scene(request) -> Iterator[Scene]:
    backend, fixture = request.param
    server = request.getfixturevalue(fixture)
    admin, admin_cli = server.client(), Cli(server.url)
    functions = has_functions(admin)
    prepare_others(admin, admin_cli, backend, functions)
    # Before the filter exists: the operator creates it (the library installed first by its admin).
    before = doctor(admin_cli, KEY)
    with users([admin], before["acl"]["setuser"]) as names:
        installer = Cli(url_of(server.port, names, "functions")) if "functions" in names else admin_cli
        run_ok(installer, "functions", "install")
        run_ok(Cli(url_of(server.port, names, "operator")), "reserve", KEY, *OPTIONS[backend])
    data = doctor(admin_cli, KEY)
    with users([admin], data["acl"]["setuser"]) as names:
        yield Scene(server, backend, data, names, functions)


# --- the lines themselves --------------------------------------------------------------------------


def test_the_lines_grant_no_role_more_than_it_needs(scene):
    """No @all; for the operator no SCAN, bare INFO or FUNCTION LOAD, and no key pattern that reaches
    another hash tag; for the application no plain write of a filter's bytes on RedisBloom, and on the
    module-free backends the writes its functions need, said under the line."""
    lines, notes = scene.data["acl"]["setuser"], scene.data["acl"].get("notes", {})
    operator, app = lines["operator"].split(), lines["application"]
    assert "+scan" not in operator and "+info" not in operator and "+function|load" not in operator
    assert "+info|memory" in operator and "+info|server" in operator
    assert [word for word in operator if word.startswith("~") and "{*}" in word] == []
    assert [word for word in operator if word.startswith("~") and word.endswith(f"{{{KEY}}}:*")] == []
    assert "+fcall" not in operator and "+fcall_ro" not in operator  # bloomctl's functions by name
    if any(word.startswith("+fcall") for word in operator):  # as bloomctl calls them: FCALL_RO for reads
        assert {"+fcall|bloomctl_reserve", "+fcall_ro|bloomctl_info"} <= set(operator), operator
        assert "+fcall|bloomctl_info" not in operator
    assert "{*}" not in app and "+scan" not in app.split() and "+info" not in app.split()
    writes = {"bitmap": "+bitfield", "lua-cuckoo": "+setrange"}
    if scene.backend in writes:
        assert writes[scene.backend] in app.split()
        said = [n for n in notes.get("application", []) if writes[scene.backend][1:].upper() in n and "directly" in n]
        assert said, notes
    else:
        assert "+setrange" not in app.split() and "+bitfield" not in app.split()
    if "cuckoo" in scene.backend:  # the dual write's log and marks: each in a selector of its own
        assert f'"(~{{{KEY}}}:standby:log +pexpire +rpush)"' in app, app
        assert any("RPUSH" in note for note in notes.get("application", [])), notes
    if scene.backend != "redisbloom":  # bloomctl's library is in use: installing it is a line of its own
        assert "+function|load" in lines.get("functions", ""), lines
        assert "~" not in lines["functions"]


def test_the_info_note_says_what_the_sections_still_show(scene):
    """Redis checks only the first section name of INFO: the note says that a named section first
    shows the keyspace section too (key counts, never key names), and it does."""
    note = next(n for n in scene.data["acl"]["notes"]["operator"] if n.startswith("INFO"))
    assert "first section" in note and "keyspace" in note and "never its keyspace" not in note, note
    client = scene.client("operator")
    assert "db0" in client.info("server", "keyspace")  # what the note says it allows
    client.close()


def test_the_text_output_says_what_the_application_may_write_directly(plain, cli_plain):
    run_ok(cli_plain, "reserve", KEY, *OPTIONS["lua-cuckoo"])
    text = cli_plain("doctor", KEY).stdout
    assert "note: Redis runs a function's commands with the caller's rights" in text, text
    assert "the application may run them directly too" in text
    assert "functions admin (`bloomctl functions install`" in text
    assert "FUNCTION LOAD REPLACE replaces any library of the server" in text


# --- the operator ----------------------------------------------------------------------------------


def test_the_operator_runs_every_command_on_its_filter(scene, tmp_path):
    """Every documented operator command (docs/commands.md) on its filter; doctor as the operator
    finds every command allowed but `functions install`."""
    op, csv, dump = scene.cli("operator"), source_csv(tmp_path), tmp_path / "carts.bfdump"
    cuckoo = "cuckoo" in scene.backend
    config = tmp_path / "bloomctl.toml"  # the filter declared as it was reserved
    declared = (
        'type = "cuckoo"\ncapacity = 20000\n' if cuckoo else 'capacity = 20000\nerror_rate = "1%"\nnonscaling = true\n'
    )
    config.write_text(f"[filters.{KEY}]\n{declared}")
    steps = [
        ["--config", str(config), "check"],
        ["--config", str(config), "apply"],
        ["info", KEY, "--format", "json"],
        ["info", KEY, "--exact", "--format", "json"],
        ["fill-ratio", KEY],
        ["rebuild", KEY, "--from-csv", str(csv), "--swap"],
        ["rollback", KEY, "--yes"],
        ["swap", KEY, "--yes", *(["--allow-shrink"] if cuckoo else [])],
        *([] if cuckoo else [["rebuild", KEY, "--from-csv", str(csv), "--swap", "--build", "server"]]),
        ["dump", KEY, "-o", str(dump)],
        ["restore", KEY, "-i", str(dump), "--swap", "--allow-shrink"],
        ["copy", KEY, "--to", scene.url("operator"), "--swap"],  # onto a filter of the line: itself
    ]
    failed = [(args[0], result.stderr) for args in steps if (result := op(*args)).exit_code != 0]
    assert failed == []
    mine = doctor(op, KEY)
    denied = {g["command"]: g["denied"] for g in mine["acl"]["groups"] if g["needed"] and not g["allowed"]}
    assert set(denied) <= {"functions"}, denied
    assert all(d["command"] == "function|load" for d in denied.get("functions", [])), denied


def test_the_operator_is_refused_everything_else(scene):
    reads = [
        ("KEYS", "*"),
        ("SCAN", "0"),  # it lists every key name of the database
        ("INFO",),
        ("INFO", "keyspace"),
        ("GET", "unrelated"),
        ("TYPE", "other"),
        ("GET", f"{{{KEY}}}:session:42"),  # another application's key in the filter's own hash tag
        ("TYPE", f"{{{KEY}}}:x"),
    ]
    writes = [
        ("FLUSHALL",),
        ("CONFIG", "SET", "maxmemory", "0"),
        ("SET", f"{{x}}:{KEY}:shard:evil", "1"),  # a member's name under another hash tag
        ("SET", "{other}:standby", "1"),
        ("UNLINK", "other"),
        ("UNLINK", f"{{{KEY}}}:x"),
        ("SET", f"{{{KEY}}}:session:42", "1"),
        ("UNLINK", f"{{{KEY}}}:eu"),  # another filter of the hash tag
    ]
    if scene.functions:  # another application's library: neither replaced nor run
        reads += [("FCALL", "otherapp_ping", 0)]
        writes += [("FUNCTION", "LOAD", "REPLACE", OTHER_LIBRARY), ("FUNCTION", "DELETE", "otherapp")]
    scene.refuses("operator", reads, writes)
    outside = scene.cli("operator")("reserve", "orders", "-c", "1000", "-e", "1%")
    assert outside.exit_code == 3 and "no permissions" in outside.stderr.lower(), outside.stderr


def test_the_functions_admin_installs_and_touches_no_key(scene):
    if "functions" not in scene.names:
        pytest.skip("no bloomctl library in use here: no line for it")
    run_ok(scene.cli("functions"), "functions", "status")
    reads = [("GET", KEY), ("TYPE", "other"), ("KEYS", "*"), ("SCAN", "0"), ("FCALL", "otherapp_ping", 0)]
    scene.refuses("functions", reads, [("FLUSHALL",), ("FUNCTION", "FLUSH"), ("FUNCTION", "DELETE", "otherapp")])


# --- the application -------------------------------------------------------------------------------


def test_the_application_adds_looks_up_and_dual_writes(scene):
    """docs/python-api.md's calls through open_filter, the commands any client sends, and the dual
    writes into a rebuild's standby (a cuckoo filter's: applied, logged, and failing on the standby)."""
    from bloomctl import open_filter
    from bloomctl.server.connection import connect, settings_from

    app = connect(settings_from(scene.url("application")))
    carts = open_filter(app, KEY)
    assert carts.madd(["a", "b"]) == [True, True] and carts.add("c")
    assert carts.exists("a") and carts.mexists(["b", "nothing"]) == [True, False]
    direct_commands(app, scene.backend)
    run_ok(Cli(scene.server.url), "reserve", f"{{{KEY}}}:standby", *OPTIONS[scene.backend])  # a rebuild's standby
    standby = open_filter(scene.admin, f"{{{KEY}}}:standby")
    assert carts.madd(["dual:1"], dual_write=True) == [True]
    assert standby.exists("dual:1") and carts.exists("dual:1")
    if "cuckoo" in scene.backend:
        cuckoo_application(carts, standby, scene.admin)
    app.close()


def direct_commands(app, backend: str) -> None:
    """The commands of docs/python-api.md and docs/cuckoo.md from any client, not bloomctl's Filter."""
    if backend == "redisbloom":
        assert app.execute_command("BF.ADD", KEY, "d") == 1 and app.execute_command("BF.EXISTS", KEY, "d") == 1
    elif backend == "redisbloom-cuckoo":
        assert app.execute_command("CF.ADD", KEY, "d") == 1 and app.execute_command("CF.COUNT", KEY, "d") == 1
    elif backend == "bitmap":
        assert app.execute_command("FCALL", "bloomctl_add", 1, KEY, "d") == 1
        assert app.execute_command("FCALL_RO", "bloomctl_exists", 1, KEY, "d") == 1
    else:
        assert app.execute_command("FCALL", "bloomctl_cf_madd", 1, KEY, "d") == [1]
        assert app.execute_command("FCALL_RO", "bloomctl_cf_count", 1, KEY, "d") == 1


def cuckoo_application(carts, standby, admin: redis.Redis) -> None:
    """Deletes and counts; a dual write applied to the standby, one logged while a rebuild loads it
    (its lock held), and one the standby cannot take (recorded in its metadata)."""
    family = f"{{{KEY}}}"
    assert carts.count("a") == 1 and carts.mdelete(["a"]) == [True] and not carts.exists("a")
    assert carts.delete("dual:1", dual_write=True) and not standby.exists("dual:1")
    admin.hset(f"{family}:standby:meta", mapping={"state": "loading", "dual": "log"})
    admin.set(f"{family}:lock", "token", px=30000)
    assert carts.madd(["logged:1"], dual_write=True) == [True]
    assert admin.lrange(f"{family}:standby:log", 0, -1) == [b"+logged:1"]
    admin.hset(f"{family}:standby:meta", mapping={"state": "verified", "dual": "direct"})
    admin.delete(f"{family}:lock", f"{family}:standby")
    admin.set(f"{family}:standby", "not a filter")  # the standby's write fails: the active one takes it
    assert carts.madd(["failed:1"], dual_write=True) == [True]
    assert admin.hget(f"{family}:standby:meta", "dual_error")


def test_the_application_is_refused_everything_else(scene):
    """Nothing of the server's, nothing of others' keys, and its own filter never deleted, renamed,
    expired or overwritten whole (nor written byte by byte on RedisBloom, where nothing needs it)."""
    from bloomctl import open_filter
    from bloomctl.server.connection import connect, settings_from

    app = connect(settings_from(scene.url("application")))
    family = f"{{{KEY}}}"
    reads = [("KEYS", "*"), ("SCAN", "0"), ("INFO",), ("TYPE", "other"), ("GET", f"{family}:old")]
    writes = [
        ("FLUSHALL",),
        ("CONFIG", "SET", "maxmemory", "0"),
        ("SET", f"{{x}}:{KEY}:shard:evil", "1"),
        ("FUNCTION", "LOAD", "REPLACE", OTHER_LIBRARY),
        ("DEL", KEY),
        ("UNLINK", KEY),
        ("RENAME", KEY, "stolen"),
        ("PEXPIRE", KEY, "100000"),  # an expired filter is a deleted one
        ("SET", KEY, "x"),
        ("HSET", KEY, "f", "v"),
        ("RPUSH", KEY, "x"),
        ("DEL", f"{family}:lock"),
        ("PEXPIRE", f"{family}:lock", "100000"),
        ("HSET", f"{family}:meta", "f", "v"),
    ]
    if scene.functions:
        reads += [("FCALL", "otherapp_ping", 0)]
    if scene.backend.startswith("redisbloom"):
        writes += [
            ("SETRANGE", KEY, "0", "x"),
            ("BITFIELD", KEY, "SET", "u8", "0", "1"),
            ("BF.RESERVE", "new", "0.01", "100"),
            ("CF.RESERVE", "new", "100"),
        ]
    else:
        writes += [
            ("FCALL", "bloomctl_reserve", 1, "new", 64, 1, 1, "0.01"),
            ("FCALL", "bloomctl_cf_reserve", 1, "new", 512, 2, 2, 20, 1000, "0.01"),
        ]
    scene.refuses("application", reads, writes)
    with pytest.raises(redis.exceptions.NoPermissionError):
        open_filter(app, "other").exists("a")
    assert scene.admin.exists(KEY) and scene.admin.pttl(KEY) == -1
    app.close()


# --- a time-windowed filter ------------------------------------------------------------------------

WINDOW_OPTIONS = {"bloom": ("-c", "1000", "-e", "1%"), "cuckoo": ("-c", "1000", "--type", "cuckoo")}


@pytest.mark.parametrize("backend_and_server", BACKENDS)
def test_the_printed_users_make_and_use_a_window(request, tmp_path, backend_and_server):
    """The lines printed before a window exists let the operator make it (`window create`, and
    `apply` of a declared one), rotate and describe it, and the application add and look up
    (WindowedFilter); once it exists doctor reports it as a window and its lines, for its settings
    and buckets, do the same and reach no other key of its hash tag."""
    backend, fixture = backend_and_server
    server = request.getfixturevalue(fixture)
    admin, admin_cli = server.client(), Cli(server.url)
    kind = "cuckoo" if "cuckoo" in backend else "bloom"
    config = tmp_path / "bloomctl.toml"
    config.write_text(
        f'[filters.{DECLARED_WINDOW}]\ntype = "windowed"\ncapacity = 1000\nwindow.period = "1h"\nwindow.keep = 3\n'
        + ('window.type = "cuckoo"\n' if kind == "cuckoo" else 'error_rate = "1%"\n')
    )
    before = doctor(admin_cli, WINDOW, DECLARED_WINDOW)
    said = [n for n in before["acl"]["notes"]["operator"] if "nothing there yet" in n]
    assert said and "reserve --shards N" in said[0] and "an admin reserves it" in said[0], said
    with users([admin], before["acl"]["setuser"]) as names:
        installer = Cli(url_of(server.port, names, "functions")) if "functions" in names else admin_cli
        run_ok(installer, "functions", "install")
        op = Cli(url_of(server.port, names, "operator"))
        run_ok(op, "window", "create", WINDOW, "--period", "1d", "--keep", "3", *WINDOW_OPTIONS[kind])
        run_ok(op, "--config", str(config), "apply")
        use_window(server.port, names, "before")
    data = doctor(admin_cli, WINDOW)
    found = [f for f in data["findings"] if f["check"] == "keys"]
    assert [f["level"] for f in found] == ["ok"] and "window" in found[0]["message"], found
    assert [(f["key"], f["backend"], f["window"]) for f in data["filters"]] == [(WINDOW, backend, True)]
    with users([admin], data["acl"]["setuser"]) as names:
        op = Cli(url_of(server.port, names, "operator"))
        run_ok(op, "window", "rotate", WINDOW)
        run_ok(op, "window", "info", WINDOW, "--format", "json")
        mine = doctor(op, WINDOW)  # the operator's own view: every command but `functions install`
        denied = {g["command"] for g in mine["acl"]["groups"] if g["needed"] and not g["allowed"]}
        assert denied <= {"functions"}, mine["acl"]["groups"]
        bucket = use_window(server.port, names, "after")
        tag = f"{{{WINDOW}}}"
        reads = [("GET", f"{tag}:session:42"), ("TYPE", f"{tag}:x"), ("TYPE", KEY)]
        writes = [("UNLINK", f"{tag}:x"), ("SET", f"{tag}:session:42", "1"), ("SET", f"{tag}:2026-01-01:x", "1")]
        for role in ("operator", "application"):
            client = redis.Redis(port=server.port, username=names[role], password=f"{role}-pw")
            assert_refused(client, reads)
            client.close()
            assert_dry_refused(admin, names[role], writes)
        own = [("DEL", WINDOW), ("HSET", WINDOW, "keep", "1000"), ("UNLINK", bucket), ("EXPIREAT", bucket, "1")]
        assert_dry_refused(admin, names["application"], own)


def use_window(port: int, names: dict[str, str], event: str) -> str:
    """WindowedFilter's adds and lookups of new items as the application; the current bucket's name."""
    from bloomctl import WindowedFilter
    from bloomctl.server.connection import connect, settings_from

    app = connect(settings_from(url_of(port, names, "application")))
    seen = WindowedFilter(app, WINDOW)
    assert seen.madd([f"{event}:1", f"{event}:2"]) == [True, True] and not seen.add(f"{event}:1")
    assert seen.mexists([f"{event}:1", f"{event}:3"]) == [True, False] and seen.exists(f"{event}:2")
    bucket, exists = seen.current_bucket()
    assert exists
    app.close()
    return bucket.decode()


# --- a Cluster, with a sharded filter ---------------------------------------------------------------


@pytest.mark.cluster
def test_the_printed_users_on_a_cluster_with_a_sharded_filter(cluster, tmp_path):
    """A sharded filter's members are named by its manifest: the lines name each one (no pattern
    reaching another hash tag), and the operator and the application work on them, on every node."""
    from bloomctl import open_filter
    from bloomctl.server.connection import connect, settings_from

    admin_cli, port = Cli(cluster.url), cluster.nodes[0].port
    run_ok(admin_cli, "reserve", "orders", "-c", "30000", "-e", "1%", "--nonscaling", "--shards", "3")
    run_ok(admin_cli, "reserve", "other", "-c", "3000", "-e", "1%", "--shards", "2")
    data = doctor(admin_cli, "orders", KEY)
    lines, members = data["acl"]["setuser"], sharded_members(cluster, "orders")
    assert "{*}" not in lines["operator"] + lines["application"]
    assert all(f"~{m}" in lines["operator"].split() and f"~{m}" in lines["application"].split() for m in members)
    with users([node.client() for node in cluster.nodes], lines) as names:
        op = Cli(url_of(port, names, "operator"))
        csv, dump = source_csv(tmp_path), tmp_path / "orders.bfdump"
        steps = [
            ["reserve", KEY, *OPTIONS["bitmap"]],
            ["info", "orders", "--format", "json"],
            ["fill-ratio", "orders", KEY],
            ["rebuild", "orders", "--from-csv", str(csv), "--swap"],
            ["rollback", "orders", "--yes"],
            ["swap", "orders", "--yes"],
            ["dump", "orders", "-o", str(dump)],
            ["restore", "orders", "-i", str(dump), "--swap", "--allow-shrink"],
        ]
        failed = [(args[0], result.stderr) for args in steps if (result := op(*args)).exit_code != 0]
        assert failed == []
        app = connect(settings_from(url_of(port, names, "application"), cluster=True))
        orders = open_filter(app, "orders")
        assert orders.madd(["o:1", "o:2"], dual_write=True) == [True, True]
        assert orders.mexists(["o:1", "x"]) == [True, False]
        operator = connect(settings_from(url_of(port, names, "operator"), cluster=True))
        foreign = sharded_members(cluster, "other")
        writes = [("SET", "{x}:orders:shard:evil", "1"), ("SET", "unrelated", "1"), ("UNLINK", "{orders}:session:42")]
        for role, client in (("application", app), ("operator", operator)):
            assert_refused(client, [("TYPE", foreign[0])])
            assert_dry_refused(cluster.nodes[0].client(), names[role], writes)
        app.close()
        operator.close()


def sharded_members(cluster, key: str) -> list[str]:
    manifest = cluster.client().hgetall(key)
    return json.loads(manifest[b"members"])
