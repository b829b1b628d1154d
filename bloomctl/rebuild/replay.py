"""Rebuild step 5b, cuckoo filters: replay the adds and deletes the application made during the load.

While a cuckoo standby loads, the application's dual writes (``bloomctl_cf_dual``) reach the
active filter at once and an operation log beside the standby (``{KEY}:standby:log``), not the
standby: a delete sent to the standby before the rebuild has inserted that item would remove
whatever fingerprint sits in its buckets, maybe another item's. Once every source item is in,
this step replays the log in order, knowing exactly which items the standby holds (the source's,
from the rebuild's de-duplication, and the copies the log has added): ``decide`` says which
entries to apply.
The last batch switches the standby to direct dual writes in the same atomic step.
"""

from __future__ import annotations

from dataclasses import dataclass

from bloomctl.backends.library import Library
from bloomctl.errors import StateConflict
from bloomctl.lifecycle.standby import Standbys
from bloomctl.rebuild.dedupe import Seen
from bloomctl.rebuild.options import Events
from bloomctl.server.client import RedisClient

REPLAY_BATCH = 1000  # log entries per call at first: each replayed entry is one insert or delete on the server
MAX_ROUNDS = 10_000  # calls before a replay that cannot catch up gives up


@dataclass
class Copies:
    """What the log has done to one item in the standby so far: its copies there, and whether a
    ``+`` for it was already taken as the source's own copy."""

    count: int
    in_source: bool
    matched: bool = False


def decide(entries: list[bytes], seen: Seen, view: dict[bytes, Copies]) -> list[bytes]:
    """The entries to apply, in order. A cuckoo filter counts copies, as the active filter does:
    every add is a copy, every delete removes one. The source holds each item once; its first add in
    the log may be the very add the source's export already saw (skipped: the rebuild inserted it),
    every later add is one more copy; a delete is applied while the standby holds a copy (a delete
    of one it does not hold could remove another item's fingerprint)."""
    unknown = list(dict.fromkeys(entry[1:] for entry in entries if entry[1:] not in view))
    for item, present in zip(unknown, seen.contains(unknown), strict=True):
        view[item] = Copies(int(present), present)
    applied = []
    for entry in entries:
        op, item = entry[:1], entry[1:]
        copies = view[item]
        if op == b"+":
            if copies.in_source and not copies.matched:
                copies.matched = True  # the source's copy is this add's
                continue
            copies.count += 1
            applied.append(entry)
        elif copies.count > 0:
            copies.count -= 1
            applied.append(entry)
    return applied


def replay(client: RedisClient, standbys: Standbys, seen: Seen, log: Events, max_batch: int = REPLAY_BATCH) -> int:
    """Apply the log to the standby until it is empty; returns the entries read. Batches grow (up to
    ``max_batch``, the backend's items per call) while the application writes faster than the
    replay reads; a replay that still cannot catch up stops the rebuild."""
    import redis

    family = standbys.targets.families[0]
    library = Library()
    view: dict[bytes, Copies] = {}
    read, rounds, batch = 0, 0, min(REPLAY_BATCH, max_batch)
    keys = [family.standby, family.standby_meta, family.standby_log, standbys.lock.lock_key]
    while True:
        standbys.lock.check()
        entries = client.lrange(family.standby_log, 0, batch - 1)
        ops = decide(list(entries), seen, view)
        try:
            left = int(
                library.call_keys(
                    client, "cf_replay", keys, standbys.generation, standbys.lock.token, len(entries), *ops
                )
            )
        except redis.exceptions.ResponseError as exc:
            text = str(exc)
            raise StateConflict(
                "replaying the writes made during the rebuild failed: %s", text.split("BLOOMCTL", 1)[-1].strip()
            ) from None
        read += len(entries)
        if left == 0:
            break
        rounds += 1
        if len(entries) == batch:
            batch = min(2 * batch, max(max_batch, REPLAY_BATCH))
        if rounds >= MAX_ROUNDS:
            raise StateConflict(
                "the application writes faster than the rebuild can replay its writes (%s replayed, %s waiting): "
                "nothing swapped; run the rebuild at a quieter time",
                f"{read:,}",
                f"{left:,}",
            )
    if read:
        log(
            f"replayed {read:,} adds and deletes the application made during the load",
            {"phase": "replay", "entries": read},
        )
    return read
