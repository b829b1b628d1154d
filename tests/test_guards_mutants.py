"""Tests that kill the mutants that survived in the modules guarding data (scripts/mutation.sh,
docs/testing.md): the filter's lock (its retries, expiry, the server's word, release), the
redaction of URLs' secrets, a dump's header checks, the swap guards, and the config file's refusal
of secrets. Each states the behaviour the surviving mutant broke unnoticed."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from bloomctl.defaults import MAX_LOCK_WAIT_SECONDS
from bloomctl.errors import LockHeld, StateConflict, UnsupportedServer
from bloomctl.keys import KeyFamily
from bloomctl.lifecycle import lock as lock_module
from bloomctl.lifecycle.lock import FilterLock, describe_holder
from bloomctl.server.capabilities import detect
from bloomctl.server.connection import connect, settings_from
from tests.servers import RedisServer

LOCK = KeyFamily.of("users").lock
HOLDER = json.dumps({"token": "other", "command": "bloomctl rebuild", "pid": 7, "host": "h", "since": "then"})


class Clock:
    """The lock module's ``time``, made exact: ``monotonic`` reads ``now``; ``sleep`` records the
    pause, moves ``now`` on (rounded to the nanosecond, so sums of pauses meet a deadline exactly)
    and calls ``on_sleep`` with the number of pauses so far."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.slept: list[float] = []
        self.on_sleep = lambda count: None

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0 and len(self.slept) < 50, f"slept {seconds} s after {self.slept}: it would spin for ever"
        self.slept.append(seconds)
        self.now = round(self.now + seconds, 9)
        self.on_sleep(len(self.slept))


def _held_until(lock: FilterLock, clock: Clock, until: float, before: float) -> None:
    """The lock counts as ours ``before`` seconds ahead of ``until``, and as lost from ``until`` on."""
    clock.now = until - before
    lock.check()
    clock.now = until
    with pytest.raises(StateConflict, match="lost the lock"):
        lock.check()
    lock.release()


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock(100.0)
    monkeypatch.setattr(lock_module, "time", fake)
    return fake


def client_of(server, timeout: float | None = None):
    return connect(settings_from(server.url, timeout=timeout) if timeout else settings_from(server.url))


# --- the lock ----------------------------------------------------------------------------------


def test_a_held_lock_is_retried_at_growing_pauses_the_last_try_at_the_deadline(plain, clock):
    """Retries every 0.05 s, doubling up to 1 s; the last try is at the deadline itself, and none
    after it (a pause of 0 there would spin for ever). Without ``wait`` a held lock is refused at once."""
    client = client_of(plain)
    client.set(LOCK, HOLDER, px=60_000)
    with pytest.raises(LockHeld, match=r"waits for it"):
        FilterLock(client, "users").acquire()
    assert clock.slept == []
    with pytest.raises(LockHeld, match=r"\(waited 2s\)"):
        FilterLock(client, "users", wait=2).acquire()
    assert clock.slept == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 0.45]) and clock.now == 102.0

    clock.slept.clear()
    clock.on_sleep = lambda count: count == 7 and client.delete(LOCK)  # the holder is done
    lock = FilterLock(client, "users", wait=10)
    lock.acquire()
    assert clock.slept == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert json.loads(client.get(LOCK))["token"] == lock.token and len(lock.token) == 32
    lock.release()
    FilterLock(client, "users", wait=MAX_LOCK_WAIT_SECONDS)  # the longest wait is allowed


def test_a_lock_counts_as_lost_once_its_ttl_has_passed_since_it_was_asked_for(plain, clock):
    """Locally, the lock is ours for ``ttl`` from the moment the SET was sent, to the millisecond:
    a run must stop before another could take the expired lock."""
    lock = FilterLock(client_of(plain), "users", ttl_ms=60_500)  # renewed every 20 s: not during the test
    lock.acquire()
    _held_until(lock, clock, 160.5, 0.01)


def test_a_writer_asks_the_server_for_its_lock_at_once_then_at_most_every_tenth_of_a_second(plain, clock):
    """``check_writing`` asks the server (a GET) at the first write, whatever the clock reads, and
    then only when ``HELD_CHECK_SECONDS`` have passed: at most 10 GETs a second, not one per write."""
    client = client_of(plain)
    clock.now = 0.1
    lock = FilterLock(client, "users")
    lock.acquire()

    def gets() -> int:
        return client.info("commandstats").get("cmdstat_get", {}).get("calls", 0)

    client.config_resetstat()
    lock.check_writing()
    assert gets() == 1
    clock.now = 0.15
    lock.check_writing()
    assert gets() == 1
    clock.now = 0.2  # 0.2 - 0.1 is HELD_CHECK_SECONDS exactly
    lock.check_writing()
    assert gets() == 2
    lock.release()


