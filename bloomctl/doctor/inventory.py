"""Which filters doctor checks: the KEYs given, or what a bounded SCAN finds, each sized as a filter is read.

A time-windowed filter counts as one: the settings hash at its name, its buckets' sizes added up;
a SCAN reports its buckets through it, not as filters of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from bloomctl.doctor.findings import ERROR, INFO, OK, Finding, could_not, is_denied, is_response_error, not_allowed
from bloomctl.doctor.fitness import Doctor
from bloomctl.keys import KeyFamily, to_bytes, to_display
from bloomctl.server.capabilities import _text

WINDOW_FIELD = "bloomctl_window"  # the field that marks a window's settings hash (bloomctl.window.settings)
SCAN_CALLS = 10  # SCAN calls (COUNT 1000) per primary and key type when no KEY is given


def _readable(select: Any, node: Any, page: list[bytes], scan: dict[str, Any]) -> list[bytes]:
    """``select`` over a SCAN page; a user whose key patterns leave some keys out (SCAN shows every
    key) gets the page key by key, those keys skipped and counted."""
    try:
        return list(select(node, page))
    except Exception as exc:
        if not (is_response_error(exc) and is_denied(exc)):
            raise
    kept: list[bytes] = []
    for key in page:
        try:
            kept += select(node, [key])
        except Exception as exc:
            if not (is_response_error(exc) and is_denied(exc)):
                raise
            scan["not_readable"] = scan.get("not_readable", 0) + 1
    return kept


def find_filters(doctor: Doctor, keys: Sequence[str | bytes]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The filters to check: the KEYs given, or what a bounded SCAN finds."""
    scan: dict[str, Any] = {"keys_given": bool(keys), "looked_at": 0, "cut_short": False}
    names = [to_bytes(k) for k in keys]
    if not names:
        try:
            names = _scan(doctor, scan)
        except Exception as exc:
            if not is_response_error(exc):
                raise
            what = "the keyspace (to find the filters)"
            if not is_denied(exc):
                doctor.add(could_not("keys", what, exc))
                return [], scan
            # SCAN lists every key name whatever the user's key patterns: doctor's operator line leaves it out
            refused = not_allowed("keys", what, "SCAN 0", exc)
            doctor.add(replace(refused, fix="pass the filters' names: `bloomctl doctor KEY...`"))
            return [], scan
    filters = []
    for name in names:
        entry = describe(doctor, name, given=bool(keys))
        if entry is not None:
            filters.append(entry)
    if not keys:
        filters = [f for f in filters if not any(_is_bucket(f["key"], w) for w in filters if w["window"])]
        cut = " (the look stopped there: pass KEY names to check others)" if scan["cut_short"] else ""
        if scan.get("not_readable"):
            cut += f"; {scan['not_readable']:,} keys this user may not read (its key patterns) were skipped"
        doctor.add(
            Finding(
                "keys",
                INFO,
                f"found {len(filters)} filter(s) in {scan['looked_at']:,} keys looked at{cut}",
                {**scan, "filters": [f["key"] for f in filters]},
            )
        )
    return filters, scan


def _scan(doctor: Doctor, scan: dict[str, Any]) -> list[bytes]:
    from bloomctl import backends
    from bloomctl.lifecycle.fill import is_companion
    from bloomctl.lifecycle.manifest import select_manifests

    # Valkey refuses SCAN TYPE with a type no loaded module defines: RedisBloom's only where it is
    usable = [b for b in map(backends.get, backends.names()) if b.scannable_on(doctor.server)]
    selectors = [(b.redis_type, b.select) for b in usable]
    selectors.append((b"hash", lambda node, keys: [*select_manifests(node, keys), *_select_windows(node, keys)]))
    found: list[bytes] = []
    for node in doctor.nodes:
        for redis_type, select in selectors:
            cursor = 0
            for _ in range(SCAN_CALLS):
                try:
                    cursor, page = node.scan(cursor=cursor, count=1000, _type=redis_type)
                except Exception as exc:  # a type the server does not know (Valkey): no keys of it
                    if not (is_response_error(exc) and "unknown type name" in _text(exc).lower()):
                        raise
                    cursor = 0
                    break
                scan["looked_at"] += len(page)
                found += [k for k in _readable(select, node, list(page), scan) if not is_companion(k)]
                if not cursor:
                    break
            if cursor:
                scan["cut_short"] = True
    return sorted(set(found))


