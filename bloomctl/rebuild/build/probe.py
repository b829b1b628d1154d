"""The compatibility probe: a small filter built by the server and by the client, compared.

Before a client-built filter replaces anything, the server at hand builds a small filter with
the same error rate and options from a fixed set of awkward items (empty, binary, long, unicode,
repeated), and the client builds it too: the bytes and the item count must be equal, and for
RedisBloom the header the client would upload must be the server's own. Any difference means the
server hashes or lays out bits another way (another module line, another server), and the
rebuild takes the server path.
"""

from __future__ import annotations

import random
import secrets
from typing import Any

import numpy as np

from bloomctl.backends import Backend
from bloomctl.keys import KeyFamily
from bloomctl.rebuild.build import redisbloom
from bloomctl.rebuild.build.client import Build, scheme_for
from bloomctl.server.client import RedisClient
from bloomctl.sizing.bloom import plan as make_plan

PROBE_CAPACITY = 2000
PROBE_TTL_MS = 600_000


def probe_items() -> list[bytes]:
    rng = random.Random(20261130)
    items = [b"", b"a", b"user:42", "日本語".encode(), b"\x00\xff" * 9, b"x" * 100]
    items += [rng.randbytes(rng.randrange(1, 70)) for _ in range(1200)]
    items += items[:300]  # repeats: counted once, as the server counts
    return items


def check(
    client: RedisClient, backend: Backend, family: KeyFamily, error_rate: float, expansion: int | None
) -> str | None:
    """None when the client builds exactly what this server builds; else what differs."""
    key = family.companion(f"probe:{secrets.token_hex(8)}")  # this run's own, expiring: a killed run leaves nothing
    items = probe_items()
    try:
        backend.reserve(client, key, backend.check_plan(make_plan(PROBE_CAPACITY, error_rate, expansion)))
        client.pexpire(key, PROBE_TTL_MS)  # type: ignore[attr-defined]
        for start in range(0, len(items), 500):
            backend.madd(client, key, items[start : start + 500])
        return _compare(client, backend.name, key, items)
    finally:
        client.unlink(key)


def _compare(client: RedisClient, backend: str, key: bytes, items: list[bytes]) -> str | None:
    scheme = scheme_for(backend)
    layout = scheme.read_layout(client, key)
    build = Build(backend, [layout])  # the code the rebuild runs: the kernel where it is built
    for start in range(0, len(items), 700):  # several batches: the count must carry across them
        build.add(items[start : start + 700])
    array = build.arrays[0]
    server_bits = scheme.read_bits(client, key, layout)
    if not np.array_equal(server_bits, array.data):
        differing = int(np.count_nonzero(server_bits != array.data))
        return f"{differing} of {layout.nbytes} bytes differ from the server's"
    server_count = scheme.server_count(client, key)
    if server_count != array.count:
        return f"the client counts {array.count} items, the server {server_count}"
    if scheme is redisbloom:
        _cursor, header = client.execute_command("BF.SCANDUMP", key, 0)
        if layout.with_count(array.count) != header:
            return "the header the client would upload differs from the server's"
        return _may_upload(client, key, array.data)
    return None


def _may_upload(client: RedisClient, key: bytes, data: Any) -> str | None:
    """The upload's command, tried on the probe with its own bits (which changes nothing): a user
    denied BF.LOADCHUNK learns it now, not after the whole source was hashed (and `auto` builds on
    the server instead)."""
    from redis.exceptions import NoPermissionError

    try:
        redisbloom.upload_chunks(client, key, data, [0])
    except NoPermissionError as exc:
        return f"this user may not upload the bits ({str(exc).splitlines()[0][:120]})"
    return None
