"""The filter's lock: the swap script checks its token (taken by another run right before the
script), a run that lost it stops writing at once, release and renewal leave another run's lock
alone, --lock-wait waits for the holder, rollback takes it; and a user who may not run the
lock's scripts, or FUNCTION, is told before anything is written."""

from __future__ import annotations

import json
import math
import os
import signal
import time

import pytest

from bloomctl.errors import UsageError
from bloomctl.keys import KeyFamily
from bloomctl.lifecycle import front as lifecycle
from bloomctl.lifecycle.manifest import read_manifest
from bloomctl.server.capabilities import detect
from tests.helpers.matrix import GUARDS, SIGNALS_LOCKS_ERRORS
from tests.helpers.processes import start_rebuild
from tests.helpers.redis import active_and_standby, backend_choice
from tests.servers import RedisServer

THIEF = json.dumps({"token": "thief-token", "command": "another bloomctl run", "pid": 1, "host": "elsewhere"})


def steal_the_lock_before_the_script(monkeypatch, target) -> list[KeyFamily]:
    """From the first swap on, right before the swap script is sent (after every check bloomctl
    makes in Python), another run takes the lock that the script checks: the filter's own, or a
    member's for a sharded filter. Returns the families whose lock was taken."""
    from bloomctl.lifecycle import single

    real, stolen = single.atomic_swap, []

    def take_then_swap(client, family, **kwargs):
        if not stolen:
            target.client.set(family.lock, THIEF, px=60_000)
            stolen.append(family)
        return real(client, family, **kwargs)

    monkeypatch.setattr(single, "atomic_swap", take_then_swap)
    return stolen


# --- the swap script checks the lock's token --------------------------------------------------


@GUARDS
@pytest.mark.parametrize("command", ["swap", "rebuild"])
def test_a_lock_taken_right_before_the_script_stops_the_swap(target, tmp_path, monkeypatch, command):
    """(#10 item 19) The swap script's own check of the lock's token could be disabled unnoticed:
    bloomctl's Python checks run first, so the script's was never exercised. Here the lock is taken
    after them: the script refuses (exit 5, "lost the lock"), the active filter is as it was, the
    standby still there, and the other run's lock is left in place (no unconditional DEL)."""
    family = KeyFamily.of("users")
    target.reserve("users", 10_000)
    target.add("users", [f"user:{i}" for i in range(100)])
    if command == "swap":
        target.reserve(family.standby, 10_000)
        target.add(family.standby, [f"user:{i}" for i in range(200)])
        args = ["swap", "users", "--yes"]
    else:
        csv = tmp_path / "u.csv"
        csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(200)))
        args = ["rebuild", "users", "--from-csv", str(csv), "-c", "10000", "-e", "1%", "--swap"]
    before = target.client.dump("users")
    stolen = steal_the_lock_before_the_script(monkeypatch, target)
    result = target.cli(*args)
    assert result.exit_code == 5 and "lost the lock" in result.stderr, result.stderr
    assert [f.active for f in stolen] == [family.active]
    assert target.client.dump("users") == before and target.card("users") == 100
    assert target.client.exists(family.standby) and not target.client.exists(family.old)
    assert target.client.get(family.lock) == THIEF.encode()


@GUARDS
@pytest.mark.parametrize("command", ["swap", "rebuild"])
def test_a_sharded_swap_checks_each_members_lock_in_its_script(target, tmp_path, monkeypatch, command):
    """(#10 item 19) A sharded swap inside `rebuild --swap` passed no token to the script at all.
    Each member's script checks the member's lock, taken for that swap: taken by another run right
    before the first member's script, nothing is swapped ("stopped after 0 of 3"), every member
    keeps its filter and its standby, and the other run's lock stays."""
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(3000)))
    args = ["rebuild", "users", "--from-csv", str(csv), "-c", "9000", "-e", "1%", "--shards", "3", "--nonscaling"]
    first = target.cli(*args, "--swap")
    assert first.exit_code == 0, first.stderr
    if command == "swap":
        built = target.cli(*args)
        assert built.exit_code == 0, built.stderr
        run = ["swap", "users", "--yes"]
    else:
        run = [*args, "--swap"]
    manifest = read_manifest(target.client, "users")
    assert manifest is not None
    before = {member: target.client.dump(member) for member in manifest.members}
    stolen = steal_the_lock_before_the_script(monkeypatch, target)
    result = target.cli(*run)
    assert result.exit_code == 5, result.stderr
    assert "stopped after 0 of 3 shards" in result.stderr and "lost the lock" in result.stderr, result.stderr
    assert len(stolen) == 1 and stolen[0].active in manifest.members
    assert {member: target.client.dump(member) for member in manifest.members} == before
    assert all(target.client.exists(f.standby) for f in manifest.families)
    assert target.client.get(stolen[0].lock) == THIEF.encode()
    assert not target.client.exists(KeyFamily.of("users").lock)


