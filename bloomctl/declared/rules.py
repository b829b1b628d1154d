"""The rules of bloomctl.toml that the table of kinds cannot say: how keys go together.

One function per rule, each returning its problems as (path, text); a value of the wrong kind,
which the table reported already, is passed over here.
"""

from __future__ import annotations

import re
from typing import Any

from bloomctl.declared.schema import FORMAT, Problem
from bloomctl.errors import UsageError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")  # a filter's or profile's name: typed on command lines

# the names bloomctl keeps beside a filter (prefix:ROLE...): keys.KeyFamily, a build's, a probe's,
# a restore's, and a window's buckets (prefix:YYYY-MM-DD, prefix:YYYY-MM-DDTHH)
_COMPANION = re.compile(
    r"(standby|old|lock|meta|standby:meta|old:meta|standby:log|restore|restore:meta|build(:.*)?|probe:.*"
    r"|\d{4}-\d{2}-\d{2}(T\d{2})?)",
    re.S,
)


def check_rules(data: dict[str, Any]) -> list[Problem]:
    """Every problem of how the keys of the parsed file go together."""
    found: list[Problem] = []
    version = data.get("version", FORMAT)
    if version != FORMAT:
        found.append((("version",), f"this bloomctl reads version {FORMAT} of the file, not {version!r}"))
    profiles = data.get("profiles", {}) if isinstance(data.get("profiles"), dict) else {}
    for name, body in profiles.items():
        found += _profile_rules(name, body)
    filters = data.get("filters", {}) if isinstance(data.get("filters"), dict) else {}
    return found + _filters_rules(filters, profiles)


def _profile_rules(name: str, body: Any) -> list[Problem]:
    from bloomctl.server.connection import url_has_secret

    found: list[Problem] = []
    if not NAME.fullmatch(name):
        found.append(
            (("profiles", name), "a profile's name is letters, digits and _ . : - (it is typed on command lines)")
        )
    if not isinstance(body, dict):
        return found
    url = body.get("url")
    if isinstance(url, str) and url_has_secret(url if "://" in url else f"redis://{url}"):
        found.append((("profiles", name, "url"), "the URL holds a password: put it in password_file or password_env"))
    if "password_file" in body and "password_env" in body:
        found.append((("profiles", name), "give password_file or password_env, not both"))
    return found


def _filters_rules(filters: dict[str, Any], profiles: dict[str, Any]) -> list[Problem]:
    """Each filter's own rules, then its key against the keys declared before it."""
    found: list[Problem] = []
    keys: dict[str, str] = {}
    profile_of: dict[str, Any] = {}
    for name, body in filters.items():
        if not NAME.fullmatch(name):
            found.append(
                (("filters", name), "a filter's name is letters, digits and _ . : - (it is typed on command lines)")
            )
        if not isinstance(body, dict):
            continue
        found += [(("filters", name, *path), text) for path, text in filter_rules(body, profiles)]
        key = body.get("key", name)
        if not isinstance(key, str):
            continue
        # A key declared twice is refused on another profile too: the metrics and `rebuild KEY` name a filter by its key.
        if key in keys:
            found.append((("filters", name, "key"), f"the key {key!r} is declared by {keys[key]!r} too"))
        keys.setdefault(key, name)
        profile_of[name] = body.get("profile", "default")
        found += _family_clashes(name, key, profile_of[name], keys, profile_of)
        if key != name and isinstance(filters.get(key), dict):
            found.append(
                (
                    ("filters", name, "key"),
                    f"the key {key!r} is the name of another filter: `rebuild {key}` would be ambiguous",
                )
            )
    return found


def _family_clashes(name: str, key: str, profile: Any, keys: dict[str, str], profiles: dict[str, Any]) -> list[Problem]:
    """``key`` against the keys declared before it on the same profile: two keys whose companions
    (standby, old, meta, lock, a window's buckets) share names (``cq`` and ``{cq}``), or a key that
    is one of another's companions (``{users}:standby``): a rebuild of one would replace or rewrite
    the other. (``shop:{users}`` and ``shop:{users}:v2`` are two filters, not companions.)"""
    from bloomctl.keys import KeyFamily

    try:
        mine = KeyFamily.of(key).prefix
    except UsageError:
        return []
    found: list[Problem] = []
    for other_key, other_name in keys.items():
        if other_name == name or other_key == key or profiles.get(other_name, "default") != profile:
            continue  # the same key twice is a problem of its own, reported before
        theirs = KeyFamily.of(other_key).prefix
        if theirs == mine:
            found.append(
                (
                    ("filters", name, "key"),
                    f"the keys {other_key!r} (of {other_name!r}) and {key!r} share their companion keys "
                    f"({theirs.decode('utf-8', 'replace')}:standby, :meta...): choose another key",
                )
            )
            continue
        for inner, outer, prefix in ((key, other_name, theirs), (other_key, name, mine)):
            raw = inner.encode()
            if raw.startswith(prefix + b":") and _COMPANION.fullmatch(
                raw[len(prefix) + 1 :].decode("utf-8", "replace")
            ):
                found.append(
                    (
                        ("filters", name, "key"),
                        f"the key {inner!r} is among the companion keys of {outer!r} (its standby, old filter, "
                        "metadata or buckets): a rebuild of one would replace the other; choose another key",
                    )
                )
    return found


