"""apply: make the server hold what bloomctl.toml declares, by creating what is missing, and
nothing else.

``apply`` plans, then creates. ``change_for`` compares a declared filter with the server (read
only) and says what ``apply`` would do: create it (a filter with a source by its first rebuild: an empty filter in front of a
database would answer "absent" for every real key; one the application feeds by a reserve; a
window by its settings and first buckets), rotate a window whose buckets are missing, or nothing.
A filter that differs from its declaration (drift) is reported with the command that resolves it:
apply never deletes, resizes or rebuilds a live filter. A first build that needs an optional
dependency this machine lacks (its SQL driver, pyarrow, numpy) is refused in the plan, with the
extra to install, as it would fail at the build.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from bloomctl.declared.config import Config, Declared
from bloomctl.declared.declarations import (
    declared_inputs,
    declared_recipe,
    drift,
    drift_fix,
    rebuild_defaults,
    recipe_drift,
    summarize,
    window_drift,
)
from bloomctl.declared.fleet import Connect, Fleet, Log, Outcome, no_log, reason
from bloomctl.errors import ExitCode, KeyMissing, StateConflict, first_line
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient

if TYPE_CHECKING:  # pragma: no cover - the library's heavier parts load when a filter is made
    from bloomctl.backends import Backend
    from bloomctl.backends.base import AnyPlan
    from bloomctl.lifecycle.single import ReserveResult
    from bloomctl.rebuild import RebuildReport
    from bloomctl.window.rotation import RotateReport
    from bloomctl.window.settings import WindowSpec

# how long a run waits for a filter another run is making, once its other filters are made
DEFAULT_LOCK_WAIT = 600.0
MEANWHILE = "made meanwhile by another run: nothing built here"
PROBE_CAPACITY = 1_000  # the capacity a plan is checked with while the real one is counted at the build

CREATE, ROTATE, DRIFT, UNCHANGED, CONFLICT = "create", "rotate", "drift", "unchanged", "conflict"
INVALID, ERROR = "invalid", "error"  # a declaration the server refuses; a server that did not answer
BUILD, RESERVE, WINDOW = "rebuild", "reserve", "window"  # how a missing filter is made

# A declared filter's first build: given the client, server, key, source values and rebuild options, its report.
Build = Callable[[RedisClient, ServerInfo, str, dict[str, Any], dict[str, Any]], "RebuildReport"]


@dataclass(frozen=True)
class Change:
    decl: Declared
    action: str  # create, rotate, drift, unchanged, conflict
    detail: str
    how: str | None = None  # create: rebuild, reserve or window
    fix: str | None = None  # drift, conflict: what resolves it
    code: int | None = None  # invalid: its exit code, when not a usage error

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
    """What apply does with ``decl`` on this server (nothing is written, not even the function library)."""
    from bloomctl.backends.library import installs_nothing

    with installs_nothing():
        if decl.kind == "windowed":
            return _window_change(client, server, decl, path)
        return _filter_change(client, server, decl, path)


def _filter_change(client: RedisClient, server: ServerInfo, decl: Declared, path: str) -> Change:
    from bloomctl.lifecycle import front as lifecycle

    try:
        description = lifecycle.describe(client, decl.key)
        summary = summarize(description)
    except KeyMissing:
        return _creation(server, decl)
    except StateConflict as exc:
        return Change(decl, CONFLICT, str(exc), fix="move that key away, or declare another key")
    members = getattr(description, "shards", None) or ()
    absent = [str(i) for i, member in enumerate(members) if member is None]
    if absent:
        return Change(
            decl,
            CONFLICT,
            f"sharded filter: member(s) {', '.join(absent)} of {len(members)} missing",
            fix="restore the missing members from a dump, or rebuild it",
        )
    diffs = drift(decl, summary)
    recipe = recipe_drift(decl, summary)
    if recipe is not None:
        diffs.append(recipe)
    if not diffs:
        return Change(decl, UNCHANGED, "as declared")
    return Change(decl, DRIFT, "; ".join(d.describe() for d in diffs), fix=drift_fix(decl, path, diffs))


def _creation(server: ServerInfo, decl: Declared) -> Change:
    """The creation of a missing filter, checked as far as can be before anything is written (a
    plan the server refuses, a database URL that is not set)."""
    from bloomctl import backends
    from bloomctl.declared.declarations import extras_of, source_values
    from bloomctl.errors import UnsupportedServer, UsageError

    try:
        if decl.source:
            values = source_values(decl)
            backends.choose(server, decl.backend, decl.filter_type)  # a backend the server lacks is refused
            # the plan as far as it is known (an auto capacity is counted at the build): a backend
            # that cannot hold it (a bitmap filter that would grow) is refused now, not at the build
            declared_plan(server, replace(decl, capacity=decl.capacity or PROBE_CAPACITY))
            path = values.get("csv_path") or values.get("parquet_path")
            if path and not os.access(path, os.R_OK):
                raise UsageError("the source %r cannot be read (missing, or not readable)", path)
            missing = extras_of(decl).missing
            if missing is not None:
                detail, fix = f"missing, and cannot be built here: {missing}", missing.install or "install its driver"
                return Change(decl, INVALID, detail, fix=fix, code=missing.exit_code)
            kind = next(k for k in ("csv", "parquet", "sql") if k in decl.source)
            return Change(decl, CREATE, f"missing: its first build, from the {kind} source", BUILD)
        declared_plan(server, decl)
        return Change(decl, CREATE, f"missing: reserve {_parameters(decl)}", RESERVE)
    except (UsageError, UnsupportedServer) as exc:
        return Change(decl, INVALID, f"missing, and cannot be created as declared: {exc}", fix="correct the file")


def _parameters(decl: Declared) -> str:
    parts = [decl.filter_type, f"capacity {decl.capacity:,}" if decl.capacity else "capacity auto"]
    if decl.error_rate is not None:
        from bloomctl.sizing.bloom import format_rate

        parts.append(f"error rate {format_rate(decl.error_rate)}")
    if decl.shards:
        parts.append(f"{decl.shards} shards")
    return ", ".join(parts)


def _window_change(client: RedisClient, server: ServerInfo, decl: Declared, path: str) -> Change:
    from bloomctl import window

    try:
        spec = window.read_window(client, decl.key)
    except KeyMissing:
        from bloomctl.errors import UnsupportedServer, UsageError

        period, keep = decl.window["period"], decl.window["keep"]
        try:
            window_spec(server, decl)
        except (UsageError, UnsupportedServer) as exc:
            return Change(decl, INVALID, f"missing, and cannot be created as declared: {exc}", fix="correct the file")
        return Change(decl, CREATE, f"missing: a window of {keep} x {period} buckets", WINDOW)
    except StateConflict as exc:
        return Change(decl, CONFLICT, str(exc), fix="move that key away, or declare another key")
    diffs = window_drift(decl, spec)
    if diffs:
        return Change(decl, DRIFT, "; ".join(d.describe() for d in diffs), fix=drift_fix(decl, path, diffs))
    try:
        report = window.rotate(client, server, decl.key, dry_run=True, remove_strays=False)
    except StateConflict as exc:  # a key at a bucket's name that is not the window's
        return Change(decl, CONFLICT, str(exc), fix="move that key away")
    made = [a for a in report.actions if a.action == "created"]
    if made:
        return Change(decl, ROTATE, f"{len(made)} bucket(s) to make", WINDOW)
    return Change(decl, UNCHANGED, "as declared")


def declared_plan(server: ServerInfo, decl: Declared) -> tuple[Backend, AnyPlan]:
    """The backend and plan of a filter the application feeds (``reserve``'s, from the declaration)."""
    from bloomctl import backends

    if decl.shards is None:  # the plan as this server builds it
        return backends.plan_reserve(server, decl.backend, functools.partial(_plan_for, decl), decl.filter_type)
    chosen = backends.choose(server, decl.backend, decl.filter_type)  # each member's share is checked when made
    return chosen, _plan_for(decl, chosen)


def _plan_for(decl: Declared, chosen: Backend) -> AnyPlan:
    from bloomctl.backends import cuckoo_plan_for
    from bloomctl.sizing.bloom import plan

    assert decl.capacity is not None  # the file's checks give a filter without a source a number
    if chosen.kind == "cuckoo":
        cuckoo = {
            "bucket_size": decl.bucket_size,
            "max_iterations": decl.max_iterations,
            "fingerprint_bits": decl.fingerprint_bits,
        }
        return cuckoo_plan_for(
            chosen.name, decl.capacity, decl.error_rate, decl.expansion, decl.nonscaling, cuckoo, None, None
        )
    assert decl.error_rate is not None
    return plan(decl.capacity, decl.error_rate, chosen.expansion_for(decl.expansion, decl.nonscaling))


def reserve(client: RedisClient, server: ServerInfo, decl: Declared) -> ReserveResult:
    """Create a filter the application feeds, as declared (a filter made meanwhile with the same
    parameters is accepted)."""
    from bloomctl.lifecycle import front as lifecycle

    chosen, the_plan = declared_plan(server, decl)
    return lifecycle.reserve(
        client, server, decl.key, the_plan, shards=decl.shards, if_not_exists=True, backend=chosen.name
    )


def window_spec(server: ServerInfo, decl: Declared) -> WindowSpec:
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


def make_window(client: RedisClient, server: ServerInfo, decl: Declared) -> RotateReport:
    """Create the declared window where it is missing (the same one there is accepted), then make
    its current and coming buckets (nothing removed: stray old buckets are `window rotate`'s). The
    rotation's report."""
    from bloomctl import window

    window.create(client, server, window_spec(server, decl), if_not_exists=True)
    return window.rotate(client, server, decl.key, remove_strays=False)


# --- the run: the plan of every declared filter, then the creations ---------------------------------


@dataclass(frozen=True)
class Created:
    """What came of making one missing filter: done, or why not (with its exit code); ``held_by``,
    the other run that held its lock when this one first came to it."""

    done: bool
    text: str  # what was made, or the error
    exit_code: int = 0
    held_by: str | None = None

    @property
    def elsewhere(self) -> bool:
        """Made by another run while this one planned or waited."""
        return self.done and self.text.startswith("made meanwhile")

    def as_dict(self) -> dict[str, Any]:
        held = {"held_by": self.held_by} if self.held_by else {}
        if self.done:
            return {"done": True, "message": self.text, "exit_code": self.exit_code, **held}
        return {"done": False, "error": self.text, "exit_code": self.exit_code, **held}


@dataclass
class Applied:
    """An ``apply`` run: each declared filter's change, what came of each creation, and the codes."""

    config: str
    dry_run: bool
    changes: list[Change] = field(default_factory=list)
    created: dict[str, Created] = field(default_factory=dict)  # by the filter's name
    codes: dict[str, int] = field(default_factory=dict)  # a problem's exit code, by the filter's name

    @property
    def exit_code(self) -> int:
        """The first problem's code, in the file's order (0: everything missing was created)."""
        return next((self.codes[c.decl.name] for c in self.changes if self.codes.get(c.decl.name)), ExitCode.OK)

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "dry_run": self.dry_run,
            "changes": [
                {
                    **c.as_dict(),
                    **({"result": self.created[c.decl.name].as_dict()} if c.decl.name in self.created else {}),
                }
                for c in self.changes
            ],
            "exit_code": int(self.exit_code),
        }