# --- release, renewal and the server's word ---------------------------------------------------


def test_release_and_renewal_leave_another_runs_lock_alone(plain):
    """(#10 item 19) The lock's release made an unconditional DEL passed every test. A lock that
    expired and was taken by another run is neither renewed (its expiry stays the other run's),
    nor deleted by `release` or `release_confirmed`; our own lock is released."""
    from bloomctl.errors import StateConflict
    from bloomctl.lifecycle.lock import FilterLock
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(plain.url))
    lock = FilterLock(client, "users", ttl_ms=300)  # renewed every 0.1 s
    lock.acquire()
    assert json.loads(client.get(lock.lock_key))["token"] == lock.token
    assert 0 < client.pttl(lock.lock_key) <= 300  # a dead holder's lock expires by itself
    time.sleep(0.6)  # twice its ttl: the renewals keep it, on the server and locally
    lock.check_writing()
    assert 0 < client.pttl(lock.lock_key) <= 300
    client.set(lock.lock_key, THIEF, px=60_000)
    deadline = time.monotonic() + 3
    while not lock.lost.is_set():
        assert time.monotonic() < deadline, "the renewal never noticed the lock was taken"
        time.sleep(0.02)
    assert client.pttl(lock.lock_key) > 50_000  # not renewed to 300 ms on the other run's behalf
    with pytest.raises(StateConflict, match="lost the lock"):
        lock.check_held()
    lock.release()
    assert client.get(lock.lock_key) == THIEF.encode()
    assert lock.release_confirmed(time.monotonic() + 5) is True
    assert client.get(lock.lock_key) == THIEF.encode()
    with FilterLock(client, "other") as own:
        assert client.exists(own.lock_key)
    assert not client.exists(own.lock_key)


def test_check_held_and_release_confirmed_ask_the_server(plain, workdir):
    """(#10 item 19, found by mutation testing) `check_held` asks the server, before the renewal
    thread would notice: a lock whose value is now another run's, or gone, raises. `release_confirmed`
    deletes our own lock, and says False (in time) when the server never answers."""
    import os
    import signal

    from bloomctl.errors import StateConflict
    from bloomctl.lifecycle.lock import FilterLock
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(plain.url))
    for takeover in (lambda key: client.set(key, THIEF, px=60_000), client.delete):
        lock = FilterLock(client, "users")  # 30 s: the renewal thread looks again in 10 s
        lock.acquire()
        lock.check_held()  # ours: no error
        takeover(lock.lock_key)
        with pytest.raises(StateConflict, match="lost the lock"):
            lock.check_held()
        lock.release()
        client.delete(lock.lock_key)  # the other run is done
    mine = FilterLock(client, "users")
    mine.acquire()
    assert mine.release_confirmed(time.monotonic() + 5) is True and not client.exists(mine.lock_key)

    server = RedisServer(workdir)
    try:
        stalled = FilterLock(connect(settings_from(server.url, timeout=0.2)), "users", ttl_ms=400)
        stalled.acquire()
        os.kill(server.process.pid, signal.SIGSTOP)
        time.sleep(0.5)  # renewals fail: past its ttl the lock counts as lost here, unasked
        with pytest.raises(StateConflict, match="lost the lock"):
            stalled.check()
        stalled.release()  # best effort: no error when the server does not answer
        started = time.monotonic()
        assert stalled.release_confirmed(started + 1) is False
        assert time.monotonic() - started < 3
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