def filter_rules(body: dict[str, Any], profiles: dict[str, Any]) -> list[Problem]:
    """The rules of one filter's table; each problem's path is relative to the filter."""
    return [
        *_known_profile(body, profiles),
        *_bloom_needs_error_rate(body),
        *_only_bloom_is_sharded(body),
        *_expansion_or_nonscaling(body),
        *_cuckoo_keys(body),
        *_window_rules(body),
        *_valid_thresholds(body),
        *_fed_by_the_application(body),
        *_one_source(body),
    ]


def _kind(body: dict[str, Any]) -> object:  # the value as the file has it, anything: the rules only compare it
    return body.get("type", "bloom")


def _known_profile(body: dict[str, Any], profiles: dict[str, Any]) -> list[Problem]:
    profile = body.get("profile", "default")
    if profiles and isinstance(profile, str) and profile not in profiles:
        return [(("profile",), f"no profile {profile!r} in the file (profiles: {', '.join(profiles)})")]
    return []


def _bloom_needs_error_rate(body: dict[str, Any]) -> list[Problem]:
    if _kind(body) == "bloom" and "error_rate" not in body:
        return [((), "a Bloom filter needs error_rate")]
    return []


def _only_bloom_is_sharded(body: dict[str, Any]) -> list[Problem]:
    if "shards" in body and _kind(body) != "bloom":
        return [(("shards",), "is for Bloom filters: cuckoo filters and windows are not sharded")]
    return []


def _expansion_or_nonscaling(body: dict[str, Any]) -> list[Problem]:
    if "expansion" in body and body.get("nonscaling"):
        return [(("expansion",), "expansion and nonscaling exclude each other")]
    return []


def _cuckoo_keys(body: dict[str, Any]) -> list[Problem]:
    if _kind(body) in ("cuckoo", "windowed"):
        return []
    return [
        ((name,), 'is for type = "cuckoo"')
        for name in ("bucket_size", "max_iterations", "fingerprint_bits")
        if name in body
    ]


def _window_rules(body: dict[str, Any]) -> list[Problem]:
    if _kind(body) != "windowed":
        return [(("window",), 'is for type = "windowed"')] if "window" in body else []
    window = body.get("window", {}) if isinstance(body.get("window"), dict) else {}
    return [*_window_period(window), *_window_sizing(body, window), *_window_has_no_source(body)]


def _window_period(window: dict[str, Any]) -> list[Problem]:
    found: list[Problem] = [
        (("window",), f"a windowed filter needs window.{name}") for name in ("period", "keep") if name not in window
    ]
    if "period" in window:
        from bloomctl.window.periods import parse_period

        try:
            parse_period(window["period"])
        except UsageError as exc:
            found.append((("window", "period"), str(exc).replace("`", "")))
    return found


def _window_sizing(body: dict[str, Any], window: dict[str, Any]) -> list[Problem]:
    found: list[Problem] = []
    if window.get("type", "bloom") == "bloom" and "error_rate" not in body:
        found.append(((), "a window of Bloom filters needs error_rate"))
    if body.get("capacity", "auto") == "auto" and "min_capacity" not in body:
        found.append((("capacity",), "capacity auto needs min_capacity (the first buckets' capacity)"))
    return found


def _window_has_no_source(body: dict[str, Any]) -> list[Problem]:
    if "source" in body:
        return [(("source",), "a windowed filter has no source: it is fed by the application")]
    return []


def _valid_thresholds(body: dict[str, Any]) -> list[Problem]:
    limits = body.get("thresholds", {})
    if not isinstance(limits, dict) or not limits:
        return []
    from bloomctl.lifecycle.fill import Thresholds

    try:
        Thresholds(warn=limits.get("warn"), max=limits.get("max"))
    except (UsageError, TypeError) as exc:
        return [(("thresholds",), str(exc).replace("`", ""))]
    return []


def _fed_by_the_application(body: dict[str, Any]) -> list[Problem]:
    """A filter with no source: nothing to count for an auto capacity, nothing to rebuild from."""
    if _kind(body) == "windowed" or body.get("source", {}):
        return []
    found: list[Problem] = []
    if body.get("capacity", "auto") == "auto":
        found.append((("capacity",), "a filter the application feeds (no source) needs a number: auto counts a source"))
    rebuild = body.get("rebuild", {})
    for name in ("every", "when_fill_above"):
        if isinstance(rebuild, dict) and name in rebuild:
            found.append((("rebuild", name), "a scheduled rebuild needs a source to rebuild from"))
    return found


def _one_source(body: dict[str, Any]) -> list[Problem]:
    source = body.get("source", {})
    if not isinstance(source, dict) or not source:
        return []
    found: list[Problem] = []
    given = [name for name in ("csv", "parquet", "sql") if name in source]
    if len(given) != 1:
        found.append((("source",), "give one of source.csv, source.parquet or source.sql"))
    if "sql" in source and "db_url_env" not in source:
        found.append((("source",), "source.sql needs source.db_url_env, the variable that holds the database URL"))
    column = source.get("column")
    if isinstance(column, int) and not isinstance(column, bool) and column < 1:
        found.append((("source", "column"), "a column's position counts from 1 (or give the header's name)"))
    return found
