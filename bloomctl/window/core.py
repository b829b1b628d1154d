"""Time-windowed filters: one filter per period (a bucket), the last ``keep`` looked up together.

For "seen recently" and de-duplication: items are added to the current period's bucket; a lookup
asks the current bucket and the ``keep - 1`` before it, in one call. Old buckets are never
deleted one item at a time: each carries an EXPIREAT at the moment it leaves the window, and
drops itself. ``rotate`` (from cron) pre-creates the coming buckets, sized from the recent ones,
so that an application never writes into a missing bucket, and never makes one: the add
functions refuse a missing bucket instead of creating a filter with the server's defaults.

The window's settings are a hash at its own key (``bloomctl_window``); its buckets are
``{NAME}:LABEL``, companions of the name, so a whole window lives in one hash slot (one node of a
Cluster) and a lookup is one call. LABEL is the bucket's start in UTC, by the server's clock
(TIME): ``YYYY-MM-DD`` for periods of whole days, else ``YYYY-MM-DDTHH``. Buckets start at whole
multiples of the period since the Unix epoch; periods of whole weeks start on a Monday.
docs/windows.md has the details; the same arithmetic runs in ``window.lua``.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from bloomctl import __version__, backends
from bloomctl.backends import Backend
from bloomctl.backends.base import AnyPlan
from bloomctl.defaults import DEFAULT_HEADROOM, MAX_HEADROOM, MAX_WINDOW_KEEP
from bloomctl.errors import KeyMissing, OutOfMemory, StateConflict, UsageError
from bloomctl.keys import KeyFamily, to_bytes, to_display
from bloomctl.lifecycle.metadata import create_hash, now_utc
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.server.topology import node_client
from bloomctl.sizing.bloom import plan
from bloomctl.sizing.cuckoo import DEFAULT_BUCKET_SIZE, DEFAULT_MAX_ITERATIONS, cuckoo_plan

HOUR, DAY, WEEK = 3600, 86_400, 7 * 86_400
MONDAY = 4 * DAY  # 1970-01-01 was a Thursday: weeks start 4 days later
MAX_PERIOD = 366 * DAY
MAX_KEEP = MAX_WINDOW_KEEP
DEFAULT_AHEAD = 2  # buckets made ahead of time: a missed rotation or two do not matter
MARK = "1"  # the settings' format, in the field bloomctl_window
_PERIOD = re.compile(r"^\s*([1-9][0-9]*)\s*([hdw])\s*$", re.I)
_UNITS = {"h": HOUR, "d": DAY, "w": WEEK}


def parse_period(text: str | int) -> int:
    """``1h``, ``6h``, ``1d``, ``7d``, ``30d`` or ``2w`` as seconds (whole hours, up to 366 days)."""
    if isinstance(text, int) and not isinstance(text, bool):
        seconds = text
    else:
        match = _PERIOD.match(str(text))
        if not match:
            raise UsageError("`period` %r is not a period (examples: 1h, 6h, 1d, 7d, 30d, 2w)", text)
        seconds = int(match.group(1)) * _UNITS[match.group(2).lower()]
    if seconds % HOUR or not HOUR <= seconds <= MAX_PERIOD:
        raise UsageError("`period` must be whole hours, from 1h to 366d, got %r", text)
    return seconds


def format_period(seconds: int) -> str:
    for unit, size in (("w", WEEK), ("d", DAY), ("h", HOUR)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"  # pragma: no cover - periods are whole hours


@dataclass(frozen=True)
class WindowSpec:
    """A window's settings, as its hash keeps them."""

    name: bytes
    period: int
    keep: int
    kind: str  # bloom or cuckoo
    backend: str
    capacity: int | None  # None: auto (from the recent buckets' items)
    min_capacity: int
    headroom: float = DEFAULT_HEADROOM
    error_rate: float | None = None
    expansion: int | None = None  # None: never grows
    bucket_size: int | None = None
    max_iterations: int | None = None
    fingerprint_bits: int | None = None
    ahead: int = DEFAULT_AHEAD
    created_at: str = ""
    created_by: str = ""

    @property
    def offset(self) -> int:
        return MONDAY if self.period % WEEK == 0 else 0

    @property
    def prefix(self) -> bytes:
        return KeyFamily.of(self.name).prefix

    def index(self, unix_seconds: float) -> int:
        return math.floor((unix_seconds - self.offset) / self.period)

    def start(self, index: int) -> int:
        return self.offset + index * self.period

    def label(self, index: int) -> str:
        moment = datetime.fromtimestamp(self.start(index), UTC)
        return moment.strftime("%Y-%m-%d" if self.period % DAY == 0 else "%Y-%m-%dT%H")

    def key(self, index: int) -> bytes:
        return self.prefix + b":" + self.label(index).encode()

    def index_of(self, key: bytes) -> int | None:
        """The bucket a key of this window names (None: not one of its buckets)."""
        if not key.startswith(self.prefix + b":"):
            return None
        text = key[len(self.prefix) + 1 :].decode("ascii", "replace")
        for pattern in ("%Y-%m-%d", "%Y-%m-%dT%H"):
            try:
                moment = datetime.strptime(text, pattern).replace(tzinfo=UTC)
            except ValueError:
                continue
            index = self.index(moment.timestamp())
            return index if self.key(index) == key else None
        return None

    def expire_at(self, index: int) -> int:
        """When bucket ``index`` leaves the window: the start of bucket ``index + keep``."""
        return self.start(index + self.keep)

    def lookup_range(self, current: int) -> range:
        return range(current - self.keep + 1, current + 1)

    def plan_for(self, capacity: int) -> AnyPlan:
        if self.kind == "cuckoo":
            return cuckoo_plan(
                capacity,
                bucket_size=self.bucket_size or DEFAULT_BUCKET_SIZE,
                max_iterations=self.max_iterations or DEFAULT_MAX_ITERATIONS,
                expansion=self.expansion,
                engine="lua" if self.backend == "lua-cuckoo" else "redisbloom",
                error_rate=self.error_rate,
                fingerprint_bits=self.fingerprint_bits,
            )
        if self.error_rate is None:
            raise UsageError("a window of Bloom filters needs `error_rate`")
        return plan(capacity, self.error_rate, self.expansion)

    def as_hash(self) -> dict[str, str | bytes]:
        fields: dict[str, str | bytes] = {
            "bloomctl_window": MARK,
            "period": str(self.period),
            "offset": str(self.offset),
            "keep": str(self.keep),
            "ahead": str(self.ahead),
            "prefix": self.prefix,  # bytes: a key name need not be UTF-8
            "type": self.kind,
            "backend": self.backend,
            "capacity": "auto" if self.capacity is None else str(self.capacity),
            "min_capacity": str(self.min_capacity),
            "headroom": repr(self.headroom),
            "expansion": "nonscaling" if self.expansion is None else str(self.expansion),
            "created_at": self.created_at or now_utc(),
            "created_by": self.created_by or f"bloomctl {__version__}",
        }
        optional = {
            "error_rate": self.error_rate,
            "bucket_size": self.bucket_size,
            "max_iterations": self.max_iterations,
            "fingerprint_bits": self.fingerprint_bits,
        }
        fields.update({name: repr(value) for name, value in optional.items() if value is not None})
        return fields

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": to_display(self.name),
            "period": format_period(self.period),
            "period_seconds": self.period,
            "keep": self.keep,
            "ahead": self.ahead,
            "type": self.kind,
            "backend": self.backend,
            "capacity": self.capacity if self.capacity is not None else "auto",
            "min_capacity": self.min_capacity,
            "headroom": self.headroom,
            "error_rate": self.error_rate,
            "expansion": self.expansion,
            "bucket_size": self.bucket_size,
            "max_iterations": self.max_iterations,
            "fingerprint_bits": self.fingerprint_bits,
            "buckets": to_display(self.prefix) + ":LABEL",
            "created_at": self.created_at,
            "created_by": self.created_by,
        }