@SIGNALS_LOCKS_ERRORS
def test_a_run_that_lost_its_lock_stops_writing_at_once(target, tmp_path):
    """(#10 item 10) A rebuild whose lock was taken kept writing into its successor's standby (all 400,000
    items here). It looks at the lock on the server before each batch at most every 0.1 s and
    stops (exit 5, "lost the lock"): the successor's standby gets at most the batches of that
    tenth of a second (a lock that expired for want of renewals stops it before anyone can take it).

    The run is stopped (SIGSTOP) while its successor takes over, for twice that tenth of a second:
    its next batch is due for a look at the server. Left running, a run that the busy machine had
    held back caught up in a burst of batches within one tenth of a second, and the count depended
    on the scheduler."""
    from bloomctl.backends import get
    from bloomctl.sizing.bloom import plan as make_plan

    proc = start_rebuild(target, tmp_path, "--batch-size", "1000", "--window", "1")
    stop_process(proc)
    stopped = time.monotonic()
    try:
        family = KeyFamily.of("users")
        target.client.set(family.lock, json.dumps({"token": "successor", "command": "another run"}), px=60_000)
        target.client.unlink(family.standby)  # the successor's new, empty standby
        backend = get(target.backend.name)
        plan = make_plan(1_000_000, 0.01, None if backend.name == "bitmap" else 2)
        backend.reserve(target.client, family.standby, plan)
        time.sleep(max(0.0, stopped + 0.2 - time.monotonic()))
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    started = time.monotonic()
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 5 and "lost the lock" in err.decode(), err.decode()
    assert time.monotonic() - started < 5
    time.sleep(0.2)
    assert target.card(family.standby) <= 3000  # 0.1 s at 20,000 items/s, and the batch in flight


