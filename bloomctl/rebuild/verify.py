"""Rebuild step 5, verify: every sampled (or every) source item must be in its standby.

Pipelined MEXISTS (per shard, for a sharded filter); one miss fails the rebuild and nothing is
swapped.
"""

from __future__ import annotations

from collections.abc import Iterator

from bloomctl.backends import Backend
from bloomctl.defaults import DEFAULT_WINDOW
from bloomctl.errors import VerifyFailed
from bloomctl.keys import to_display
from bloomctl.lifecycle.routing import route
from bloomctl.server.client import RedisClient

VERIFY_BATCH = 1000
MAX_MISS_EXAMPLES = 5


def verify(
    client: RedisClient,
    backend: Backend,
    keys: bytes | list[bytes],
    items: Iterator[list[bytes]],
    *,
    window: int = DEFAULT_WINDOW,
) -> int:
    """Check that every item is in its filter (pipelined MEXISTS; with several keys, each item in
    its shard's). Returns the number checked; raises VerifyFailed on any miss."""
    targets = [keys] if isinstance(keys, bytes) else keys
    checked, misses = 0, 0
    examples: list[str] = []
    pipe = client.pipeline(transaction=False)
    queued: list[list[bytes]] = []

    def flush() -> None:
        nonlocal checked, misses
        for batch, reply in zip(queued, pipe.execute(), strict=True):
            checked += len(batch)
            for item, present in zip(batch, backend.parse_flags(reply), strict=True):
                if not present:
                    misses += 1
                    if len(examples) < MAX_MISS_EXAMPLES:
                        examples.append(to_display(item))
        queued.clear()

    for batch in items:
        groups = [batch] if len(targets) == 1 else route(batch, len(targets))
        for key, group in zip(targets, groups, strict=True):
            for start in range(0, len(group), VERIFY_BATCH):
                chunk = group[start : start + VERIFY_BATCH]
                pipe.execute_command(*backend.mexists_command(client, key, chunk))
                queued.append(chunk)
                if len(queued) >= window:
                    flush()
    if queued:
        flush()
    if misses:
        where = to_display(targets[0]) if len(targets) == 1 else f"the {len(targets)} shard standbys"
        raise VerifyFailed(
            "%s of %s checked items are missing from %r (e.g. %s): nothing swapped",
            f"{misses:,}",
            f"{checked:,}",
            where,
            ", ".join(repr(e) for e in examples),
        )
    return checked