def test_each_renewal_extends_the_lock_by_its_ttl_from_when_it_was_asked(plain, clock):
    """A renewal makes the lock ours for ``ttl`` from the moment the renewal was sent, to the
    millisecond (not 1000 times that, which would hide a lock lost after it)."""
    lock = FilterLock(client_of(plain), "users", ttl_ms=300)  # renewed every 0.1 s
    lock.acquire()
    clock.now = 200.0
    deadline = time.perf_counter() + 5
    while lock._valid_until < 200:  # the renewal thread's next renewal, on the new clock
        assert time.perf_counter() < deadline, "never renewed"
        time.sleep(0.01)
    lock._stop.set()  # no renewal after this one
    lock._thread.join(5)
    _held_until(lock, clock, 200.3, 0.0001)


def test_lock_renewals_go_on_after_a_transient_error_three_times_per_ttl(workdir):
    """A renewal that fails (the server stopped answering for a moment) is retried at the next
    beat: the lock stays ours on the server and here. And the beat is a third of the ttl, not a
    busy loop of scripts."""
    server = RedisServer(workdir)
    try:
        admin = server.client()
        lock = FilterLock(client_of(server, timeout=0.1), "users", ttl_ms=600)  # renewed every 0.2 s
        lock.acquire()
        admin.config_resetstat()
        time.sleep(0.25)
        os.kill(server.process.pid, signal.SIGSTOP)
        time.sleep(0.3)  # a renewal times out meanwhile
        os.kill(server.process.pid, signal.SIGCONT)
        time.sleep(1.0)
        lock.check()
        assert admin.pttl(lock.lock_key) > 0
        renewals = admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        assert 3 <= renewals <= 12, renewals
        lock.release()
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def test_a_lock_release_confirmed_retries_every_fifth_of_a_second_until_the_deadline(workdir, clock):
    """After a lost reply the release is retried (every 0.2 s) until the server answers: True as
    soon as it does; False once a try at the deadline itself failed, and no try after it."""
    server = RedisServer(workdir)
    lock = FilterLock(client_of(server, timeout=0.5), "users")
    clock.now = 0.2
    lock.acquire()
    server.stop()
    restarted: list[RedisServer] = []
    clock.on_sleep = lambda count: count == 1 and restarted.append(RedisServer(workdir / "again", port=server.port))
    try:
        assert lock.release_confirmed(10.0) is True
        assert clock.slept == [0.2] and clock.now == 0.4
        restarted[0].stop()
        clock.on_sleep = lambda count: None
        assert lock.release_confirmed(0.6) is False
        assert clock.slept == [0.2, 0.2] and clock.now == 0.6
    finally:
        for again in restarted:
            again.stop()


def test_the_refusal_names_the_holder_and_when_its_lock_expires(plain):
    """The holder's lock expiry, in seconds (rounded, not floored), and none for a lock without one."""
    client = client_of(plain)
    client.set(LOCK, HOLDER, px=1_000_990)  # 1000.5 to 1000.99 s by the time it is read: 1001
    with pytest.raises(LockHeld) as held:
        FilterLock(client, "users").acquire()
    assert "bloomctl rebuild pid 7 on h since then; it expires in 1001s unless renewed" in str(held.value)
    client.set(LOCK, HOLDER)  # no expiry (set by hand)
    with pytest.raises(LockHeld) as held:
        FilterLock(client, "users").acquire()
    assert "expires" not in str(held.value) and "pid 7" in str(held.value)
    client.delete(LOCK)  # released between the refused SET and the look at its holder
    with pytest.raises(LockHeld) as held:
        FilterLock(client, "users")._refuse()
    assert "another run, which just released it (--lock-wait" in str(held.value)


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'"a string"'])
def test_an_unreadable_lock_value_is_described_not_raised(raw):
    assert describe_holder(raw) == "another process (an unreadable lock value)"