def stop_process(proc) -> None:
    """SIGSTOP ``proc``, and return once the kernel reports it stopped."""
    os.kill(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while not _is_stopped(proc.pid):
        assert time.monotonic() < deadline, "the process never stopped"
        time.sleep(0.005)


def _is_stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:  # the state follows the command name in parentheses
        return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


@SIGNALS_LOCKS_ERRORS
def test_the_lock_note_belongs_to_one_invocation(target):
    """(#10 item 9, review) "the filter's lock is released" is said only by a run that took a lock: the flag
    is reset by every invocation (a long-lived caller's earlier run does not leak into the next)."""
    from bloomctl.lifecycle import lock

    active_and_standby(target, 1000, 900)
    assert target.cli("swap", "users", "--yes").exit_code == 0 and lock.TAKEN[0]
    assert target.cli("info", "users").exit_code == 0 and not lock.TAKEN[0]


# --- waiting for the lock, rollback, scripting ------------------------------------------------


@SIGNALS_LOCKS_ERRORS
def test_lock_wait_waits_for_the_holder(target):
    """(#10 item 15) A swap during a rebuild exited 6 at once; `--lock-wait SECONDS` waits for the lock
    (and still exits 6, naming the holder, when it is not released in time)."""
    import threading
    import time

    active_and_standby(target, 1000, 900)
    lock = KeyFamily.of("users").lock
    holder = json.dumps({"token": "t", "command": "bloomctl rebuild", "host": "h", "pid": 1})
    target.client.set(lock, holder, px=30_000)
    started = time.monotonic()
    waited = target.cli("swap", "users", "--yes", "--lock-wait", "0.5")
    assert waited.exit_code == 6 and "waited 0.5s" in waited.stderr
    assert 0.4 < time.monotonic() - started < 3
    assert "--lock-wait" in target.cli("swap", "users", "--yes").stderr  # the hint, when not waiting
    threading.Timer(0.6, lambda: target.client.delete(lock)).start()
    started = time.monotonic()
    swapped = target.cli("swap", "users", "--yes", "--lock-wait", "10")
    assert swapped.exit_code == 0, swapped.stderr
    assert 0.5 < time.monotonic() - started < 5 and target.card("users") == 900


@SIGNALS_LOCKS_ERRORS
@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_the_library_refuses_a_lock_wait_that_never_ends(target, bad):
    """(#10 items 1, 15, review) `lifecycle.swap(..., lock_wait=nan)` waited for ever on a held lock."""
    active_and_standby(target, 1000, 900)
    target.client.set(KeyFamily.of("users").lock, json.dumps({"token": "t"}), px=30_000)
    server = detect(target.client)
    with pytest.raises(UsageError, match="lock_wait"):
        lifecycle.swap(target.client, server, "users", lock_wait=bad)
    with pytest.raises(UsageError, match="lock_wait"):
        lifecycle.rollback(target.client, "users", lock_wait=bad)


@GUARDS
def test_rollback_takes_the_lock_and_asks_on_a_terminal(target, monkeypatch):
    """(#10 item 19, found by mutation testing) A rollback that skipped the filter's lock, or its
    question on a terminal, passed every test. While another run holds the lock, rollback exits 6
    and moves nothing; on a terminal, "n" leaves the filters as they were; "y" rolls back."""
    import bloomctl.cli.confirm as confirm

    family = active_and_standby(target, 100, 200)
    assert target.cli("swap", "users", "--yes", "--keep-old", "600").exit_code == 0
    target.client.set(family.lock, THIEF, px=60_000)
    held = target.cli("rollback", "users", "--yes")
    assert held.exit_code == 6 and "locked by another bloomctl run" in held.stderr, held.stderr
    assert target.card("users") == 200 and target.card(family.old) == 100
    assert target.client.get(family.lock) == THIEF.encode()
    target.client.delete(family.lock)
    monkeypatch.setattr(confirm, "stdin_is_tty", lambda: True)
    refused = target.cli("rollback", "users", input="n\n")
    assert refused.exit_code == 5 and "not confirmed" in refused.stderr, refused.stderr
    assert "Roll 'users' back to '{users}:old'?" in refused.stderr
    assert target.card("users") == 200 and target.card(family.old) == 100
    assert target.cli("rollback", "users", input="y\n").exit_code == 0
    assert target.card("users") == 100 and not target.client.exists(family.lock)


@SIGNALS_LOCKS_ERRORS
def test_a_user_without_scripting_is_told_before_anything_is_written(target, tmp_path):
    """(#10 item 6) An ACL user without scripting failed only after the whole load."""
    if target.cluster:
        pytest.skip("one node's ACL")
    target.client.execute_command("ACL", "SETUSER", "noscript", "on", ">pw", "~*", "&*", "+@all", "-@scripting")
    try:
        csv = tmp_path / "u.csv"
        csv.write_text("id\nuser:1\n")
        url = target.url.replace("redis://", "redis://noscript:pw@", 1)
        for args in (
            ["rebuild", "users", "--from-csv", str(csv), "-c", "100", "-e", "1%", "--swap"],
            ["swap", "users", "--yes"],
        ):
            result = target.cli(*args, url=url)
            assert result.exit_code == 4 and "may not run Lua scripts" in result.stderr, result.stderr
            assert "pw" not in result.stderr.replace("+@scripting", "")
        family = KeyFamily.of("users")
        assert not any(target.client.exists(key) for key in (family.standby, family.standby_meta, family.lock))
    finally:
        target.client.execute_command("ACL", "DELUSER", "noscript")


def _rebuild_without_function(target, tmp_path, key: str, *extra: str, denied: str = "function"):
    """`rebuild KEY` by a user who may run everything but ``denied`` (FUNCTION: its LIST, LOAD...)."""
    target.client.execute_command("ACL", "SETUSER", "nofunction", "on", ">pw", "~*", "&*", "+@all", f"-{denied}")
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(100)))
    url = target.url.replace("redis://", "redis://nofunction:pw@", 1)
    try:
        return target.cli("rebuild", key, "--from-csv", str(csv), "-c", "1000", "-e", "1%", "--swap", *extra, url=url)
    finally:
        target.client.execute_command("ACL", "DELUSER", "nofunction")


