"""exporter: a Prometheus endpoint for every filter bloomctl.toml declares (``bloomctl exporter``).

Collected at scrape time, at most once every ``cache_seconds`` (scrapes in between, from several
Prometheus servers say, get the last collection: one entry, so the cache never grows), each
server asked with a short socket timeout. A server that does not answer gives ``bloomctl_up 0``
for its profile and no filter metrics; the endpoint stays up, and the next collection after the
cache expires connects again. Metric names and meanings are those of ``fill-ratio --format
prometheus``, with a ``filter`` label (the name in the file) beside ``key``; and from the metadata,
when the filter was built and how its last rebuild ended.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bloomctl.declared.config import Config, Declared
from bloomctl.declared.declarations import summarize, thresholds
from bloomctl.errors import BloomctlError, KeyMissing, StateConflict

DEFAULT_CACHE_SECONDS = 10.0
DEFAULT_SCRAPE_TIMEOUT = 5.0  # seconds a server may take to answer one command of a collection
REBUILD_STATES = ("none", "loading", "verified", "loaded", "failed", "interrupted")

Connect = Callable[[str], tuple[Any, Any]]  # a profile -> its client and server (raises when unreachable)
Sample = tuple[dict[str, str], float]


@dataclass
class Family:
    name: str
    help: str
    samples: list[Sample] = field(default_factory=list)


class Collection:
    """The families of one collection, by name, in the order first used."""

    def __init__(self) -> None:
        self.families: dict[str, Family] = {}

    def add(self, name: str, help_text: str, labels: dict[str, str], value: float | None) -> None:
        if value is None:
            return
        family = self.families.setdefault(name, Family(name, help_text))
        family.samples.append((labels, float(value)))


def rebuild_state(client: Any, key: str, metadata: dict[str, str], manifest: Any = None) -> str:
    """How the filter's last rebuild ended: a standby's state when one is there (loading, failed,
    interrupted, verified: waiting for its swap; a sharded filter's worst member's, ``manifest``
    the filter's as already read), else the active filter's (verified, loaded), else none (never
    rebuilt: reserved, or restored). A standby still marked loading while no run holds the
    filter's lock was left by a run that died (kill -9, a lost machine): interrupted."""
    from bloomctl.keys import KeyFamily
    from bloomctl.lifecycle.metadata import read_metadata

    family = KeyFamily.of(key)
    found = []
    for member in manifest.families if manifest is not None else [family]:
        try:
            standby = read_metadata(client, member.standby_meta).get("state")
        except StateConflict:
            standby = None
        if standby:
            found.append(standby if standby in REBUILD_STATES else "loading")
    if found:
        worst = min(found, key=_STANDBY_ORDER.index)
        if worst == "loading" and not client.exists(family.lock):
            return "interrupted"
        return worst
    state = metadata.get("state") if metadata.get("generation") else None
    return state if state in REBUILD_STATES else "none"


_STANDBY_ORDER = ("failed", "interrupted", "loading", "verified", "loaded", "none")  # worst first


class Exporter:
    """The collector prometheus_client's registry calls on each scrape."""

    def __init__(
        self,
        config: Config,
        connect: Connect,
        *,
        names: list[str] | None = None,
        cache_seconds: float = DEFAULT_CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str, str], None] | None = None,
    ) -> None:
        self.config = config
        self.decls = config.select(names)
        self.connect = connect
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, Collection] | None = None
        self.collections = 0  # how many times the servers were asked (the cache's effect, in tests)
        self.log = log or (lambda _message, _level: None)  # (message, level): what went wrong, once
        self._down: dict[str, str] = {}  # profile -> why it is down (logged when it changes)
        self._failing: dict[str, str] = {}  # filter -> why it could not be read

    # prometheus_client's Collector protocol
    def describe(self) -> list[Any]:
        return []  # (nothing to describe before a collection: the registry must not collect at registration)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        for family in self.current().families.values():
            labels = sorted({name for labels, _value in family.samples for name in labels})
            gauge = GaugeMetricFamily(family.name, family.help, labels=labels)
            for sample_labels, value in family.samples:
                gauge.add_metric([sample_labels.get(name, "") for name in labels], value)
            yield gauge

    def current(self) -> Collection:
        """The last collection while it is fresh, else a new one (one at a time: a scrape that
        arrives during a collection waits for it)."""
        with self._lock:
            now = self.clock()
            if self._cached is not None and now - self._cached[0] < self.cache_seconds:
                return self._cached[1]
            collection = self.gather()
            self._cached = (self.clock(), collection)
            return collection

    def gather(self) -> Collection:
        self.collections += 1
        out = Collection()
        started = time.monotonic()
        for profile in dict.fromkeys(d.profile for d in self.decls):
            mine = [d for d in self.decls if d.profile == profile]
            began = time.monotonic()
            up = 1
            try:
                client, _server = self.connect(profile)
                for decl in mine:
                    self._guarded(out, client, decl)
            except Exception as exc:  # the server went away: up 0, no filter metrics of it
                if not _expected(exc):
                    raise
                up = 0
                for family in out.families.values():
                    family.samples = [s for s in family.samples if s[0].get("profile", profile) != profile]
                self._note_down(profile, _reason(exc))
            else:
                self._note_down(profile, None)
            out.add(
                "bloomctl_up",
                "1 when the profile's server answered the last collection, else 0.",
                {"profile": profile},
                up,
            )
            out.add(
                "bloomctl_collect_duration_seconds",
                "How long collecting the profile's filters took.",
                {"profile": profile},
                time.monotonic() - began,
            )
        out.add(
            "bloomctl_exporter_collect_seconds",
            "How long the last collection of every profile took.",
            {},
            time.monotonic() - started,
        )
        return out

    def _note_down(self, profile: str, why: str | None) -> None:
        if why is not None and self._down.get(profile) != why:
            self.log(f"exporter: profile {profile!r} is down: {why}", "warning")
        elif why is None and profile in self._down:
            self.log(f"exporter: profile {profile!r} answers again", "info")
        if why is None:
            self._down.pop(profile, None)
        else:
            self._down[profile] = why

    def _guarded(self, out: Collection, client: Any, decl: Declared) -> None:
        """One filter's metrics; a command the server refuses (NOPERM, a damaged key, a library too
        new) gives its bloomctl_filter_error 1 and leaves the other filters' alone. A server that
        does not answer is raised: the whole profile is down."""
        labels = {"filter": decl.name, "key": decl.key, "profile": decl.profile}
        try:
            self._filter(out, client, decl)
        except Exception as exc:
            if not _expected(exc) or _unreachable(exc):
                raise
            for family in out.families.values():  # nothing half-collected of it
                family.samples = [s for s in family.samples if s[0].get("filter") != decl.name]
            why = _reason(exc)
            if self._failing.get(decl.name) != why:
                self.log(f"exporter: {decl.name}: {why}", "warning")
            self._failing[decl.name] = why
            out.add("bloomctl_filter_error", "1 when the filter could not be read (the log says why).", labels, 1)
            return
        self._failing.pop(decl.name, None)
        out.add("bloomctl_filter_error", "1 when the filter could not be read (the log says why).", labels, 0)

    def _filter(self, out: Collection, client: Any, decl: Declared) -> None:
        labels = {"filter": decl.name, "key": decl.key, "profile": decl.profile}
        if decl.kind == "windowed":
            self._window(out, client, decl, labels)
            return
        from bloomctl.backends.library import installs_nothing
        from bloomctl.lifecycle import front as lifecycle

        try:
            with installs_nothing():  # a scrape writes nothing: not even the function library
                summary = summarize(lifecycle.describe(client, decl.key))
        except (KeyMissing, StateConflict):
            out.add("bloomctl_filter_present", "1 when the key holds the declared filter, 0 when not.", labels, 0)
            return
        out.add("bloomctl_filter_present", "1 when the key holds the declared filter, 0 when not.", labels, 1)
        self._state(out, decl, summary.state, labels)
        from bloomctl.declared.schedule import built_at

        out.add(
            "bloomctl_filter_built_timestamp_seconds",
            "When the active filter was made (the start of the rebuild that built it), from its metadata.",
            labels,
            built_at(summary.metadata),
        )
        state = rebuild_state(client, decl.key, summary.metadata, summary.manifest)
        for name in REBUILD_STATES:
            out.add(
                "bloomctl_last_rebuild_state",
                "1 for the state of the filter's last rebuild (none: never rebuilt; failed, interrupted: its "
                "standby was left unswapped).",
                {**labels, "state": name},
                int(name == state),
            )

    def _state(self, out: Collection, decl: Declared, state: Any, labels: dict[str, str]) -> None:
        from bloomctl.lifecycle.fill import PROMETHEUS_METRICS, judge

        limits = thresholds(decl)
        report = judge(decl.key.encode("utf-8", "surrogateescape"), state, limits)
        out.add("bloomctl_filter_type", "1 for the filter's type (bloom or cuckoo).", {**labels, "type": state.kind}, 1)
        for name, help_text, getter in PROMETHEUS_METRICS:
            out.add(name, help_text, labels, getter(report, state))
        warn_at, max_at = report.limits or (limits.warn_at, limits.max_at)
        for level, value in (("warn", warn_at), ("max", max_at)):
            out.add(
                "bloomctl_fill_threshold_ratio",
                "The fill-ratio thresholds declared.",
                {**labels, "level": level},
                value,
            )
        out.add("bloomctl_false_positive_threshold_ratio", "The max_fpr declared.", labels, limits.max_fpr)

    def _window(self, out: Collection, client: Any, decl: Declared, labels: dict[str, str]) -> None:
        from bloomctl.window import core as window

        try:
            info = window.describe(client, decl.key)
        except (KeyMissing, StateConflict):
            out.add("bloomctl_filter_present", "1 when the key holds the declared filter, 0 when not.", labels, 0)
            return
        out.add("bloomctl_filter_present", "1 when the key holds the declared filter, 0 when not.", labels, 1)
        out.add(
            "bloomctl_window_current_bucket_present",
            "Windows: 1 when the current bucket exists (else adds fail: rotate it).",
            labels,
            int(not info.current_missing),
        )
        out.add(
            "bloomctl_window_buckets",
            "Windows: buckets that exist (past, current and made ahead).",
            labels,
            sum(b.state is not None for b in info.buckets),
        )
        out.add(
            "bloomctl_window_items",
            "Windows: items in the buckets a lookup asks.",
            labels,
            sum(b.state.items for b in info.lookup_buckets if b.state is not None),
        )
        out.add(
            "bloomctl_window_false_positive_ratio",
            "Windows: the estimated false-positive rate of a lookup over every bucket.",
            labels,
            info.combined_fpr,
        )
        current = next((b for b in info.buckets if b.role == "current" and b.state is not None), None)
        if current is not None:  # the fill metrics: the current bucket's
            self._state(out, decl, current.state, labels)


def _expected(exc: BaseException) -> bool:
    """A server's answer (or silence) the exporter reports; anything else is a bug and raised."""
    return isinstance(exc, BloomctlError) or type(exc).__module__.startswith("redis")


def _unreachable(exc: BaseException) -> bool:
    import redis

    from bloomctl.errors import ExitCode

    return isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError) or (
        isinstance(exc, BloomctlError) and exc.exit_code == ExitCode.CONNECTION
    )


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:300]


def serve(exporter: Exporter, host: str, port: int) -> tuple[Any, Any]:
    """Serve ``/metrics`` on host:port in a thread; (server, thread) to stop it."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    return start_http_server(port, addr=host, registry=registry)
