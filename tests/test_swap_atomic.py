"""The atomic swap primitive on real servers, with plain keys: runs on every Redis, no module needed."""

from __future__ import annotations

import pytest

from bloomctl.errors import StateConflict
from bloomctl.keys import KeyFamily
from bloomctl.lifecycle.single import atomic_rollback, atomic_swap
from tests.helpers.hammer import Hammer

pytestmark = pytest.mark.matrix  # CI runs this module on every server of the matrix

SWAPS = 300


def _hammer_swaps(client, reader, key: str) -> Hammer:
    family = KeyFamily.of(key)
    client.set(family.active, b"v0")
    with Hammer(reader, lambda c: c.get(family.active), lambda v: v is not None and v.startswith(b"v")) as hammer:
        for i in range(1, SWAPS + 1):
            client.set(family.standby, b"v%d" % i)
            assert atomic_swap(client, family, standby_type=b"string") is True
            if i % 50 == 0:  # let the reader run between bursts: at least as many reads as swaps so far
                hammer.wait_for_calls(i)
    assert client.get(family.active) == b"v%d" % SWAPS
    assert not client.exists(family.standby) and not client.exists(family.old)
    return hammer


def test_reader_never_sees_the_key_missing(plain):
    hammer = _hammer_swaps(plain.client(), plain.client(), "users")
    assert hammer.calls > SWAPS  # the reader really ran concurrently
    assert hammer.bad == []


@pytest.mark.cluster
@pytest.mark.parametrize("key", ["users", "bf:{users}", "a}b"])
def test_reader_never_sees_the_key_missing_on_a_cluster(cluster, key):
    hammer = _hammer_swaps(cluster.client(), cluster.client(), key)
    assert hammer.calls > SWAPS
    assert hammer.bad == []


def test_metadata_moves_with_its_filter_and_old_is_kept(plain):
    c = plain.client()
    f = KeyFamily.of("users")
    c.set(f.active, b"A")
    c.hset(f.meta, "gen", "A")
    c.set(f.standby, b"B")
    c.hset(f.standby_meta, "gen", "B")
    c.expire(f.standby, 1000)  # a standby's safety TTL must not follow it into the active slot
    atomic_swap(c, f, keep_old_ms=60_000, standby_type=b"string")
    assert c.get(f.active) == b"B" and c.hget(f.meta, "gen") == b"B"
    assert c.get(f.old) == b"A" and c.hget(f.old_meta, "gen") == b"A"
    assert c.ttl(f.active) == -1 and c.ttl(f.meta) == -1
    assert 0 < c.pttl(f.old) <= 60_000 and 0 < c.pttl(f.old_meta) <= 60_000
    assert not c.exists(f.standby) and not c.exists(f.standby_meta)

    atomic_rollback(c, f)
    assert c.get(f.active) == b"A" and c.hget(f.meta, "gen") == b"A"
    assert c.ttl(f.active) == -1
    assert c.get(f.standby) == b"B" and c.hget(f.standby_meta, "gen") == b"B"
    assert not c.exists(f.old) and not c.exists(f.old_meta)


def test_swap_without_keep_unlinks_the_old_filter(plain):
    c = plain.client()
    f = KeyFamily.of("users")
    c.set(f.active, b"A")
    c.set(f.standby, b"B")
    atomic_swap(c, f, standby_type=b"string")
    assert c.get(f.active) == b"B" and not c.exists(f.old)


def test_first_swap_creates_the_active_key(plain):
    c = plain.client()
    f = KeyFamily.of("users")
    c.set(f.standby, b"B")
    assert atomic_swap(c, f, standby_type=b"string") is False
    assert c.get(f.active) == b"B"


def test_swap_refuses_a_missing_or_wrong_standby_and_changes_nothing(plain):
    c = plain.client()
    f = KeyFamily.of("users")
    c.set(f.active, b"A")
    with pytest.raises(StateConflict):
        atomic_swap(c, f, standby_type=b"string")
    c.rpush(f.standby, b"x")
    with pytest.raises(StateConflict):
        atomic_swap(c, f, standby_type=b"string")
    assert c.get(f.active) == b"A" and c.type(f.standby) == b"list"


def test_rollback_refuses_without_old_or_with_a_standby(plain):
    c = plain.client()
    f = KeyFamily.of("users")
    c.set(f.active, b"A")
    with pytest.raises(StateConflict):
        atomic_rollback(c, f)
    c.set(f.old, b"O")
    c.set(f.standby, b"S")
    with pytest.raises(StateConflict):
        atomic_rollback(c, f)
    assert c.get(f.active) == b"A" and c.get(f.old) == b"O" and c.get(f.standby) == b"S"


def test_swap_checks_everything_before_the_first_write(plain):
    """A bad keep value or a standby that is a companion key is refused with every key untouched."""
    c = plain.client()
    f = KeyFamily.of("users")
    c.set(f.active, b"A")
    c.set(f.standby, b"B")
    with pytest.raises(StateConflict, match="keep-old"):
        atomic_swap(c, f, keep_old_ms=-5, standby_type=b"string")
    c.set(f.old, b"O")
    with pytest.raises(StateConflict, match="companions"):
        atomic_swap(c, f, standby=f.old, standby_type=b"string")
    assert (c.get(f.active), c.get(f.standby), c.get(f.old)) == (b"A", b"B", b"O")


def test_custom_standby_brings_its_own_metadata(plain):
    c = plain.client()
    f = KeyFamily.of("bf:{u}")
    custom = b"bf:{u}:v2"
    c.set(f.active, b"A")
    c.hset(f.meta, "gen", "A")
    c.set(custom, b"V2")
    c.hset(KeyFamily.of(custom).meta, "gen", "V2")
    c.set(f.standby, b"S")
    c.hset(f.standby_meta, "gen", "S")
    atomic_swap(c, f, standby=custom, standby_type=b"string")
    assert c.get(f.active) == b"V2" and c.hget(f.meta, "gen") == b"V2"
    assert not c.exists(KeyFamily.of(custom).meta)
    assert c.get(f.standby) == b"S" and c.hget(f.standby_meta, "gen") == b"S"  # the default standby is untouched


def test_keep_old_bounds():
    from bloomctl.errors import UsageError
    from bloomctl.lifecycle.single import to_keep_ms

    assert to_keep_ms(0) == 0 and to_keep_ms(0.0001) == 1 and to_keep_ms(1.5) == 1500
    for bad in (-1, float("nan"), float("inf"), 1e14):
        with pytest.raises(UsageError):
            to_keep_ms(bad)
