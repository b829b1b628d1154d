"""Which filters doctor checks: the KEYs given, or what a bounded SCAN finds, each sized as a filter is read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bloomctl.doctor.findings import ERROR, INFO, OK, Finding, could_not, is_denied, is_response_error, not_allowed
from bloomctl.doctor.fitness import Doctor
from bloomctl.keys import to_bytes, to_display
from bloomctl.server.capabilities import _text

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
            doctor.add(not_allowed("keys", what, "SCAN 0", exc) if is_denied(exc) else could_not("keys", what, exc))
            return [], scan
    filters = []
    for name in names:
        entry = describe(doctor, name, given=bool(keys))
        if entry is not None:
            filters.append(entry)
    if not keys:
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
    selectors.append((b"hash", select_manifests))
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


def describe(doctor: Doctor, key: bytes, given: bool) -> dict[str, Any] | None:
    """A filter's backend, size and node, or None with a finding that says why it cannot be read."""
    from bloomctl import backends
    from bloomctl.errors import BloomctlError, KeyMissing
    from bloomctl.lifecycle.manifest import read_manifest
    from bloomctl.server.topology import node_address

    name = to_display(key)
    try:
        manifest = read_manifest(doctor.client, key)
        if manifest is not None:
            backend = backends.get(manifest.backend)
            members = [(m, backend.info(doctor.client, m, with_header=False).size_bytes) for m in manifest.members]
            return {
                "key": name,
                "backend": manifest.backend,
                "sharded": True,
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
        "size_bytes": size,
        "members": [(key, size)],
        "node": node_address(doctor.client, key),
    }
