"""Redis look-ups and set-ups that several test modules share: a client for a server fixture,
items added through a key's backend, every key's DUMP, and an active filter with a standby of
exact sizes."""

from __future__ import annotations

from bloomctl import backends
from bloomctl.keys import KeyFamily, to_bytes
from bloomctl.server.connection import connect, settings_from


def client_of(server):
    return connect(settings_from(server.url))


def add(client, key: str, items) -> None:
    """``items`` as text, added to ``key`` by the backend that holds it, 1,000 a command."""
    raw = to_bytes(key)
    backend = backends.for_key(client, raw)
    items = [str(i).encode() for i in items]
    for start in range(0, len(items), 1000):
        backend.madd(client, raw, items[start : start + 1000])


def snapshot(client) -> dict[bytes, bytes]:
    """Every key and its DUMP: what a command that changes nothing leaves equal."""
    return {key: client.dump(key) for key in sorted(client.scan_iter(count=1000))}


def fill_to(target, key, count: int, prefix: str = "user:") -> None:
    """Add distinct items until the filter counts exactly ``count`` (an add that is a false
    positive is not counted, so a batch of ``count`` items can count fewer)."""
    start = 0
    while (have := target.card(key)) < count:
        target.add(key, [f"{prefix}{i}" for i in range(start, start + count - have)])
        start += count - have
    assert target.card(key) == count


def active_and_standby(target, active: int = 1000, standby: int = 3) -> KeyFamily:
    """'users' counting ``active`` items and its standby ``standby``, both reserved for 10,000."""
    family = KeyFamily.of("users")
    target.reserve(family.active, 10_000)
    fill_to(target, family.active, active)
    target.reserve(family.standby, 10_000)
    fill_to(target, family.standby, standby)
    return family


def backend_choice(ctarget) -> str:
    """The --backend value that makes a cuckoo filter on ``ctarget``'s backend."""
    return "redisbloom" if ctarget.backend.name == "redisbloom-cuckoo" else "module-free"