def run(
    config: Config,
    connect: Connect,
    names: list[str] | None = None,
    *,
    dry_run: bool = False,
    build: Build,
    log: Log = no_log,
    describe: Callable[[BaseException], str] = first_line,
    lock_wait: float = DEFAULT_LOCK_WAIT,
) -> Applied:
    """The plan of every (named) declared filter, then, unless ``dry_run``, each missing one made,
    one at a time. A server that does not answer, or a creation that fails, is that filter's
    problem: the others are still planned and made. ``build`` runs a first build from the source;
    ``describe`` words a failed creation's error; ``lock_wait``, how long to wait for a filter
    another run is making (``create``)."""
    fleet = Fleet(config.select(names), connect)
    applied = Applied(config.path, dry_run)
    for outcome in fleet.each(lambda client, server, decl: change_for(client, server, decl, config.path)):
        decl, failure = outcome.decl, outcome.failure
        if failure is None and outcome.value is not None:
            applied.changes.append(outcome.value)
        elif failure is not None:  # this filter says why; the other filters are still planned
            applied.codes[decl.name] = failure.exit_code
            detail = reason(failure) if outcome.reached else f"profile {decl.profile!r}: {reason(failure)}"
            applied.changes.append(Change(decl, ERROR, detail))
    if not dry_run:
        applied.created = create(
            fleet, applied.changes, build=build, log=log, describe=describe, lock_wait=lock_wait, path=config.path
        )
        applied.codes.update({name: made.exit_code for name, made in applied.created.items()})
    for change in applied.changes:
        if change.action == CONFLICT:
            applied.codes[change.decl.name] = ExitCode.CONFLICT
        elif change.action == INVALID:
            applied.codes[change.decl.name] = change.code or ExitCode.USAGE
    return applied