def _number(fields: dict[str, str], name: str, kind: Any = int) -> Any:
    value = fields.get(name)
    return None if value is None or value in ("auto", "nonscaling", "None") else kind(value)


def read_window(client: RedisClient, name: str | bytes) -> WindowSpec:
    """The settings of the window ``name``; KeyMissing or StateConflict when it is none."""
    raw = to_bytes(name)
    if backends.key_type(client, raw) == b"none":
        missing = KeyMissing("window %r does not exist (`bloomctl window create` makes one)", to_display(raw))
        missing.filter_key = raw
        raise missing
    fields = (
        {k.decode(): v.decode("utf-8", "surrogateescape") for k, v in client.hgetall(raw).items()}
        if backends.key_type(client, raw) == b"hash"
        else {}
    )
    if fields.get("bloomctl_window") != MARK:
        raise StateConflict("%r is not a bloomctl window", to_display(raw))
    try:
        spec = WindowSpec(
            name=raw,
            period=int(fields["period"]),
            keep=int(fields["keep"]),
            kind=fields["type"],
            backend=fields["backend"],
            capacity=_number(fields, "capacity"),
            min_capacity=int(fields["min_capacity"]),
            headroom=float(fields.get("headroom", DEFAULT_HEADROOM)),
            error_rate=_number(fields, "error_rate", float),
            expansion=_number(fields, "expansion"),
            bucket_size=_number(fields, "bucket_size"),
            max_iterations=_number(fields, "max_iterations"),
            fingerprint_bits=_number(fields, "fingerprint_bits"),
            ahead=int(fields.get("ahead", DEFAULT_AHEAD)),
            created_at=fields.get("created_at", ""),
            created_by=fields.get("created_by", ""),
        )
        check_settings(
            keep=spec.keep,
            ahead=spec.ahead,
            headroom=spec.headroom,
            capacity=spec.capacity,
            min_capacity=spec.min_capacity,
            period=spec.period,
        )
    except (KeyError, ValueError) as exc:
        raise StateConflict("%r holds damaged window settings (%r)", to_display(raw), exc) from None
    except UsageError as exc:
        raise StateConflict("%r holds damaged window settings (%s)", to_display(raw), exc) from None
    if (
        spec.backend not in backends.names()
        or spec.kind != backends.get(spec.backend).kind
        or int(fields.get("offset", -1)) != spec.offset
    ):
        raise StateConflict("%r holds damaged window settings", to_display(raw))
    return spec