def _assert_refused_leaving_no_mark(target, result, key: str, denied: str = "'function|list'") -> None:
    """One line, exit 3 (the server refused a command), and no standby nor metadata of it left."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("bloomctl: ")]
    assert result.exit_code == 3 and len(lines) == 1 and denied in lines[0], result.stderr
    family = KeyFamily.of(key)
    left = {k: target.client.pttl(k) for k in (family.standby, family.standby_meta, family.standby_log)}
    assert all(ttl == -2 for ttl in left.values()), (left, target.client.hgetall(family.standby_meta))
    assert not target.client.exists(family.lock)


@SIGNALS_LOCKS_ERRORS
@pytest.mark.parametrize("existing", [False, True], ids=["first-build", "rebuild"])
def test_a_user_denied_function_leaves_no_loading_standby_metadata(target, tmp_path, existing):
    """(#24 item 5) A user who may not run FUNCTION rebuilt a module-free filter: the standby's
    metadata was marked `loading` before the library was found unusable, and stayed, without TTL."""
    if not target.backend.needs_library or target.cluster:
        pytest.skip("RedisBloom's own commands need no library; one node's ACL")
    if existing:
        target.reserve("users", 1000)
        target.add("users", ["user:0"])
    result = _rebuild_without_function(target, tmp_path, "users", "--backend", target.backend.name)
    _assert_refused_leaving_no_mark(target, result, "users")
    assert target.card("users") == 1 if existing else not target.client.exists("users")


@SIGNALS_LOCKS_ERRORS
@pytest.mark.parametrize("existing", [False, True], ids=["first-build", "rebuild"])
def test_a_user_denied_function_leaves_no_loading_cuckoo_standby_metadata(ctarget, tmp_path, existing):
    """(#24 item 5) The same for a cuckoo filter, whose dual writes during the rebuild are logged by
    the library (RedisBloom's CF.* too)."""
    if ctarget.cluster:
        pytest.skip("one node's ACL")
    if existing:
        args = ("--type", "cuckoo", "--backend", backend_choice(ctarget))
        assert ctarget.cli("reserve", "users", "-c", "1000", *args).exit_code == 0
        ctarget.add("users", ["user:0"])
    args = ("--type", "cuckoo", "--backend", backend_choice(ctarget))
    result = _rebuild_without_function(ctarget, tmp_path, "users", *args)
    _assert_refused_leaving_no_mark(ctarget, result, "users")
    assert ctarget.card("users") == 1 if existing else not ctarget.client.exists("users")


@SIGNALS_LOCKS_ERRORS
def test_a_reserve_the_server_refuses_leaves_no_loading_standby_metadata(target, tmp_path):
    """The library usable, but the standby's own reserve refused (a user denied FCALL, whose
    reserve is bloomctl_reserve; or BF.RESERVE): the `loading` mark written before it stayed, with
    no standby and no TTL, and `swap` refused until the next rebuild."""
    if target.cluster:
        pytest.skip("one node's ACL")
    denied = "fcall" if target.backend.needs_library else "bf.reserve"
    target.reserve("users", 1000)
    target.add("users", ["user:0"])
    result = _rebuild_without_function(target, tmp_path, "users", "--build", "server", denied=denied)
    _assert_refused_leaving_no_mark(target, result, "users", f"'{denied}'")
    assert target.card("users") == 1


@SIGNALS_LOCKS_ERRORS
def test_a_signal_during_the_standbys_reserve_leaves_no_loading_mark(target, tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM (both KeyboardInterrupt here) while a standby is reserved, before the load:
    the `loading` mark written just before stayed, with no TTL, and nothing marked it `interrupted`
    (the load's handler starts after the reserve). The run's empty standbys are removed, and the
    active filter, the lock and every other member are as they were."""
    from bloomctl.rebuild import RebuildOptions, rebuild
    from bloomctl.sources import CsvSource

    target.reserve("users", 1000)
    target.add("users", ["user:0"])
    csv = tmp_path / "ids.csv"
    csv.write_text("id\n" + "".join(f"id:{i}\n" for i in range(100)))
    backend_class = type(target.backend)
    real_reserve = backend_class.reserve

    def reserved_then_signalled(self, client, key, plan, *args, **kwargs):
        real_reserve(self, client, key, plan, *args, **kwargs)
        raise KeyboardInterrupt  # the signal handler's, as the reply came in

    monkeypatch.setattr(backend_class, "reserve", reserved_then_signalled)
    nonscaling = target.backend.name == "bitmap"
    options = RebuildOptions(
        capacity=500, error_rate=0.01, swap=True, nonscaling=nonscaling, backend=target.backend.name
    )
    with pytest.raises(KeyboardInterrupt):
        rebuild(target.client, detect(target.client), "users", CsvSource(str(csv)), options)
    family = KeyFamily.of("users")
    left = {k: target.client.pttl(k) for k in (family.standby, family.standby_meta, family.standby_log, family.lock)}
    assert all(ttl == -2 for ttl in left.values()), (left, target.client.hgetall(family.standby_meta))
    assert target.card("users") == 1