def test_a_dry_run_checks_the_lock_and_asks_for_scripts_only_when_told(plain):
    """``check_free`` reads; the scripting check is there only with ``scripts``: a dry run of a
    command that runs no script must not be refused for a permission it does not need."""
    admin = plain.client()
    admin.execute_command("ACL", "SETUSER", "noscripts", "reset", "on", ">pw", "~*", "+@all", "-@scripting")
    try:
        client = connect(settings_from(plain.url.replace("redis://", "redis://noscripts:pw@")))
        FilterLock(client, "users").check_free()
        client.set(LOCK, HOLDER, px=60_000)
        with pytest.raises(LockHeld, match="pid 7"):
            FilterLock(client, "users").check_free()
        client.delete(LOCK)
        with pytest.raises(UnsupportedServer, match="may not run Lua scripts"):
            FilterLock(client, "users").check_free(scripts=True)
    finally:
        admin.execute_command("ACL", "DELUSER", "noscripts")


def test_releasing_a_lock_never_taken_is_harmless_and_the_renewal_never_holds_the_process(plain):
    """A run whose acquire failed releases in its cleanup: no error, and the holder's lock stays.
    The renewal thread is a daemon: a process ending without its release (a signal's exit) neither
    hangs on it nor renews a dead run's lock."""
    client = client_of(plain)
    client.set(LOCK, HOLDER, px=60_000)
    refused = FilterLock(client, "users")
    with pytest.raises(LockHeld):
        refused.acquire()
    refused.release()
    assert client.get(LOCK) == HOLDER.encode()
    client.delete(LOCK)
    with FilterLock(client, "users") as held:
        assert held._thread is not None and held._thread.daemon


# --- secrets in URLs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, shown, stripped",
    [
        ("redis://?password=s3cret", "redis://?password=***", "redis://"),  # the query at once
        ("redis://h?password=s3cret", "redis://h?password=***", "redis://h"),  # after a one-letter host
        ("redis://user:secret", "redis://user:***", "redis://user:***"),  # no '@': the "port", to its end
        ("redis://user:secret:6379/0", "redis://user:***", "redis://user:***"),  # no '@': to the text's end
        ("redis://user:s3cr/et", "redis://user:***", "redis://user:***"),  # a '/' of the password's own
        ("redis://user:sec?ret", "redis://user:***", "redis://user:***"),  # a '?' of the password's own
        ("redis://user:123456", "redis://user:***", "redis://user:***"),  # digits, but no port
        ("redis://h:65535/0", "redis://h:65535/0", "redis://h:65535/0"),  # the highest port is one
        ("redis://h:65536/0", "redis://h:***", "redis://h:***"),  # and the next number is none
        ("redis://[::1]:6379/0", "redis://[::1]:6379/0", "redis://[::1]:6379/0"),  # an IPv6 host's colons
        ("redis://[::1]:secret/0", "redis://[::1]:***", "redis://[::1]:***"),  # and a "port" after it
        ("redis://[::]:6379/0", "redis://[::]:6379/0", "redis://[::]:6379/0"),  # a colon just before the ']'
        ("redis://[::1/0", "redis://[::1/0", "redis://[::1/0"),  # an unclosed bracket: nothing to hide
        ("redis://h/0?password=a&password=y:z@w", "redis://h/0?password=***&password=***", "redis://h/0"),
        ("redis://u:pw@h:1/0?password=q&db=2", "redis://u:***@h:1/0?password=***&db=2", "redis://u@h:1/0?db=2"),
        ("redis://:pw@h:1/0?db=2#frag", "redis://:***@h:1/0?db=2#frag", "redis://h:1/0?db=2#frag"),
        ("redis://u:p:q@h:1/0", "redis://u:***@h:1/0", "redis://u@h:1/0"),
        ("redis://u:p@x@h:1/0", "redis://u:***@h:1/0", "redis://u@h:1/0"),  # an '@' in the password
        ("redis://u:pw@[::1/0", "redis://u:***@[::1/0", "redis://u:***@[::1/0"),  # unreadable: masked instead
        (
            "redis://u:pw@h:1/0?x=password&password=s#f",
            "redis://u:***@h:1/0?x=password&password=***",
            "redis://u@h:1/0?x=password#f",
        ),
        ("redis://h/0?password=a:&x@y", "redis://h/0?password=***@y", "redis://h/0?x@y"),  # spans that touch
        ("redis://h:1/0?db=2&&password=x", "redis://h:1/0?db=2&&password=***", "redis://h:1/0?db=2"),
        ("redis://h:1/0?db=2", "redis://h:1/0?db=2", "redis://h:1/0?db=2"),  # nothing to hide: as typed
    ],
)
def test_redaction_hides_every_secret_and_nothing_else(url, shown, stripped):
    """``redact_url`` masks each secret whole (overlapping readings merged), ``url_without_secrets``
    leaves them out and keeps the user, database, other query keys and fragment."""
    from bloomctl.server.connection import redact_url, url_without_secrets

    assert redact_url(url) == shown
    assert url_without_secrets(url) == stripped