def check_settings(
    *, keep: int, ahead: int, headroom: float, capacity: int | None, min_capacity: int | None, period: int | None = None
) -> None:
    """The ranges a window's settings must be in (UsageError): for a new window, and for the
    settings read back (a damaged hash must not expire live buckets or divide by zero)."""
    if period is not None:
        parse_period(period)
    if not 1 <= keep <= MAX_KEEP:
        raise UsageError("`keep` must be from 1 to %s periods, got %s", MAX_KEEP, keep)
    if not 0 <= ahead <= MAX_KEEP:
        raise UsageError("`ahead` must be from 0 to %s periods, got %s", MAX_KEEP, ahead)
    if not 1 <= headroom <= MAX_HEADROOM:  # (a NaN is in no range)
        raise UsageError("`headroom` must be from 1 to %s, got %s", MAX_HEADROOM, headroom)
    for what, value in (("capacity", capacity), ("min_capacity", min_capacity)):
        if value is not None and value < 1:
            raise UsageError("`%s` must be at least 1, got %s", what, value)


def server_time(client: RedisClient, key: bytes) -> float:
    """Now, by the clock of the server that holds ``key`` (the functions use the same one)."""
    seconds, micros = node_client(client, key).time()
    return seconds + micros / 1e6


def new_window(
    server: ServerInfo,
    name: str | bytes,
    *,
    period: str | int,
    keep: int,
    capacity: int | None,
    min_capacity: int | None = None,
    error_rate: float | None = None,
    kind: str = "bloom",
    backend: str = "auto",
    expansion: int | None = None,
    nonscaling: bool = False,
    headroom: float = DEFAULT_HEADROOM,
    ahead: int = DEFAULT_AHEAD,
    bucket_size: int | None = None,
    max_iterations: int | None = None,
    fingerprint_bits: int | None = None,
) -> WindowSpec:
    """A window's settings, every one checked (and a bucket planned with them) before anything is written."""
    raw = to_bytes(name)
    KeyFamily.of(raw)
    if capacity is None and min_capacity is None:
        raise UsageError("`capacity` auto plans each bucket from the recent ones: give `min_capacity` for the first")
    check_settings(keep=keep, ahead=ahead, headroom=headroom, capacity=capacity, min_capacity=min_capacity)
    chosen: Backend = backends.choose(server, backend, kind)
    spec = WindowSpec(
        name=raw,
        period=parse_period(period),
        keep=keep,
        kind=kind,
        backend=chosen.name,
        capacity=capacity,
        min_capacity=min_capacity if min_capacity is not None else (capacity or 1),
        headroom=headroom,
        error_rate=error_rate,
        expansion=chosen.expansion_for(expansion, nonscaling),
        bucket_size=bucket_size,
        max_iterations=max_iterations,
        fingerprint_bits=fingerprint_bits,
        ahead=ahead,
    )
    chosen.check_plan(spec.plan_for(spec.capacity or spec.min_capacity), server.line)
    return spec