def _select_windows(node: Any, keys: list[bytes]) -> list[bytes]:
    """Of ``keys`` (hashes), the settings of time-windowed filters: one pipeline."""
    if not keys:
        return []
    pipe = node.pipeline(transaction=False)
    for key in keys:
        pipe.hget(key, WINDOW_FIELD)
    return [key for key, mark in zip(keys, pipe.execute(), strict=True) if mark is not None]


def _is_bucket(key: str, window: dict[str, Any]) -> bool:
    """Whether the filter ``key`` is a bucket of the window ``window`` (a doctor entry)."""
    from bloomctl.window.periods import label_index

    prefix = to_display(KeyFamily.of(to_bytes(window["key"])).prefix) + ":"
    return key.startswith(prefix) and label_index(window["period"], key[len(prefix) :]) is not None


def _window(doctor: Doctor, key: bytes, given: bool) -> dict[str, Any] | None:
    """The window whose settings are at ``key``, its buckets' backend and size (None: no window there)."""
    from bloomctl import backends
    from bloomctl.server.topology import node_address
    from bloomctl.window.info import describe as describe_window
    from bloomctl.window.periods import format_period

    if backends.key_type(doctor.client, key) != b"hash" or doctor.client.hget(key, WINDOW_FIELD) is None:
        return None
    info = describe_window(doctor.client, key)
    spec, sizes = info.spec, [b.state.size_bytes for b in info.buckets if b.state is not None]
    name = to_display(key)
    if given:
        doctor.add(
            Finding(
                "keys",
                OK,
                f"{name!r}: a window of {len(sizes)} {spec.backend} bucket(s) of {sum(sizes):,} bytes "
                f"(a bucket every {format_period(spec.period)}, {spec.keep} kept)",
                {"key": name, "backend": spec.backend, "size_bytes": sum(sizes), "window": True},
            )
        )
    return {
        "key": name,
        "backend": spec.backend,
        "sharded": False,
        "window": True,
        "period": spec.period,
        "size_bytes": sum(sizes),
        "members": [],
        "node": node_address(doctor.client, key),
    }


def describe(doctor: Doctor, key: bytes, given: bool) -> dict[str, Any] | None:
    """A filter's backend, size and node (or a window's), or None with a finding that says why it
    cannot be read."""
    from bloomctl import backends
    from bloomctl.errors import BloomctlError, KeyMissing
    from bloomctl.lifecycle.manifest import read_manifest
    from bloomctl.server.topology import node_address

    name = to_display(key)
    try:
        window = _window(doctor, key, given)
        if window is not None:
            return window
        manifest = read_manifest(doctor.client, key)
        if manifest is not None:
            backend = backends.get(manifest.backend)
            members = [(m, backend.info(doctor.client, m, with_header=False).size_bytes) for m in manifest.members]
            return {
                "key": name,
                "backend": manifest.backend,
                "sharded": True,
                "window": False,
                "size_bytes": sum(size for _m, size in members),
                "members": [(m, size) for m, size in members],
                "node": None,
            }
        backend = backends.for_key(doctor.client, key)
        size = backend.info(doctor.client, key, with_header=False).size_bytes
    except KeyMissing as exc:
        hint = ""
        if given:
            from bloomctl.lifecycle.suggest import did_you_mean

            hint = did_you_mean(doctor.client, key)
        doctor.add(
            Finding(
                "keys",
                ERROR,
                f"filter {name!r} does not exist{hint}",
                {"key": name, "reason": str(exc)},
                "check the name (bloomctl fill-ratio 'PATTERN*' lists filters)",
            )
        )
        return None
    except BloomctlError as exc:
        doctor.add(Finding("keys", ERROR, f"{name!r}: {exc}", {"key": name, "reason": str(exc)}))
        return None
    except Exception as exc:
        import redis

        what = f"filter {name!r}"
        if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
            doctor.add(Finding("keys", ERROR, f"{what}: its node does not answer ({_text(exc)})", {"key": name}))
            return None
        if not is_response_error(exc):
            raise
        doctor.add(not_allowed("keys", what, "TYPE", exc) if is_denied(exc) else could_not("keys", what, exc))
        return None
    if given:
        doctor.add(
            Finding(
                "keys",
                OK,
                f"{name!r}: a {backend.name} filter of {size:,} bytes",
                {"key": name, "backend": backend.name, "size_bytes": size},
            )
        )
    return {
        "key": name,
        "backend": backend.name,
        "sharded": False,
        "window": False,
        "size_bytes": size,
        "members": [(key, size)],
        "node": node_address(doctor.client, key),
    }
