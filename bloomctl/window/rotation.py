"""Rotating a window: the coming buckets made ahead of time, every bucket's expiry set, strays removed.

``rotate`` runs from cron. It pre-creates the current bucket and the next ``ahead`` ones, sized from
the recent ones, so that an application never writes into a missing bucket and never makes one.
Old buckets are never deleted one item at a time: each carries an EXPIREAT at the moment it
leaves the window, and drops itself.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

from bloomctl import backends
from bloomctl.backends import Backend
from bloomctl.backends.base import AnyPlan
from bloomctl.errors import OutOfMemory, StateConflict
from bloomctl.keys import to_display
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.sizing.cuckoo import DEFAULT_BUCKET_SIZE
from bloomctl.window.buckets import fitting_plan, holds, other_parameters
from bloomctl.window.periods import iso, server_time
from bloomctl.window.settings import WindowSpec, read_window

STRAY_LOOKBACK = 64  # bucket periods before the window that rotate looks at for strays


@dataclass
class BucketAction:
    index: int
    key: bytes
    label: str
    action: str  # created, kept, missing (a past bucket never made), expired (outside the window), foreign (not the window's filter)
    expire_at: int | None = None
    capacity: int | None = None
    size_bytes: int | None = None  # a bucket created: what it holds in memory, empty

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "key": to_display(self.key),
            "action": self.action,
            "expire_at": iso(self.expire_at),
            "capacity": self.capacity,
            "size_bytes": self.size_bytes,
        }


@dataclass
class RotateReport:
    spec: WindowSpec
    now: float
    current: int
    capacity: int
    capacity_basis: str
    actions: list[BucketAction] = field(default_factory=list)
    dry_run: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def current_was_missing(self) -> bool:
        return any(a.index == self.current and a.action == "created" for a in self.actions)

    def as_dict(self) -> dict[str, Any]:
        return {
            "window": to_display(self.spec.name),
            "now": iso(self.now),
            "current": self.spec.label(self.current),
            "capacity": self.capacity,
            "capacity_basis": self.capacity_basis,
            "current_was_missing": self.current_was_missing,
            "dry_run": self.dry_run,
            "warnings": self.warnings,
            "buckets": [a.as_dict() for a in self.actions],
        }


def plan_capacity(client: RedisClient, spec: WindowSpec, backend: Backend, current: int) -> tuple[int, str]:
    """The capacity of new buckets: fixed, or (auto) the most items a bucket of the window holds
    (the complete ones and the current one so far) x headroom, at least the minimum; for a cuckoo
    filter over the load at which its inserts start to fail."""
    if spec.capacity is not None:
        return spec.capacity, "fixed"
    counts = [  # a missing bucket, or a foreign key at a bucket's name, counts nothing
        backend.card(client, key)
        for key in (spec.key(index) for index in range(current - spec.keep + 1, current + 1))
        if backends.key_type(client, key) != b"none" and holds(client, key, backend)
    ]
    peak = max(counts, default=0)
    needed = peak * spec.headroom
    if spec.kind == "cuckoo":
        needed /= spec.plan_for(max(spec.min_capacity, 2 * (spec.bucket_size or DEFAULT_BUCKET_SIZE))).full_load  # type: ignore[union-attr]
    capacity = max(spec.min_capacity, math.ceil(needed))
    if capacity == spec.min_capacity:
        return capacity, f"the minimum (the most items in a recent bucket: {peak:,})"
    return capacity, f"the most items in a recent bucket ({peak:,}) x headroom {spec.headroom:g}"


def rotate(
    client: RedisClient,
    server: ServerInfo,
    name: str | bytes,
    *,
    dry_run: bool = False,
    now: float | None = None,
    remove_strays: bool = True,
    spec: WindowSpec | None = None,
) -> RotateReport:
    """Make the current bucket and the next ``ahead`` ones where missing (EXPIREAT set with each),
    set every bucket's EXPIREAT, and remove buckets left outside the window. Idempotent; two runs
    at once do no harm (a bucket is created once, the expiry is the same). A key at a bucket's name
    that is not the window's kind of filter is never touched: reported, and (the current or a coming
    bucket) an error once every other bucket is done. ``remove_strays`` False (``apply``, which
    only creates) leaves buckets outside the window where they are. ``spec``: the settings to rotate
    with instead of those stored at ``name`` (a dry run of ``window create``, before they exist)."""
    from bloomctl.backends.library import installs_nothing

    if spec is not None and not dry_run:  # settings never written: a dry run may plan with them, not write
        raise ValueError("rotate(spec=...) is for a dry run only: create the window first")
    spec = spec if spec is not None else read_window(client, name)
    backend = backends.get(spec.backend)
    with installs_nothing() if dry_run else contextlib.nullcontext():
        moment = now if now is not None else server_time(client, spec.name)
        current = spec.index(moment)
        wanted, basis = plan_capacity(client, spec, backend, current)
        the_plan, problem = fitting_plan(spec, backend, wanted, server.line)
        capacity = the_plan.capacity if the_plan is not None else wanted
        if the_plan is not None and capacity < wanted:
            basis += f"; capped at {capacity:,}, the largest bucket the {backend.name} backend takes"
            problem = None
        report = RotateReport(spec, moment, current, capacity, basis, dry_run=dry_run)
        if the_plan is not None and capacity < wanted:
            report.warnings.append(
                f"new buckets of {to_display(spec.name)!r} would need capacity {wanted:,}; "
                f"made with {capacity:,}, the most the {backend.name} backend takes: their error rate rises "
                "past the planned one as they fill; shorten the period"
            )
        for index in range(current - spec.keep + 1, current + spec.ahead + 1):
            action = _bucket(client, spec, backend, the_plan, index, index >= current, dry_run)
            report.actions.append(action)
            if action.action == "kept" and index >= current:
                other = other_parameters(client, spec, backend, action.key, server.line)
                if other:
                    report.warnings.append(
                        f"{to_display(action.key)!r} was made with other parameters than the window's ({other}): "
                        "adds go to it until it leaves the window"
                    )
        if remove_strays:
            report.actions += _expired(client, spec, backend, current, dry_run)
    if problem is not None:  # a fixed capacity this server cannot hold: nothing was made, the expiries are set
        raise StateConflict(
            "the buckets of window %r cannot be made on this server: %s", to_display(spec.name), problem
        )
    blocked = [a for a in report.actions if a.action == "foreign" and a.index >= current]
    if blocked:
        raise StateConflict(
            "%r, a bucket of window %r, holds something else: adds to it fail; move that key away, then rotate again",
            to_display(blocked[0].key),
            to_display(spec.name),
        )
    return report


def _bucket(
    client: RedisClient,
    spec: WindowSpec,
    backend: Backend,
    the_plan: AnyPlan | None,
    index: int,
    make: bool,
    dry_run: bool,
) -> BucketAction:
    key, at = spec.key(index), spec.expire_at(index)
    action = BucketAction(index, key, spec.label(index), "kept", at)
    if backends.key_type(client, key) == b"none":
        if not make or the_plan is None:
            action.action, action.expire_at = "missing", None
            return action
        action.action, action.capacity = "created", the_plan.capacity
        action.size_bytes = backend.size_bytes(the_plan)
        if dry_run:
            return action
        try:
            backend.reserve(client, key, the_plan)
        except StateConflict:  # another rotation made it a moment ago
            action.action, action.capacity, action.size_bytes = "kept", None, None
        except Exception as exc:
            from bloomctl.lifecycle.standby import is_out_of_memory

            if not is_out_of_memory(exc):
                raise
            raise OutOfMemory(
                "the server is out of memory: the bucket %r (capacity %s) could not be made; adds to it fail "
                "once its period starts: free memory or raise maxmemory, then rotate again",
                to_display(key),
                f"{the_plan.capacity:,}",
            ) from None
    elif not holds(client, key, backend):
        action.action, action.expire_at = "foreign", None
        return action
    if not dry_run:
        client.expireat(key, at)
    return action


def _expired(
    client: RedisClient, spec: WindowSpec, backend: Backend, current: int, dry_run: bool
) -> list[BucketAction]:
    """Buckets of this window outside it (a bucket whose expiry was removed, or a clock that went
    back): unlinked. A bounded look, by name (the last STRAY_LOOKBACK periods before the window; no
    SCAN of the keyspace); only keys that hold the window's kind of filter are touched."""
    oldest = current - spec.keep
    found = []
    for index in range(oldest - STRAY_LOOKBACK + 1, oldest + 1):
        key = spec.key(index)
        if backends.key_type(client, key) != b"none" and holds(client, key, backend):
            found.append(BucketAction(index, key, spec.label(index), "expired"))
            if not dry_run:
                client.unlink(key)
    return found