def aliases(name: bytes) -> list[bytes]:
    """Other names whose companions (the buckets) are this name's: ``X`` and ``{X}``, and the
    hex-tagged form of a name with a ``}`` in it (bloomctl.keys)."""
    prefix = KeyFamily.of(name).prefix
    candidates = {prefix}
    if name.startswith(b"{") and b"}" in name:
        close = name.index(b"}")
        candidates |= {name[1:close], name[close + 1 :]}
    return [c for c in candidates if c and c != name and KeyFamily.of(c).prefix == prefix]


def create(client: RedisClient, server: ServerInfo, spec: WindowSpec, *, if_not_exists: bool = False) -> bool:
    """Write the window's settings (refused where the key exists, unless ``if_not_exists`` and the
    same window is there); True when created. ``rotate`` makes its buckets."""
    fields = replace(spec, created_at=now_utc(), created_by=f"bloomctl {__version__}").as_hash()
    for other in aliases(spec.name):  # `X` and `{X}` would share their buckets' names
        if backends.key_type(client, other) == b"hash" and client.hget(other, "bloomctl_window"):
            raise StateConflict(
                "window %r exists, and its buckets' names (%r) are those %r would have: choose another name",
                to_display(other),
                to_display(spec.prefix) + ":...",
                to_display(spec.name),
            )
    _refuse_leftovers(client, server, spec)
    if create_hash(client, spec.name, fields):
        return True
    if backends.key_type(client, spec.name) == b"hash" and client.hget(spec.name, "bloomctl_window"):
        existing = read_window(client, spec.name)
        same = replace(existing, created_at="", created_by="") == replace(spec, created_at="", created_by="")
        if if_not_exists and same:
            return False
        raise StateConflict("window %r already exists%s", to_display(spec.name), "" if same else " with other settings")
    raise StateConflict("%r already exists and is not a window", to_display(spec.name))


def _refuse_leftovers(client: RedisClient, server: ServerInfo, spec: WindowSpec) -> None:
    """Buckets at the names the new window would add to (the current one and those ahead), left
    by an earlier window of the same name with other parameters, would take its adds: refused,
    before anything is written (buckets made as this window would make them are kept)."""
    if backends.key_type(client, spec.name) != b"none":
        return  # (the window exists: create says so)
    backend = backends.get(spec.backend)
    current = spec.index(server_time(client, spec.name))
    for index in range(current, current + spec.ahead + 1):
        key = spec.key(index)
        if backends.key_type(client, key) == b"none" or not _holds(client, key, backend):
            continue
        other = other_parameters(client, spec, backend, key, server.line)
        if other:
            raise StateConflict(
                "the bucket %r is left from an earlier window %r with other parameters (%s): new adds would go "
                "to it; remove it (UNLINK, its items are lost) or create the window with its parameters",
                to_display(key),
                to_display(spec.name),
                other,
            )


