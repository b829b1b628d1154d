"""When a declared filter is due: ``bloomctl rebuild --all --due`` (one crontab line for an application).

A filter with a source is due when it is missing (its first build, or a sharded filter's member),
was never built from its source (reserved, say), when its last build is older than
``rebuild.every`` (the ``created_at`` of the active filter's metadata, stamped as the run that
built it began its load; met from 95% of the period, so that a daily job stays daily), or when it
is fuller than ``rebuild.when_fill_above`` (a cuckoo filter: also when it has grown). A windowed filter is rotated on
every run (rotation is idempotent). A filter the application feeds (no source) is never rebuilt.
Nothing here writes to a server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from bloomctl.declared.config import Declared
from bloomctl.declared.declarations import every_seconds, summarize
from bloomctl.errors import KeyMissing, StateConflict
from bloomctl.lifecycle.metadata import LOADED, RECIPE, VERIFIED
from bloomctl.server.client import RedisClient

REBUILD, ROTATE, SKIP = "rebuild", "rotate", "skip"
FIRST_BUILD = "missing: its first build"
SLACK, MAX_SLACK = 0.05, 3600.0  # `every` is met from 95% of it (at most an hour early): a daily job stays daily


@dataclass(frozen=True)
class Decision:
    decl: Declared
    action: str  # rebuild, rotate, skip
    reason: str


def built_at(metadata: dict[str, str]) -> float | None:
    """When the filter was made (its metadata's ``created_at``), in seconds since the epoch."""
    text = metadata.get("created_at")
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def ago(seconds: float) -> str:
    """``3h 5m``, ``2d 4h``, ``40s``: a duration as a person reads it."""
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m"
    return f"{secs}s"


def decide(client: RedisClient, decl: Declared, *, only_due: bool = True, now: float | None = None) -> Decision:
    """What ``rebuild --all`` (``only_due``: ``--due``) does with ``decl``, and why."""
    if decl.kind == "windowed":
        return Decision(decl, ROTATE, "a window is rotated on every run")
    if not decl.source:
        return Decision(decl, SKIP, "fed by the application: no source to rebuild from")
    from bloomctl.backends.library import installs_nothing
    from bloomctl.lifecycle import front as lifecycle

    if decl.rebuild.get("swap") is False and only_due and _standby_waits(client, decl):
        return Decision(decl, SKIP, f"a verified standby waits for `bloomctl swap {decl.key}` (rebuild.swap = false)")
    try:
        with installs_nothing():  # deciding writes nothing
            description = lifecycle.describe(client, decl.key)
        summary = summarize(description)
    except KeyMissing:
        return Decision(decl, REBUILD, FIRST_BUILD)
    except StateConflict:  # the rebuild says what is wrong, and exits with its code
        return Decision(decl, REBUILD, "the key holds no filter")
    members = getattr(description, "shards", None) or ()
    if any(member is None for member in members):
        return Decision(decl, REBUILD, "a member of the sharded filter is missing")
    if not only_due:
        return Decision(decl, REBUILD, "every filter (--all without --due)")
    if not summary.metadata.get(RECIPE):
        return Decision(decl, REBUILD, "never built from its source (no item recipe recorded)")
    moment = time.time() if now is None else now
    reasons, waits = [], []
    every = every_seconds(decl)
    if every is not None:
        made = built_at(summary.metadata)
        slack = min(every * SLACK, MAX_SLACK)  # a build stamped a little after its run started
        if made is None:
            reasons.append("no record of when it was built")
        elif made > moment + MAX_SLACK:
            reasons.append("its metadata says it was built in the future (a wrong clock)")
        elif moment - made >= every - slack:
            reasons.append(f"built {ago(moment - made)} ago, due every {ago(every)}")
        else:
            waits.append(f"built {ago(moment - made)} ago, due in {ago(made + every - slack - moment)}")
    above = decl.rebuild.get("when_fill_above")
    if above is not None:
        state = summary.state
        fill = state.fill_ratio
        if state.kind == "cuckoo" and state.filters > 1:  # (its load is over every sub-filter: growing lowers it)
            reasons.append(f"grew to {state.filters} sub-filters")
        elif fill > above:
            reasons.append(f"fill {fill:.1%} above {above:.1%}")
        else:
            waits.append(f"fill {fill:.1%} of {above:.1%}")
    if reasons:
        return Decision(decl, REBUILD, "; ".join(reasons))
    if not waits:
        return Decision(decl, SKIP, "no schedule declared (rebuild.every or rebuild.when_fill_above)")
    return Decision(decl, SKIP, "not due: " + "; ".join(waits))


def _standby_waits(client: RedisClient, decl: Declared) -> bool:
    """Whether a verified standby is there, waiting for its swap (a sharded filter's: every member's)."""
    from bloomctl.keys import KeyFamily
    from bloomctl.lifecycle.manifest import read_manifest
    from bloomctl.lifecycle.metadata import read_metadata

    try:
        manifest = read_manifest(client, decl.key)
        families = manifest.families if manifest is not None else [KeyFamily.of(decl.key)]
        for family in families:
            if read_metadata(client, family.standby_meta).get("state") not in (VERIFIED, LOADED):
                return False
            if not client.exists(family.standby):
                return False
    except StateConflict:
        return False
    return True
