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
from bloomctl.declared.fleet import Connect, Fleet, Outcome, Turn
from bloomctl.errors import Failure, KeyMissing, StateConflict

DEFAULT_CACHE_SECONDS = 10.0
DEFAULT_SCRAPE_TIMEOUT = 5.0  # seconds a server may take to answer one command of a collection
REASON_LENGTH = 300  # characters of an error's line in the log
REBUILD_STATES = ("none", "loading", "verified", "loaded", "failed", "interrupted")

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
        for turn in Fleet(self.decls, self.connect).by_profile():
            down = turn.failure if turn.failure is not None else self._filters(out, turn)
            if down is not None:  # up 0, no filter metrics of it
                for family in out.families.values():
                    family.samples = [s for s in family.samples if s[0].get("profile", turn.profile) != turn.profile]
            self._note_down(turn.profile, None if down is None else _reason(down))
            out.add(
                "bloomctl_up",
                "1 when the profile's server answered the last collection, else 0.",
                {"profile": turn.profile},
                int(down is None),
            )
            out.add(
                "bloomctl_collect_duration_seconds",
                "How long collecting the profile's filters took.",
                {"profile": turn.profile},
                time.monotonic() - turn.began,
            )
        out.add(
            "bloomctl_exporter_collect_seconds",
            "How long the last collection of every profile took.",
            {},
            time.monotonic() - started,
        )
        return out

    def _filters(self, out: Collection, turn: Turn) -> Failure | None:
        """The metrics of a reached profile's filters; the failure that says its server went away
        part-way, if it did (its other filters are then not asked)."""
        for outcome in turn.each(lambda client, _server, decl: self._filter(out, client, decl)):
            if outcome.failure is not None and outcome.failure.unreachable:
                return outcome.failure
            self._note_filter(out, outcome)
        return None

    def _note_down(self, profile: str, why: str | None) -> None:
        if why is not None and self._down.get(profile) != why:
            self.log(f"exporter: profile {profile!r} is down: {why}", "warning")
        elif why is None and profile in self._down:
            self.log(f"exporter: profile {profile!r} answers again", "info")
        if why is None:
            self._down.pop(profile, None)
        else:
            self._down[profile] = why

    def _note_filter(self, out: Collection, outcome: Outcome[None]) -> None:
        """A filter's bloomctl_filter_error: 1 when a command the server refused (NOPERM, a damaged
        key, a library too new) kept it from being read, with nothing half-collected of it left."""
        decl = outcome.decl
        labels = {"filter": decl.name, "key": decl.key, "profile": decl.profile}
        if outcome.failure is None:
            self._failing.pop(decl.name, None)
            out.add("bloomctl_filter_error", "1 when the filter could not be read (the log says why).", labels, 0)
            return
        for family in out.families.values():
            family.samples = [s for s in family.samples if s[0].get("filter") != decl.name]
        why = _reason(outcome.failure)
        if self._failing.get(decl.name) != why:
            self.log(f"exporter: {decl.name}: {why}", "warning")
        self._failing[decl.name] = why
        out.add("bloomctl_filter_error", "1 when the filter could not be read (the log says why).", labels, 1)

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
        from bloomctl import window

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


def _reason(failure: Failure) -> str:
    return failure.line[:REASON_LENGTH]


def serve(exporter: Exporter, host: str, port: int) -> tuple[Any, Any]:
    """Serve ``/metrics`` on host:port in a thread; (server, thread) to stop it."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    return start_http_server(port, addr=host, registry=registry)