@dataclass
class BucketAction:
    index: int
    key: bytes
    label: str
    action: str  # created, kept, missing (a past bucket never made), expired (outside the window), foreign (not the window's filter)
    expire_at: int | None = None
    capacity: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "key": to_display(self.key),
            "action": self.action,
            "expire_at": _iso(self.expire_at),
            "capacity": self.capacity,
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
            "now": _iso(self.now),
            "current": self.spec.label(self.current),
            "capacity": self.capacity,
            "capacity_basis": self.capacity_basis,
            "current_was_missing": self.current_was_missing,
            "dry_run": self.dry_run,
            "warnings": self.warnings,
            "buckets": [a.as_dict() for a in self.actions],
        }


def _iso(unix_seconds: float | None) -> str | None:
    if unix_seconds is None:
        return None
    return datetime.fromtimestamp(unix_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def plan_capacity(client: RedisClient, spec: WindowSpec, backend: Backend, current: int) -> tuple[int, str]:
    """The capacity of new buckets: fixed, or (auto) the most items a bucket of the window holds
    (the complete ones and the current one so far) x headroom, at least the minimum; for a cuckoo
    filter over the load at which its inserts start to fail."""
    if spec.capacity is not None:
        return spec.capacity, "fixed"
    counts = [  # (a missing bucket, or a foreign key at a bucket's name, counts nothing)
        backend.card(client, key)
        for key in (spec.key(index) for index in range(current - spec.keep + 1, current + 1))
        if backends.key_type(client, key) != b"none" and _holds(client, key, backend)
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
) -> RotateReport:
    """Make the current bucket and the next ``ahead`` ones where missing (EXPIREAT set with each),
    set every bucket's EXPIREAT, and remove buckets left outside the window. Idempotent; two runs
    at once do no harm (a bucket is created once, the expiry is the same). A key at a bucket's name
    that is not the window's kind of filter is never touched: reported, and (the current or a coming
    bucket) an error once every other bucket is done. ``remove_strays`` False (``apply``, which
    only creates) leaves buckets outside the window where they are."""
    from bloomctl.backends.library import installs_nothing

    spec = read_window(client, name)
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
    if problem is not None:  # (a fixed capacity this server cannot hold: nothing made, expiries set)
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


def fitting_plan(
    spec: WindowSpec, backend: Backend, capacity: int, line: str | None
) -> tuple[AnyPlan | None, str | None]:
    """The plan of a new bucket of ``capacity`` as ``backend`` builds it; for an auto capacity
    beyond what the backend takes (a string's 512 MB, Redis 8's 2^30 items), the largest capacity
    it takes (at least the window's minimum); else None and why."""
    try:
        return backend.check_plan(spec.plan_for(capacity), line), None
    except UsageError as exc:
        problem = str(exc)
        if spec.capacity is not None:
            return None, problem
    best, low, high = None, spec.min_capacity, capacity - 1
    while low <= high:  # (plans grow with the capacity: the largest one the backend takes)
        middle = (low + high) // 2
        try:
            best, low = backend.check_plan(spec.plan_for(middle), line), middle + 1
        except UsageError:
            high = middle - 1
    return (best, None) if best is not None else (None, problem)


def other_parameters(client: RedisClient, spec: WindowSpec, backend: Backend, key: bytes, line: str | None) -> str:
    """How the bucket at ``key`` differs from what the window makes ('' when it does not): a
    leftover of an earlier window of the same name, or one made by hand. Its size against a new
    bucket of its own capacity tells another error rate or bucket size; a fixed capacity is compared too."""
    state = backend.info(client, key)
    if state.kind == "cuckoo":
        for name, default in (("bucket_size", DEFAULT_BUCKET_SIZE), ("max_iterations", DEFAULT_MAX_ITERATIONS)):
            want, have = getattr(spec, name) or default, getattr(state, name, None)
            if have is not None and want != have:
                return f"{name.replace('_', ' ')} {have}; the window's is {want}"
    if state.filters != 1:
        return ""  # (a grown filter: its size tells nothing on its own)
    capacity = spec.capacity if spec.capacity is not None else state.reserved_capacity
    try:
        expected = backend.check_plan(spec.plan_for(capacity), line)
    except UsageError:
        return ""
    if backend.size_bytes(expected) == state.size_bytes:
        return ""
    found = f"capacity {state.reserved_capacity:,}, {state.size_bytes:,} bytes"
    return f"{found}; a new bucket has capacity {expected.capacity:,}, {backend.size_bytes(expected):,} bytes"


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
        if dry_run:
            return action
        try:
            backend.reserve(client, key, the_plan)
        except StateConflict:  # another rotation made it a moment ago
            action.action, action.capacity = "kept", None
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
    elif not _holds(client, key, backend):
        action.action, action.expire_at = "foreign", None
        return action
    if not dry_run:
        client.expireat(key, at)
    return action


def _holds(client: RedisClient, key: bytes, backend: Backend) -> bool:
    """Whether ``key`` holds a filter of ``backend`` (and so is a bucket the window may touch)."""
    try:
        return backends.for_key(client, key, "bucket") is backend
    except StateConflict:
        return False


STRAY_LOOKBACK = 64  # bucket periods before the window that rotate looks at for strays


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
        if backends.key_type(client, key) != b"none" and _holds(client, key, backend):
            found.append(BucketAction(index, key, spec.label(index), "expired"))
            if not dry_run:
                client.unlink(key)
    return found


@dataclass
class BucketInfo:
    index: int
    key: bytes
    label: str
    role: str  # past (looked up), current, ahead (made in advance)
    start: int
    end: int
    state: Any = None  # FilterState, None: missing
    ttl_seconds: float | None = None

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "label": self.label,
            "key": to_display(self.key),
            "role": self.role,
            "start": _iso(self.start),
            "end": _iso(self.end),
            "exists": self.state is not None,
            "ttl_seconds": self.ttl_seconds,
        }
        if self.state is not None:
            data.update(
                items=self.state.items,
                capacity=self.state.reserved_capacity,
                fill_ratio=self.state.fill_ratio,
                estimated_fpr=self.state.estimated_fpr,
                size_bytes=self.state.size_bytes,
            )
        return data