def test_an_empty_password_is_no_secret_and_the_longest_secret_is_scrubbed_first():
    """``redis://app:@host`` holds no password to hide or refuse. A third party's message is
    scrubbed of the longest secret first: a shorter one inside it must not leave its tail shown."""
    from bloomctl.server.connection import ConnectionSettings, _scrub, url_has_secret

    assert not url_has_secret("redis://app:@h:1/0") and url_has_secret("redis://app:x@h:1/0")
    settings = ConnectionSettings(url="redis://u:abcdef@h:1/0", password="abc")
    assert _scrub("auth abcdef failed at redis://u:abcdef@h:1/0", settings) == "auth *** failed at redis://u:***@h:1/0"


@pytest.mark.parametrize(
    "url, secrets, shown",
    [
        ("postgresql://u:p%40ss@h:5432/db", {"p%40ss", "p@ss"}, "postgresql://u:***@h:5432/db"),  # typed and decoded
        ("postgresql://u:pa@ss@h/db", {"pa", "pa@ss"}, "postgresql://u:***@h/db"),  # up to the first '@' and the last
        ("postgresql://:pa@ss@h/db", {"pa", "pa@ss"}, "postgresql://:***@h/db"),  # no user
        ("postgresql://u:secret", {"secret"}, "postgresql://u:***"),  # no '@': the "port"
        ("postgresql://:secret", {"secret"}, "postgresql://:***"),
        (
            "postgresql://h/db?sslpassword=k1&Password=k2&user=u",
            {"k1", "k2"},
            "postgresql://h/db?sslpassword=***&Password=***&user=u",
        ),
        ("postgresql://h/db?password=a+b%21", {"a+b%21", "a+b!", "a b!"}, "postgresql://h/db?password=***"),
        ("postgresql://u@h:5432/db", set(), "postgresql://u@h:5432/db"),
    ],
)
def test_a_database_urls_secrets_every_way_they_may_be_read(url, secrets, shown):
    """``secrets_of`` finds each text that a driver may take for a password, as typed and
    percent-decoded (and no more, which would hide harmless text); ``redact_db_url`` masks them."""
    from bloomctl.sources.urls import redact_db_url, secrets_of

    assert secrets_of(url) == secrets
    assert redact_db_url(url) == shown


# --- a dump's header ---------------------------------------------------------------------------------


def header_of(server, backend: str, capacity: int, error_rate: float, expansion: int | None) -> dict:
    """The header ``dump`` writes for a filter reserved so on ``server``."""
    from bloomctl.lifecycle.front import reserve
    from bloomctl.sizing.bloom import plan
    from bloomctl.transfer.dump import read_filter

    client = client_of(server)
    server_info = detect(client)
    reserve(client, server_info, "users", plan(capacity, error_rate, expansion), backend=backend)
    return read_filter(client, server_info, "users").header


@pytest.mark.parametrize(
    "where, change",
    [
        ("header", {"capacity": 0}),
        ("header", {"error_rate": 0.0}),
        ("header", {"error_rate": -0.01}),
        ("header", {"error_rate": 1.0}),
        ("header", {"expansion": 0}),
        ("header", {"items": -1}),
        ("header", {"metadata": {"recipe": 1}}),
        ("header", {"shards": 0, "routing": "crc32-mod-n"}),  # routed as a sharded filter is
        ("member", {"capacity": 0}),
        ("member", {"items": -1}),
        ("member", {"size_bytes": 0}),
        ("member", {"filters": 0}),
        ("member", {"expansion": 0}),
    ],
    ids=str,
)
def test_a_header_field_just_out_of_its_range_is_refused(plain, where, change):
    """A dump's capacities and sizes are at least 1, its counts at least 0, its error rate above
    0 and below 1, its metadata text to text: a header just outside is refused before anything is
    written. At the bounds it passes: one shard, a size of 1 byte (which the sizes check then judges)."""
    from bloomctl.lifecycle.routing import ROUTING
    from bloomctl.transfer.dumpfile import DumpCorrupt
    from bloomctl.transfer.validate import check_header

    honest = header_of(plain, "bitmap", 1000, 0.01, None)
    (member,) = honest["members"]
    check_header(honest)
    check_header({**honest, "shards": 1, "routing": ROUTING})
    check_header({**honest, "members": [{**member, "size_bytes": 1}]})
    forged = {**honest, **change} if where == "header" else {**honest, "members": [{**member, **change}]}
    with pytest.raises(DumpCorrupt, match="incomplete or inconsistent"):
        check_header(forged)


