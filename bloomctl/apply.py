"""apply: make the server hold what bloomctl.toml declares, by creating what is missing, and
nothing else.

``changes`` compares each declared filter with the server (read only) and says what ``apply``
would do: create it (a filter with a source by its first rebuild: an empty filter in front of a
database would answer "absent" for every real key; one the application feeds by a reserve; a
window by its settings and first buckets), rotate a window whose buckets are missing, or nothing.
A filter that differs from its declaration (drift) is reported with the command that resolves it:
apply never deletes, resizes or rebuilds a live filter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bloomctl.client import RedisClient
from bloomctl.config import Declared
from bloomctl.declarations import drift, recipe_drift, summarize, window_drift
from bloomctl.errors import KeyMissing, StateConflict
from bloomctl.server import ServerInfo

CREATE, ROTATE, DRIFT, UNCHANGED, CONFLICT = "create", "rotate", "drift", "unchanged", "conflict"
BUILD, RESERVE, WINDOW = "rebuild", "reserve", "window"  # how a missing filter is made


@dataclass(frozen=True)
class Change:
    decl: Declared
    action: str  # create, rotate, drift, unchanged, conflict
    detail: str
    how: str | None = None  # create: rebuild, reserve or window
    fix: str | None = None  # drift, conflict: what resolves it

    def as_dict(self) -> dict[str, Any]:
        return {
            "filter": self.decl.name,
            "key": self.decl.key,
            "action": self.action,
            "detail": self.detail,
            "how": self.how,
            "fix": self.fix,
        }


def change_for(client: RedisClient, server: ServerInfo, decl: Declared, path: str) -> Change:
    """What apply does with ``decl`` on this server (nothing is written)."""
    if decl.kind == "windowed":
        return _window_change(client, server, decl, path)
    from bloomctl import lifecycle

    try:
        summary = summarize(lifecycle.describe(client, decl.key))
    except KeyMissing:
        if decl.source:
            kind = next(k for k in ("csv", "parquet", "sql") if k in decl.source)
            return Change(decl, CREATE, f"missing: its first build, from the {kind} source", BUILD)
        return Change(decl, CREATE, f"missing: reserve {_parameters(decl)}", RESERVE)
    except StateConflict as exc:
        return Change(decl, CONFLICT, str(exc), fix="move that key away, or declare another key")
    diffs = drift(decl, summary)
    recipe = recipe_drift(decl, summary)
    if recipe is not None:
        diffs.append(recipe)
    if not diffs:
        return Change(decl, UNCHANGED, "as declared")
    text = "; ".join(d.describe() for d in diffs)
    if all(d.rebuildable for d in diffs) and decl.source:
        option = " --allow-recipe-change" if recipe is not None else ""
        return Change(decl, DRIFT, text, fix=f"bloomctl --config {path} rebuild {decl.name}{option}")
    if all(d.rebuildable for d in diffs):
        return Change(
            decl, DRIFT, text, fix="the application feeds it: reserve a new key, or declare what the server has"
        )
    return Change(
        decl, DRIFT, text, fix="a rebuild cannot change this: build the filter under a new key, or declare what it is"
    )


def _parameters(decl: Declared) -> str:
    parts = [decl.filter_type, f"capacity {decl.capacity:,}" if decl.capacity else "capacity auto"]
    if decl.error_rate is not None:
        from bloomctl.planner import format_rate

        parts.append(f"error rate {format_rate(decl.error_rate)}")
    if decl.shards:
        parts.append(f"{decl.shards} shards")
    return ", ".join(parts)


def _window_change(client: RedisClient, server: ServerInfo, decl: Declared, path: str) -> Change:
    from bloomctl import window

    try:
        spec = window.read_window(client, decl.key)
    except KeyMissing:
        period, keep = decl.window["period"], decl.window["keep"]
        return Change(decl, CREATE, f"missing: a window of {keep} x {period} buckets", WINDOW)
    except StateConflict as exc:
        return Change(decl, CONFLICT, str(exc), fix="move that key away, or declare another key")
    diffs = window_drift(decl, spec)
    if diffs:
        return Change(
            decl,
            DRIFT,
            "; ".join(d.describe() for d in diffs),
            fix="a window keeps its settings: create it under a new name, or declare what it is",
        )
    try:
        report = window.rotate(client, server, decl.key, dry_run=True)
    except StateConflict as exc:  # a key at a bucket's name that is not the window's
        return Change(decl, CONFLICT, str(exc), fix="move that key away")
    made = [a for a in report.actions if a.action == "created"]
    if made:
        return Change(decl, ROTATE, f"{len(made)} bucket(s) to make", WINDOW)
    return Change(decl, UNCHANGED, "as declared")


def declared_plan(server: ServerInfo, decl: Declared) -> tuple[Any, Any]:
    """The backend and plan of a filter the application feeds (``reserve``'s, from the declaration)."""
    from bloomctl import backends
    from bloomctl.cuckoo_planner import plan_for
    from bloomctl.planner import plan

    assert decl.capacity is not None  # (the file's checks: a filter without a source has a number)
    chosen = backends.choose(server, decl.backend, decl.filter_type)
    if chosen.kind == "cuckoo":
        cuckoo = {
            "bucket_size": decl.bucket_size,
            "max_iterations": decl.max_iterations,
            "fingerprint_bits": decl.fingerprint_bits,
        }
        return chosen, plan_for(
            chosen.name, decl.capacity, decl.error_rate, decl.expansion, decl.nonscaling, cuckoo, None, server.line
        )
    assert decl.error_rate is not None
    the_plan = plan(decl.capacity, decl.error_rate, chosen.expansion_for(decl.expansion, decl.nonscaling))
    if decl.shards is None:
        the_plan = chosen.bloom_plan(chosen.check_plan(the_plan, server.line))
    return chosen, the_plan


def reserve(client: RedisClient, server: ServerInfo, decl: Declared) -> Any:
    """Create a filter the application feeds, as declared (a filter made meanwhile with the same
    parameters is accepted)."""
    from bloomctl import lifecycle

    chosen, the_plan = declared_plan(server, decl)
    return lifecycle.reserve(
        client, server, decl.key, the_plan, shards=decl.shards, if_not_exists=True, backend=chosen.name
    )


def window_spec(server: ServerInfo, decl: Declared) -> Any:
    from bloomctl import window

    settings = decl.window
    kind = settings.get("type", "bloom")
    extra: dict[str, Any] = {}
    if decl.headroom is not None:
        extra["headroom"] = float(decl.headroom)
    if "ahead" in settings:
        extra["ahead"] = settings["ahead"]
    return window.new_window(
        server,
        decl.key,
        period=settings["period"],
        keep=settings["keep"],
        capacity=decl.capacity,
        min_capacity=decl.min_capacity,
        error_rate=decl.error_rate,
        kind=kind,
        backend=decl.backend,
        expansion=decl.expansion,
        nonscaling=decl.nonscaling,
        bucket_size=decl.bucket_size,
        max_iterations=decl.max_iterations,
        fingerprint_bits=decl.fingerprint_bits,
        **extra,
    )


def make_window(client: RedisClient, server: ServerInfo, decl: Declared) -> Any:
    """Create the declared window where it is missing (the same one there is accepted), then rotate
    it: its current and coming buckets made. The rotation's report."""
    from bloomctl import window

    window.create(client, server, window_spec(server, decl), if_not_exists=True)
    return window.rotate(client, server, decl.key)
