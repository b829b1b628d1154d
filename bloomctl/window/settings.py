"""A window's settings: the hash at its own key, read back and checked, and a new window's, planned.

The settings are a hash at the window's name (its field ``bloomctl_window`` marks the format); its
buckets are ``{NAME}:LABEL``, companions of the name, so a whole window lives in one hash slot (one
node of a Cluster) and a lookup is one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bloomctl import __version__, backends
from bloomctl.backends import Backend
from bloomctl.backends.base import AnyPlan
from bloomctl.defaults import DEFAULT_HEADROOM, MAX_HEADROOM, MAX_WINDOW_KEEP
from bloomctl.errors import KeyMissing, StateConflict, UsageError
from bloomctl.keys import KeyFamily, to_bytes, to_display
from bloomctl.lifecycle.metadata import now_utc
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.sizing.bloom import plan
from bloomctl.sizing.cuckoo import DEFAULT_BUCKET_SIZE, DEFAULT_MAX_ITERATIONS, cuckoo_plan
from bloomctl.window.periods import (
    bucket_index,
    bucket_label,
    bucket_start,
    format_period,
    grid_offset,
    label_index,
    parse_period,
)

MAX_KEEP = MAX_WINDOW_KEEP
DEFAULT_AHEAD = 2  # buckets made ahead of time: a missed rotation or two do not matter
MARK = "1"  # the settings' format, in the field bloomctl_window


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
        return grid_offset(self.period)

    @property
    def prefix(self) -> bytes:
        return KeyFamily.of(self.name).prefix

    def index(self, unix_seconds: float) -> int:
        return bucket_index(self.period, unix_seconds)

    def start(self, index: int) -> int:
        return bucket_start(self.period, index)

    def label(self, index: int) -> str:
        return bucket_label(self.period, index)

    def key(self, index: int) -> bytes:
        return self.prefix + b":" + self.label(index).encode()

    def index_of(self, key: bytes) -> int | None:
        """The bucket a key of this window names (None: not one of its buckets)."""
        if not key.startswith(self.prefix + b":"):
            return None
        return label_index(self.period, key[len(self.prefix) + 1 :].decode("ascii", "replace"))

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
                engine=backends.get(self.backend).engine,
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


def _text(fields: dict[str, str], name: str) -> str | None:
    """A field's value; None for a field that is absent, or says auto, nonscaling or None."""
    value = fields.get(name)
    return None if value is None or value in ("auto", "nonscaling", "None") else value


def _number(fields: dict[str, str], name: str) -> int | None:
    value = _text(fields, name)
    return None if value is None else int(value)


def _rate(fields: dict[str, str], name: str) -> float | None:
    value = _text(fields, name)
    return None if value is None else float(value)


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
        spec = _spec_of(raw, fields)
    except (KeyError, ValueError) as exc:
        raise StateConflict("%r holds damaged window settings (%r)", to_display(raw), exc) from None
    except UsageError as exc:
        raise StateConflict("%r holds damaged window settings (%s)", to_display(raw), exc) from None
    if (
        spec.backend not in backends.names()
        or spec.kind != backends.get(spec.backend).kind
        or int(fields.get("offset", -1)) != spec.offset
        # the functions make the buckets' names from this field: another one sends every add elsewhere
        or fields.get("prefix", "").encode("utf-8", "surrogateescape") != spec.prefix
    ):
        raise StateConflict("%r holds damaged window settings", to_display(raw))
    return spec


def _spec_of(name: bytes, fields: dict[str, str]) -> WindowSpec:
    """The settings a window's hash holds, each in its range (KeyError, ValueError or UsageError)."""
    spec = WindowSpec(
        name=name,
        period=int(fields["period"]),
        keep=int(fields["keep"]),
        kind=fields["type"],
        backend=fields["backend"],
        capacity=_number(fields, "capacity"),
        min_capacity=int(fields["min_capacity"]),
        headroom=float(fields.get("headroom", DEFAULT_HEADROOM)),
        error_rate=_rate(fields, "error_rate"),
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
    if not 1 <= headroom <= MAX_HEADROOM:  # a NaN is in no range, so it is refused here too
        raise UsageError("`headroom` must be from 1 to %s, got %s", MAX_HEADROOM, headroom)
    for what, value in (("capacity", capacity), ("min_capacity", min_capacity)):
        if value is not None and value < 1:
            raise UsageError("`%s` must be at least 1, got %s", what, value)


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
    backends.plan_reserve(server, chosen, spec.plan_for(spec.capacity or spec.min_capacity))
    return spec