@dataclass
class WindowInfo:
    spec: WindowSpec
    now: float
    current: int
    buckets: list[BucketInfo]

    @property
    def lookup_buckets(self) -> list[BucketInfo]:
        return [b for b in self.buckets if b.role != "ahead"]

    @property
    def combined_fpr(self) -> float:
        """A lookup asks every bucket of the window: 1 - prod(1 - fpr_i) over those that exist."""
        survive = 1.0
        for bucket in self.lookup_buckets:
            if bucket.state is not None and bucket.state.estimated_fpr is not None:
                survive *= 1 - bucket.state.estimated_fpr
        return 1 - survive

    @property
    def current_missing(self) -> bool:
        return any(b.role == "current" and b.state is None for b in self.buckets)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.spec.as_dict(),
            "now": _iso(self.now),
            "current": self.spec.label(self.current),
            "current_missing": self.current_missing,
            "items": sum(b.state.items for b in self.lookup_buckets if b.state is not None),
            "combined_fpr": self.combined_fpr,
            "buckets": [b.as_dict() for b in self.buckets],
        }


def describe(client: RedisClient, name: str | bytes, *, now: float | None = None) -> WindowInfo:
    """Every bucket of the window, and the window's numbers (reads only: no function library is loaded)."""
    from bloomctl.backends.library import installs_nothing

    with installs_nothing():
        return _describe(client, name, now)