def test_sizes_no_filter_can_have_are_refused_as_inconsistent(plain):
    """Sizes no filter can have are refused as an inconsistent header (exit 8), never a traceback
    or a usage error: a filter that never grows declaring 2 sub-filters, and a rate no plan takes.
    A forged chain is followed while each next sub-filter still fits the declared size, not past it."""
    from bloomctl.transfer.dumpfile import DumpCorrupt
    from bloomctl.transfer.validate import check_sizes

    honest = header_of(plain, "bitmap", 1000, 0.01, None)
    (member,) = honest["members"]
    check_sizes(honest)
    check_sizes({**honest, "members": [{**member, "error_rates": []}]})  # no sub-filter rate: the header's alone
    for forged in (
        {**honest, "members": [{**member, "filters": 2}]},
        {**honest, "error_rate": 1e-300, "members": [{**member, "error_rates": [1e-300]}]},
    ):
        with pytest.raises(DumpCorrupt, match="give no filter"):
            check_sizes(forged)
    grown = {**honest, "backend": "redisbloom", "expansion": 2}
    chain = {"capacity": 1, "size_bytes": 1, "error_rates": [0.005]}
    with pytest.raises(DumpCorrupt, match=r"give 328: the header"):  # the 4th sub-filter's 8 items fit 8 bits
        check_sizes({**grown, "members": [{**member, **chain, "expansion": 2, "filters": 4}]})
    with pytest.raises(DumpCorrupt, match="give no filter"):  # the 3rd one's 9 items do not
        check_sizes({**grown, "members": [{**member, **chain, "expansion": 3, "filters": 3}]})


def test_a_capped_rate_restores_and_a_chain_past_any_rate_is_refused(bloom):
    """A filter Redis 8 reserved at its cap of 0.25 may carry a recipe of 0.3: its size is checked
    against the first sub-filter's rate too, and accepted. A forged chain of sub-filters whose
    rates would halve down to 0 gives no filter: refused as inconsistent, never a traceback."""
    from bloomctl.transfer.dumpfile import DumpCorrupt
    from bloomctl.transfer.validate import check_sizes

    capped = header_of(bloom, "redisbloom", 1000, 0.25, 2)
    check_sizes({**capped, "error_rate": 0.3})
    member = {"capacity": 1, "items": 0, "size_bytes": 10**15, "filters": 1100, "expansion": 1}
    forged = {**capped, "capacity": 1, "expansion": 1, "members": [{**member, "error_rates": [0.125] * 1100}]}
    with pytest.raises(DumpCorrupt, match="give no filter"):
        check_sizes(forged)


def test_a_grown_filters_size_is_checked_sub_filter_by_sub_filter(bloom):
    """A RedisBloom filter grown to 4 sub-filters: its size is the chain's, each sub-filter sized
    from the one before it; one byte more is refused, naming the size its parameters give. A
    capacity too large for any float gives no filter: refused, never a traceback."""
    from bloomctl.transfer.dump import read_filter
    from bloomctl.transfer.dumpfile import DumpCorrupt
    from bloomctl.transfer.validate import check_sizes
    from tests.fixtures.redis import Target

    target = Target("redisbloom", "standalone", bloom.url)
    target.reserve("users", 100, 0.01)
    target.add("users", [f"user:{i}" for i in range(800)])
    grown = read_filter(target.client, detect(target.client), "users").header
    (member,) = grown["members"]
    assert member["filters"] == 4 and member["size_bytes"] == 2976
    check_sizes(grown)
    with pytest.raises(DumpCorrupt, match=r"declares 2,984 bytes .* give 2,976: the header is inconsistent"):
        check_sizes({**grown, "members": [{**member, "size_bytes": 2984}]})
    with pytest.raises(DumpCorrupt, match="give no filter"):
        check_sizes({**grown, "members": [{**member, "capacity": 10**400}]})