def create(
    fleet: Fleet,
    changes: list[Change],
    *,
    build: Build,
    log: Log = no_log,
    describe: Callable[[BaseException], str] = first_line,
    lock_wait: float = DEFAULT_LOCK_WAIT,
    path: str = "bloomctl.toml",
) -> dict[str, Created]:
    """Make each missing filter (or window's buckets) of the plan; each one's outcome, a failure
    included (the others go on). A filter whose lock another run holds (another apply, a rebuild)
    is put off until the others are made, then waited for, ``lock_wait`` seconds at most: made
    meanwhile by that run, it is reported so and not built again; still missing once the lock is
    free, it is made here. ``path`` names the file in what resolves a conflict."""
    from bloomctl.errors import LockHeld
    from bloomctl.keys import KeyFamily
    from bloomctl.lifecycle.lock import describe_holder

    wanted = {c.decl.name: c for c in changes if c.action in (CREATE, ROTATE)}
    held: dict[str, str] = {}  # by the filter's name: the run that held its lock at the first try

    def make(client: RedisClient, server: ServerInfo, decl: Declared, *, wait: float = 0.0) -> str:
        change = wanted[decl.name]
        if not wait:
            log(f"apply: {decl.name}: {change.detail}", {"filter": decl.name, "action": change.action}, "info")
        try:
            return _make(client, server, change, build, wait, path)
        except LockHeld:
            if not wait:
                raw = client.get(KeyFamily.of(decl.key).lock)
                held[decl.name] = describe_holder(raw) if raw is not None else "another run, which just released it"
            raise

    created: dict[str, Created] = {}
    for outcome in fleet.each(make, [c.decl for c in wanted.values()]):
        name = outcome.decl.name
        if name in held:
            log(
                f"apply: {name}: another run holds it ({held[name]}): waiting for it after the others",
                {"filter": name, "held_by": held[name]},
                "info",
            )
        else:
            created[name] = _outcome(outcome, describe, log)
    waiting = functools.partial(make, wait=lock_wait)
    for outcome in fleet.each(waiting, [wanted[name].decl for name in held]):
        created[outcome.decl.name] = replace(_outcome(outcome, describe, log), held_by=held[outcome.decl.name])
    return {name: created[name] for name in wanted}  # in the file's order


