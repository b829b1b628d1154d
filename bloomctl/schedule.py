"""When a declared filter is due: ``bloomctl rebuild --all --due`` (one crontab line for an application).

A filter with a source is due when it is missing (its first build), when its last build is older
than ``rebuild.every`` (the ``created_at`` of the active filter's metadata: when the run that built
it started), or when its fill is above ``rebuild.when_fill_above``. A windowed filter is rotated on
every run (rotation is idempotent). A filter the application feeds (no source) is never rebuilt.
Nothing here writes to a server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from bloomctl.client import RedisClient
from bloomctl.config import Declared
from bloomctl.declarations import every_seconds, summarize
from bloomctl.errors import KeyMissing, StateConflict

REBUILD, ROTATE, SKIP = "rebuild", "rotate", "skip"


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
    from bloomctl import lifecycle

    try:
        summary = summarize(lifecycle.describe(client, decl.key))
    except KeyMissing:
        return Decision(decl, REBUILD, "missing: its first build")
    except StateConflict:  # the rebuild says what is wrong, and exits with its code
        return Decision(decl, REBUILD, "the key holds no filter")
    if not only_due:
        return Decision(decl, REBUILD, "every filter (--all without --due)")
    moment = time.time() if now is None else now
    reasons, waits = [], []
    every = every_seconds(decl)
    if every is not None:
        made = built_at(summary.metadata)
        if made is None:
            reasons.append("no record of when it was built")
        elif moment - made >= every:
            reasons.append(f"built {ago(moment - made)} ago, due every {ago(every)}")
        else:
            waits.append(f"built {ago(moment - made)} ago, due in {ago(made + every - moment)}")
    above = decl.rebuild.get("when_fill_above")
    if above is not None:
        fill = summary.state.fill_ratio
        if fill > above:
            reasons.append(f"fill {fill:.1%} above {above:.1%}")
        else:
            waits.append(f"fill {fill:.1%} of {above:.1%}")
    if reasons:
        return Decision(decl, REBUILD, "; ".join(reasons))
    if not waits:
        return Decision(decl, SKIP, "no schedule declared (rebuild.every or rebuild.when_fill_above)")
    return Decision(decl, SKIP, "not due: " + "; ".join(waits))