def test_a_cuckoo_members_size_is_checked_unless_it_grew(plain):
    """A cuckoo member of one sub-filter is sized from its own parameters: one byte more is
    refused. A grown one is left to its header chunk, and the members after it are still checked."""
    from bloomctl.transfer.dump import read_filter
    from bloomctl.transfer.dumpfile import DumpCorrupt
    from bloomctl.transfer.validate import check_sizes
    from tests.fixtures.redis import Target

    target = Target("lua-cuckoo", "standalone", plain.url)
    made = target.cli("reserve", "users", "--type", "cuckoo", "-c", "1000", "--backend", "module-free")
    assert made.exit_code == 0, made.stderr
    header = read_filter(target.client, detect(target.client), "users").header
    (member,) = header["members"]
    check_sizes(header)
    forged = {**member, "size_bytes": member["size_bytes"] + 8}
    with pytest.raises(DumpCorrupt, match="for the filter"):
        check_sizes({**header, "members": [forged]})
    with pytest.raises(DumpCorrupt, match="for member 1"):
        check_sizes({**header, "shards": 2, "members": [{**member, "filters": 2}, forged]})


# --- the swap guards ---------------------------------------------------------------------------------


def test_the_keep_old_guard_at_its_bounds_and_in_whole_milliseconds():
    """0 (unlink at once) and the longest keep are accepted, a fraction of a second is kept, never
    rounded down to 0 ms; beyond either bound, or not a number, is refused."""
    import math

    from bloomctl.defaults import MAX_KEEP_OLD_SECONDS
    from bloomctl.errors import UsageError
    from bloomctl.lifecycle.guards import to_keep_ms

    assert [to_keep_ms(s) for s in (0, 0.0001, 0.5, 1.5)] == [0, 1, 500, 1500]
    assert to_keep_ms(MAX_KEEP_OLD_SECONDS) == MAX_KEEP_OLD_SECONDS * 1000
    for bad in (-0.001, MAX_KEEP_OLD_SECONDS + 0.001, math.nan, math.inf):
        with pytest.raises(UsageError, match="keep_old"):
            to_keep_ms(bad)


def test_the_default_guards_are_shared_frozen_and_refuse_a_shrink_and_a_changed_recipe(plain, tmp_path):
    """``DEFAULT_GUARDS`` is one value every swap without guards of its own uses: nothing may
    change it in place. With it, the library refuses a standby that shrank and one whose items
    were built otherwise; each guard is lifted only by asking."""
    import dataclasses

    from bloomctl.lifecycle.guards import DEFAULT_GUARDS, SwapGuards
    from bloomctl.lifecycle.single import prepare_swap
    from tests.fixtures.redis import Target
    from tests.helpers.redis import active_and_standby

    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_GUARDS.allow_shrink = True  # type: ignore[misc]
    target = Target("bitmap", "standalone", plain.url)
    server = detect(target.client)
    active_and_standby(target, 1000, 3)
    with pytest.raises(StateConflict, match="allow_shrink"):
        prepare_swap(target.client, server, "users")
    assert prepare_swap(target.client, server, "users", SwapGuards(allow_shrink=True)).standby_state.items == 3

    target.client.flushall()
    csv = tmp_path / "u.csv"
    csv.write_text("id\n" + "".join(f"{i}\n" for i in range(200)))
    base = ["rebuild", "users", "--from-csv", str(csv), "--column", "id", "-c", "1000", "-e", "1%"]
    assert target.cli(*base, "--prefix", "user:", "--swap").exit_code == 0
    assert target.cli(*base, "--prefix", "u:", "--allow-recipe-change").exit_code == 0  # built, not swapped
    with pytest.raises(StateConflict, match="built differently"):
        prepare_swap(target.client, server, "users")
    prepare_swap(target.client, server, "users", SwapGuards(allow_recipe_change=True))


def test_the_shrink_ratio_of_an_empty_or_one_item_active_filter(plain):
    """An active filter of 0 items gives no ratio (any standby may replace it, and no division by
    zero); one of 1 item does: an empty standby is 0% of it, and refused."""
    from bloomctl.lifecycle.single import prepare_swap
    from tests.fixtures.redis import Target
    from tests.helpers.redis import active_and_standby

    target = Target("bitmap", "standalone", plain.url)
    server = detect(target.client)
    active_and_standby(target, 0, 5)
    assert prepare_swap(target.client, server, "users").shrink_ratio is None
    target.client.flushall()
    active_and_standby(target, 1, 0)
    with pytest.raises(StateConflict, match=r"standby has 0 items, 0\.0% of the active filter's 1"):
        prepare_swap(target.client, server, "users")