def _outcome(outcome: Outcome[str], describe: Callable[[BaseException], str], log: Log) -> Created:
    name = outcome.decl.name
    if outcome.failure is None:
        return Created(True, outcome.value or "")
    text = describe(outcome.failure.exception)
    log(f"apply: {name}: {text}", {"filter": name}, "error")
    return Created(False, text, outcome.failure.exit_code)


def _make(client: RedisClient, server: ServerInfo, change: Change, build: Build, lock_wait: float, path: str) -> str:
    """Make one missing filter as its change says; what was done. A filter that another run made
    since the plan is left as that run made it, once that run is done with it (``made_meanwhile``)."""
    from bloomctl.errors import MadeMeanwhile

    decl = change.decl
    if change.how == RESERVE:
        result = reserve(client, server, decl)
        return "created" if result.created else "made meanwhile by another run, as declared: nothing created here"
    if change.how == WINDOW:
        report = make_window(client, server, decl)
        made = sum(a.action == "created" for a in report.actions)
        return f"window ready, {made} bucket(s) made"
    if client.exists(decl.key):  # before the source is read: its build would be refused under the lock
        return made_meanwhile(client, server, decl, path, lock_wait)
    # its first build is swapped in, whatever rebuild.swap says: there is no filter to keep; and
    # under the lock it checks again that no other run made it meanwhile
    source, options = declared_inputs(decl, rebuild_defaults(), {"swap": True})
    options.update(only_if_missing=True, lock_command="bloomctl apply", lock_wait=lock_wait)
    try:
        rebuilt = build(client, server, decl.key, source, options)
    except MadeMeanwhile:
        return made_meanwhile(client, server, decl, path, lock_wait)
    return f"built from its source: {rebuilt.source.items:,} items, swapped in"


