"""The swap script's own refusals, reached directly (issue #24 item 6): a standby that a rebuild
did not finish, one whose dual writes were not replayed or missed one, a lock another run took, a
standby of another kind. `swap` and `rebuild` check each of these in Python first, so no command
reaches the script with them; the script checks again because the state can change between
that check and the script (a cuckoo dual write fails, a rebuild is killed). Each case leaves every
key as it was."""

from __future__ import annotations

import json

import pytest

from bloomctl.errors import StateConflict
from bloomctl.keys import KeyFamily
from bloomctl.lifecycle.single import atomic_rollback, atomic_swap
from tests.helpers.redis import snapshot

REFUSED_STATES = [
    ({"state": "loading"}, "did not finish (loading)"),
    ({"state": "failed"}, "did not finish (failed)"),
    ({"state": "interrupted"}, "did not finish (interrupted)"),
    ({"state": "verified", "dual": "log"}, "not had the writes made during its rebuild replayed"),
    (
        {"state": "verified", "dual_error": "no room"},
        "missed a write the application made during the rebuild (no room)",
    ),
]


def _filters(c, f: KeyFamily) -> None:
    c.set(f.active, b"bloomctl-active")
    c.hset(f.meta, mapping={"state": "verified", "generation": "g0"})
    c.set(f.standby, b"bloomctl-standby")


@pytest.mark.parametrize(("meta", "expected"), REFUSED_STATES, ids=lambda v: v if isinstance(v, str) else None)
def test_the_script_refuses_a_standby_no_rebuild_finished(plain, meta, expected):
    c, f = plain.client(), KeyFamily.of("users")
    _filters(c, f)
    c.hset(f.standby_meta, mapping={"generation": "g1", **meta})
    before = snapshot(c)
    with pytest.raises(StateConflict, match=expected.replace("(", r"\(").replace(")", r"\)")):
        atomic_swap(c, f, standby_type=b"string", standby_magic=b"bloomctl")
    assert snapshot(c) == before


def test_the_script_swaps_a_verified_standby_whose_writes_were_replayed(plain):
    """The states above differ from this one by one field each: the refusals are theirs."""
    c, f = plain.client(), KeyFamily.of("users")
    _filters(c, f)
    c.hset(f.standby_meta, mapping={"generation": "g1", "state": "verified", "dual": "direct"})
    assert atomic_swap(c, f, standby_type=b"string", standby_magic=b"bloomctl", keep_old_ms=60_000) is True
    assert c.get(f.active) == b"bloomctl-standby" and c.get(f.old) == b"bloomctl-active"
    assert c.hget(f.meta, "generation") == b"g1" and c.ttl(f.active) == -1 and c.ttl(f.meta) == -1
    assert 0 < c.pttl(f.old) <= 60_000 and 0 < c.pttl(f.old_meta) <= 60_000


def test_the_script_refuses_without_the_runs_lock(plain):
    """A run whose lock expired, or was taken by another run, swaps nothing."""
    c, f = plain.client(), KeyFamily.of("users")
    _filters(c, f)
    before = snapshot(c)
    with pytest.raises(StateConflict, match="lost the lock"):
        atomic_swap(c, f, standby_type=b"string", lock_token="mine")
    c.set(f.lock, json.dumps({"token": "theirs"}))
    before = snapshot(c)
    with pytest.raises(StateConflict, match="lost the lock"):
        atomic_swap(c, f, standby_type=b"string", lock_token="mine")
    assert snapshot(c) == before
    c.set(f.lock, json.dumps({"token": "mine"}))
    assert atomic_swap(c, f, standby_type=b"string", lock_token="mine") is True


def test_the_script_refuses_a_standby_of_another_kind(plain):
    c, f = plain.client(), KeyFamily.of("users")
    _filters(c, f)
    c.set(f.standby, b"someone else's string")
    before = snapshot(c)
    with pytest.raises(StateConflict, match="not a bloomctl filter"):
        atomic_swap(c, f, standby_type=b"string", standby_magic=b"bloomctl")
    with pytest.raises(StateConflict, match="missing or changed type"):
        atomic_swap(c, f, standby_type=b"MBbloom--")
    assert snapshot(c) == before


def test_the_first_swap_leaves_no_old_filter_and_a_kept_one_expires(plain):
    """No active filter: the standby becomes it, and nothing is left at the old key; with keep 0
    the replaced filter is unlinked at once."""
    c, f = plain.client(), KeyFamily.of("users")
    c.set(f.standby, b"bloomctl-1")
    assert atomic_swap(c, f, standby_type=b"string", keep_old_ms=60_000) is False
    assert c.get(f.active) == b"bloomctl-1" and not c.exists(f.old)
    c.set(f.standby, b"bloomctl-2")
    assert atomic_swap(c, f, standby_type=b"string", keep_old_ms=0) is True
    assert c.get(f.active) == b"bloomctl-2" and not c.exists(f.old) and not c.exists(f.standby)


def test_a_rollback_makes_the_rolled_back_filter_the_standby(plain):
    c, f = plain.client(), KeyFamily.of("users")
    c.set(f.active, b"new")
    c.hset(f.meta, "generation", "g2")
    c.set(f.old, b"old")
    c.hset(f.old_meta, "generation", "g1")
    c.pexpire(f.old, 60_000)
    atomic_rollback(c, f)
    assert (c.get(f.active), c.get(f.standby), c.exists(f.old)) == (b"old", b"new", 0)
    assert c.hget(f.meta, "generation") == b"g1" and c.hget(f.standby_meta, "generation") == b"g2"
    assert c.ttl(f.active) == -1 and c.ttl(f.meta) == -1