def test_a_standby_elsewhere_on_one_server_a_missing_filter_named_and_a_full_bitmap_standby(plain):
    """On one server a standby under any name may be swapped in (only a Cluster needs one slot),
    but never one of the filter's own companion keys. Swapping a filter that does not exist names
    the filter, for the command line's suggestions, not its standby. A bitmap standby filled
    exactly to its capacity is not over it."""
    from bloomctl.errors import KeyMissing
    from bloomctl.lifecycle.single import prepare_swap
    from tests.fixtures.redis import Target

    target = Target("bitmap", "standalone", plain.url)
    server = detect(target.client)
    with pytest.raises(KeyMissing, match="filter 'users' does not exist") as missing:
        prepare_swap(target.client, server, "users")
    assert missing.value.filter_key == b"users"
    target.reserve("users", 1000)
    with pytest.raises(StateConflict, match="must not be the active filter or one of its companion keys"):
        prepare_swap(target.client, server, "users", standby=LOCK)  # its own ':meta' is no companion of ours
    target.reserve("elsewhere", 100, 0.0001)
    target.add("elsewhere", [f"item:{i}" for i in range(100)])
    assert target.card("elsewhere") == 100  # each add counted: no false positive among them
    plan = prepare_swap(target.client, server, "users", standby="elsewhere")
    assert plan.standby == b"elsewhere" and plan.standby_state.items == plan.standby_state.capacity == 100


# --- the config file's checks ----------------------------------------------------------------------


def test_every_problem_of_a_table_is_reported_after_a_secret_or_a_misplaced_table():
    """A secret in the file is refused, and the keys after it are still checked; so are the
    tables after one that is not a table of tables. Booleans and column names are of their kind."""
    from bloomctl.declared.schema import check_keys

    found = check_keys(
        {
            "profiles": {"p": {"password": "hunter2", "colour": 1, "cluster": "yes"}, "q": {"cluster": True}},
            "filters": {
                "f": {"source": {"column": ""}},
                "g": {"source": {"column": 3}},
                "h": {"source": {"column": "id"}},
            },
        }
    )
    assert found == [
        (
            ("profiles", "p", "password"),
            "secrets never go in the file: name a password_file or password_env (a database URL: db_url_env)",
        ),
        (("profiles", "p", "colour"), "unknown key (did you mean 'cluster'?)"),
        (("profiles", "p", "cluster"), "must be true or false, got 'yes'"),
        (("filters", "f", "source", "column"), "must be a name or a number, got ''"),
    ]
    assert check_keys({"profiles": "x", "versoin": 1}) == [
        (("profiles",), "must be a table of tables"),
        (("versoin",), "unknown key (did you mean 'version'?)"),
    ]
    assert check_keys({"filters": {"f": {"source": {"column": ["id"]}}}}) == [
        (("filters", "f", "source", "column"), "must be a name or a number, got ['id']")
    ]


def test_metadata_replaced_between_the_two_reads_of_its_check_is_not_someone_elses(plain):
    """A companion check reads the key's type, then its created_by field; another run replacing
    its own metadata (deleted, then written whole) between the two left a hash without the field,
    refused as someone else's (exit 5 where the other run held the lock: two applies at once)."""
    import redis

    from bloomctl.lifecycle.metadata import foreign_companion

    class Between(redis.Redis):
        reads = 0

        def hget(self, name, key):  # the other run's delete, then its rewrite, around the first read
            self.reads += 1
            if self.reads > 1:
                return super().hget(name, key)
            super().delete(name)
            value = super().hget(name, key)
            super().hset(name, mapping={"created_by": "bloomctl 1.0", "state": "loading"})
            return value

    client = Between.from_url(plain.url)
    meta = KeyFamily.of("users").standby_meta
    client.hset(meta, mapping={"created_by": "bloomctl 1.0", "state": "loading"})
    assert foreign_companion(client, meta, "metadata") is None
    client.delete(meta)
    client.hset(meta, "state", "someone else's")  # a hash without the field, there after every read
    assert "did not write" in (foreign_companion(redis.Redis.from_url(plain.url), meta, "metadata") or "")