def built_from_its_source(client: RedisClient, decl: Declared) -> bool:
    """Whether a rebuild from the declared source made the filter at ``decl``'s key: its
    metadata (each member's) records that recipe and a finished build. A filter made otherwise
    matches its declaration's parameters all the same (they are all a plan can judge)."""
    from bloomctl.lifecycle import front as lifecycle
    from bloomctl.lifecycle.metadata import LOADED, RECIPE, VERIFIED
    from bloomctl.lifecycle.sharded import ShardedDescription

    description = lifecycle.describe(client, decl.key)
    if isinstance(description, ShardedDescription):
        metas = [member.metadata for member in description.shards if member is not None]
    else:
        metas = [description.metadata]
    recipe = declared_recipe(decl)
    return all((meta or {}).get(RECIPE) == recipe and (meta or {}).get("state") in (VERIFIED, LOADED) for meta in metas)


def made_meanwhile(client: RedisClient, server: ServerInfo, decl: Declared, path: str, lock_wait: float) -> str:
    """A key that appeared at a declared filter's name after the plan: judged once no run holds
    its lock (a run still making it raises LockHeld, and is waited for), as the plan judges a
    filter. Made as declared, it is reported as made by another run; anything else (another
    filter, a sharded filter whose members a failed run left missing, someone else's key) is
    refused, exit 5: apply builds nothing over a key it did not plan to replace."""
    from bloomctl.lifecycle.lock import FilterLock

    with FilterLock(client, decl.key, command="bloomctl apply", wait=lock_wait):
        change = change_for(client, server, decl, path)
        built = change.action == UNCHANGED and built_from_its_source(client, decl)
    if built:
        return MEANWHILE
    if change.action == UNCHANGED:  # the application's own BF.RESERVE, an auto-created filter: empty
        raise StateConflict(
            "%r appeared meanwhile as declared, but no rebuild from its source made it (every source item "
            "would be missing): nothing built over it; resolve: %s",
            decl.key,
            drift_fix(decl, path, []),
        )
    fix = f"; resolve: {change.fix}" if change.fix else ""
    if change.action == CREATE:
        raise StateConflict("%r appeared and went again while it was being made: run apply again", decl.key)
    raise StateConflict("%r was made meanwhile, not as declared: %s%s", decl.key, change.detail, fix)
