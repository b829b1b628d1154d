"""Rebuild step 5b, cuckoo filters: replay the adds and deletes the application made during the load.

While a cuckoo standby loads, the application's dual writes (``bloomctl_cf_dual``) reach the
active filter at once and an operation log beside the standby (``{KEY}:standby:log``), not the
standby: a delete sent to the standby before the rebuild has inserted that item would remove
whatever fingerprint sits in its buckets, maybe another item's. Once every source item is in,
this step replays the log in order, knowing exactly which items the standby holds (the source's,
from the rebuild's de-duplication, and the log's own adds): an add of an item the standby has
is skipped (the rebuild inserts each item once), a delete of one it does not have is skipped.
The last batch switches the standby to direct dual writes in the same atomic step.
"""

from __future__ import annotations

from bloomctl.backends.library import Library
from bloomctl.client import RedisClient
from bloomctl.dedupe import Seen
from bloomctl.errors import StateConflict
from bloomctl.rebuild.options import Events
from bloomctl.rebuild.standby import Standbys

REPLAY_BATCH = 1000  # log entries per call: each replayed entry is one insert or delete on the server


def decide(entries: list[bytes], seen: Seen, view: dict[bytes, bool]) -> list[bytes]:
    """The entries to apply, in order; ``view`` holds what the log has changed so far (an item's
    presence in the standby), the rest is the source's."""
    unknown = [entry[1:] for entry in entries if entry[1:] not in view]
    for item, present in zip(unknown, seen.contains(unknown), strict=True):
        view.setdefault(item, present)
    applied = []
    for entry in entries:
        op, item = entry[:1], entry[1:]
        present = view[item]
        if op == b"+" and not present:
            view[item] = True
            applied.append(entry)
        elif op == b"-" and present:
            view[item] = False
            applied.append(entry)
    return applied


def replay(client: RedisClient, standbys: Standbys, seen: Seen, log: Events) -> int:
    """Apply the log to the standby until it is empty; returns the entries read."""
    import redis

    family = standbys.targets.families[0]
    library = Library()
    view: dict[bytes, bool] = {}
    read = 0
    keys = [family.standby, family.standby_meta, family.standby_log, standbys.lock.lock_key]
    while True:
        standbys.lock.check()
        entries = client.lrange(family.standby_log, 0, REPLAY_BATCH - 1)
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
    if read:
        log(
            f"replayed {read:,} adds and deletes the application made during the load",
            {"phase": "replay", "entries": read},
        )
    return read