def _describe(client: RedisClient, name: str | bytes, now: float | None) -> WindowInfo:
    spec = read_window(client, name)
    backend = backends.get(spec.backend)
    moment = now if now is not None else server_time(client, spec.name)
    current = spec.index(moment)
    buckets = []
    for index in range(current - spec.keep + 1, current + spec.ahead + 1):
        key = spec.key(index)
        role = "current" if index == current else "past" if index < current else "ahead"
        bucket = BucketInfo(index, key, spec.label(index), role, spec.start(index), spec.start(index + 1))
        if backends.key_type(client, key) != b"none" and _holds(client, key, backend):
            bucket.state = backend.info(client, key)
            ttl = client.pttl(key)
            bucket.ttl_seconds = ttl / 1000 if ttl is not None and ttl >= 0 else None
        buckets.append(bucket)
    return WindowInfo(spec, moment, current, buckets)


class WindowedFilter:
    """A time-windowed filter: ``add``/``madd`` into the current bucket, ``exists``/``mexists`` over
    the window, each one call of the function library (``bloomctl_window_add``, ``_exists``), by
    the server's clock. An add into a missing bucket raises KeyMissing: run ``bloomctl window rotate``.

    >>> seen = WindowedFilter(client, "dedupe")
    >>> if not seen.exists(event_id): process(event_id); seen.add(event_id)
    """

    def __init__(self, client: RedisClient, name: str | bytes) -> None:
        from bloomctl.backends.library import Library

        self.client, self.name = client, to_bytes(name)
        self.library = Library()

    def _call(self, op: str, items: list[bytes], read_only: bool) -> list[int]:
        import redis

        try:
            return list(self.library.call_keys(self.client, op, [self.name], *items, read_only=read_only))
        except redis.exceptions.ResponseError as exc:
            text = str(exc)
            if "does not exist" in text:
                raise KeyMissing("%s", text.removeprefix("ERR ")) from None
            if "window settings are" in text:  # (incomplete, damaged)
                raise StateConflict("%r holds damaged window settings", to_display(self.name)) from None
            if "does not hold a bloomctl window" in text:
                raise StateConflict("%r is not a bloomctl window", to_display(self.name)) from None
            if "window bucket" in text:  # a bucket's own error (another kind of value there, full...)
                raise StateConflict("%s", text.removeprefix("ERR ")) from None
            if "not found" in text:
                raise KeyMissing("window %r does not exist", to_display(self.name)) from None
            raise

    def madd(self, items: list[bytes | str]) -> list[bool]:
        """Add to the current bucket; True where the item was new to it."""
        if not items:
            return []
        flags = self._call("window_add", [to_bytes(i) for i in items], read_only=False)
        # -1: no slot (a cuckoo bucket); an error element or a short reply: BF.INSERT stopped at a full
        # non-scaling bucket, and the items after it were not added
        if len(flags) != len(items) or any(flag == -1 or isinstance(flag, Exception) for flag in flags):
            added = sum(1 for flag in flags if flag == 1)
            raise StateConflict(
                "the current bucket of window %r is full: %s of %s items added; plan a larger capacity (or let it grow)",
                to_display(self.name),
                f"{added:,}",
                f"{len(items):,}",
            )
        return [flag == 1 for flag in flags]

    def add(self, item: bytes | str) -> bool:
        return self.madd([item])[0]

    def mexists(self, items: list[bytes | str]) -> list[bool]:
        """Whether each item is in any bucket of the window (missing buckets count as empty)."""
        if not items:
            return []
        return [flag == 1 for flag in self._call("window_exists", [to_bytes(i) for i in items], read_only=True)]

    def exists(self, item: bytes | str) -> bool:
        return self.mexists([item])[0]

    def current_bucket(self, at: float | None = None) -> tuple[bytes, bool]:
        """The key of the bucket for ``at`` (now, by the server's clock, when None) and whether it exists."""
        args = [str(int(at))] if at is not None else []
        key, exists = self.library.call_keys(self.client, "window_bucket", [self.name], *args, read_only=True)
        return key, bool(exists)
