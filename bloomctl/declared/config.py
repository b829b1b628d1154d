"""bloomctl.toml: one file that declares an application's filters.

Connection profiles (a URL, where the password comes from, TLS, Cluster) and filters (key, type,
backend, capacity, error rate, the item recipe of their source, rebuild options and schedule,
thresholds), read with the standard library's ``tomllib`` and checked against one table of what
each key may hold (``SPEC``): errors name the file and line, unknown keys are refused, and the same
table gives the JSON Schema that editors check the file with (``json_schema``). Secrets are never in
the file: a profile names a password file or an environment variable, and a database URL comes
from an environment variable. docs/config.md describes every key.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bloomctl.defaults import (
    CONFIG_ENV,
    MAX_CATCHUP_SKEW,
    MAX_HEADROOM,
    MAX_JOBS,
    MAX_KEEP_OLD_SECONDS,
    MAX_LOCK_WAIT_SECONDS,
    MAX_SHARDS,
    MAX_TIMEOUT,
    MAX_WINDOW_KEEP,
)
from bloomctl.errors import UsageError
from bloomctl.sizing.bloom import MAX_EXPANSION
from bloomctl.sizing.cuckoo import MAX_BUCKET_SIZE, MAX_ITERATIONS

DEFAULT_FILE = "bloomctl.toml"
FORMAT = 1
TYPES = ("bloom", "cuckoo", "windowed")
BACKENDS = ("auto", "redisbloom", "module-free", "bitmap")
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|d|w)\s*$", re.I)
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


class ConfigError(UsageError):
    """The file cannot be used: every problem found, each with its line."""

    def __init__(self, path: str, problems: list[tuple[int | None, str]]) -> None:
        self.path, self.problems = path, problems
        first_line, first = problems[0]
        where = f"{path}:{first_line}" if first_line else path
        more = f" (and {len(problems) - 1} more: `bloomctl config validate` lists them)" if len(problems) > 1 else ""
        super().__init__("%s: %s%s", where, first, more)

    def lines(self) -> list[str]:
        return [f"{self.path}:{line}: {text}" if line else f"{self.path}: {text}" for line, text in self.problems]


# --- what each key may hold ---------------------------------------------------------------------
# A kind: "str", "int", "number", "bool", "ratio" (0 < x < 1, or "1%"), "count" (an int, or "1M"),
# "count|auto", "duration" ("24h"), ("choice", values), ("range", "int" or "number", low, high)
# (high None: no bound; a low given as a float excludes itself), or a nested table (a dict of keys).

Kind = Any


def _range(base: str, low: float, high: float | None = None) -> tuple[str, str, float, float | None]:
    return ("range", base, low, high)


_OPEN_ZERO = 0.0  # a float low bound: the value must be above it
PROFILE: dict[str, Kind] = {
    "url": "str",
    "password_file": "str",
    "password_env": "envname",
    "tls_ca": "str",
    "tls_cert": "str",
    "tls_key": "str",
    "cluster": "bool",
    "connect_timeout": _range("number", _OPEN_ZERO, MAX_TIMEOUT),
    "timeout": _range("number", _OPEN_ZERO, MAX_TIMEOUT),
}
SOURCE: dict[str, Kind] = {
    "csv": "str",
    "parquet": "str",
    "sql": "str",
    "db_url_env": "envname",
    "column": "str|int",
    "template": "str",
    "prefix": "str",
    "delimiter": "str",
    "encoding": "str",
    "header": "bool",
    "skip_bad_rows": _range("int", 0),
}
REBUILD: dict[str, Kind] = {
    "swap": "bool",
    "keep_old": _range("number", 0, MAX_KEEP_OLD_SECONDS),
    "min_ratio": _range("number", 0),
    "allow_shrink": "bool",
    "allow_recipe_change": "bool",
    "verify": ("choice", ("sample", "all")),
    "verify_sample": _range("int", 0),
    "since_column": "str",
    "catchup_skew": _range("number", 0, MAX_CATCHUP_SKEW),
    "build": ("choice", ("auto", "client", "server")),
    "jobs": _range("int", 1, MAX_JOBS),
    "split_column": "str",
    "client_memory": "count",
    "batch_size": _range("int", 1),
    "max_rate": _range("number", _OPEN_ZERO),
    "lock_wait": _range("number", 0, MAX_LOCK_WAIT_SECONDS),
    "every": "duration",
    "when_fill_above": _range("number", _OPEN_ZERO),
}
THRESHOLDS: dict[str, Kind] = {
    "warn": _range("number", _OPEN_ZERO),
    "max": _range("number", _OPEN_ZERO),
    "max_fpr": "ratio",
}
WINDOW: dict[str, Kind] = {
    "period": "str",
    "keep": _range("int", 1, MAX_WINDOW_KEEP),
    "ahead": _range("int", 0, MAX_WINDOW_KEEP),
    "type": ("choice", ("bloom", "cuckoo")),
}
FILTER: dict[str, Kind] = {
    "key": "str",
    "profile": "str",
    "type": ("choice", TYPES),
    "backend": ("choice", BACKENDS),
    "capacity": "count|auto",
    "headroom": _range("number", 1, MAX_HEADROOM),
    "min_capacity": "count",
    "error_rate": "ratio",
    "expansion": _range("int", 1, MAX_EXPANSION),
    "nonscaling": "bool",
    "shards": _range("int", 1, MAX_SHARDS),
    "bucket_size": _range("int", 1, MAX_BUCKET_SIZE),
    "max_iterations": _range("int", 1, MAX_ITERATIONS),
    "fingerprint_bits": ("choice", (8, 16, 32)),
    "source": SOURCE,
    "rebuild": REBUILD,
    "thresholds": THRESHOLDS,
    "window": WINDOW,
}
SPEC: dict[str, Kind] = {"version": "int", "profiles": ("tables", PROFILE), "filters": ("tables", FILTER)}
SECRET_KEYS = ("password", "db_url", "secret", "token")  # never in the file: name a file or a variable


def parse_duration(text: str | int | float) -> float:
    """``90s``, ``15m``, ``24h``, ``7d``, ``2w`` (or a number of seconds) as seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text))
        if not match:
            raise ValueError(f"{text!r} is not a duration (examples: 15m, 24h, 7d)")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
    if not 0 < seconds < 10 * 365 * 86_400 or not math.isfinite(seconds):
        raise ValueError(f"{text!r} is not a duration between 1 second and 10 years")
    return seconds


def _check(kind: Kind, value: Any) -> str | None:
    """What is wrong with ``value`` for ``kind`` (None: nothing)."""
    from bloomctl.sizing.bloom import parse_count, parse_error_rate

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if isinstance(kind, tuple) and kind[0] == "choice":
        return None if value in kind[1] else f"must be one of {', '.join(map(repr, kind[1]))}, got {value!r}"
    if isinstance(kind, tuple) and kind[0] == "range":
        _range_kind, base, low, high = kind
        wrong = _check(base, value)
        if wrong:
            return wrong
        if (isinstance(low, float) and value <= low) or value < low:
            return (
                f"must be above {low:g}, got {value!r}"
                if isinstance(low, float)
                else f"must be at least {low}, got {value!r}"
            )
        if high is not None and value > high:
            return f"must be at most {high:g}, got {value!r}"
        return None
    checks = {
        "str": lambda v: None if isinstance(v, str) and v != "" else "must be a non-empty string",
        "envname": lambda v: (
            None
            if isinstance(v, str) and ENV_NAME.fullmatch(v)
            else "must be the name of an environment variable (letters, digits, _), never the secret itself"
        ),
        "int": lambda v: None if is_int(v) else f"must be a whole number, got {v!r}",
        "str|int": lambda v: (
            None if (isinstance(v, str) and v) or is_int(v) else f"must be a name or a number, got {v!r}"
        ),
        "bool": lambda v: None if isinstance(v, bool) else f"must be true or false, got {v!r}",
        "number": lambda v: (
            None
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            else f"must be a number, got {v!r}"
        ),
    }
    if kind in checks:
        return checks[kind](value)
    if isinstance(value, bool):
        return "must be a number, not true or false"
    try:
        if kind == "ratio":
            parse_error_rate(value)
        elif kind == "count":
            parse_count(value)
        elif kind == "count|auto":
            if value != "auto":
                parse_count(value)
        elif kind == "duration":
            parse_duration(value)
    except (UsageError, ValueError) as exc:
        return str(exc).replace("%%", "%")
    return None


def _walk(
    spec: dict[str, Kind], data: dict[str, Any], path: tuple[str, ...], found: list[tuple[tuple[str, ...], str]]
) -> None:
    for name, value in data.items():
        here = (*path, name)
        if name not in spec:
            if name.lower() in SECRET_KEYS:
                found.append(
                    (
                        here,
                        "secrets never go in the file: name a password_file or password_env (a database URL: db_url_env)",
                    )
                )
                continue
            close = difflib.get_close_matches(name, list(spec), n=1)
            found.append((here, "unknown key" + (f" (did you mean {close[0]!r}?)" if close else "")))
            continue
        kind = spec[name]
        if isinstance(kind, dict):
            if not isinstance(value, dict):
                found.append((here, "must be a table"))
            else:
                _walk(kind, value, here, found)
        elif isinstance(kind, tuple) and kind[0] == "tables":
            if not isinstance(value, dict):
                found.append((here, "must be a table of tables"))
                continue
            for member, body in value.items():
                if not isinstance(body, dict):
                    found.append(((*here, member), "must be a table"))
                else:
                    _walk(kind[1], body, (*here, member), found)
        else:
            problem = _check(kind, value)
            if problem:
                found.append((here, problem))


# --- where each key is in the file --------------------------------------------------------------

_KEY = re.compile(r"""\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")
_TABLE = re.compile(
    r"""\s*\[\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*\]"""
)


def _parts(dotted: str) -> tuple[str, ...]:
    parts = re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", dotted)
    return tuple(p[1:-1] if p[:1] in "\"'" else p for p in parts)


def _code_lines(text: str) -> list[tuple[int, str]]:
    """Each line that starts outside a multi-line string, with its comments and the bodies of its
    multi-line strings left out (escapes, quotes inside strings and ``#`` in them understood)."""
    lines: list[tuple[int, str]] = []
    state: str | None = None  # None, or the string being read: ", ', \"\"\" or \'\'\'
    code: list[str] = []
    number, starts_free, i, n = 1, True, 0, len(text)
    while i < n:
        char = text[i]
        if char == "\n":
            if state in ('"', "'"):
                state = None  # (an unterminated string: tomllib has refused the file already)
            if starts_free:
                lines.append((number, "".join(code)))
            number, starts_free, i = number + 1, state is None, i + 1
            code = []
            continue
        if state is None:
            if char == "#":
                end = text.find("\n", i)
                i = n if end == -1 else end
                continue
            if text.startswith('"""', i) or text.startswith("'''", i):
                state, i = text[i : i + 3], i + 3
                code.append("''")
                continue
            if char in "\"'":
                state = char
        elif state == '"':
            if char == "\\":
                code.append(text[i : i + 2])
                i += 2
                continue
            if char == '"':
                state = None
        elif state == "'":
            if char == "'":
                state = None
        else:  # a multi-line string: its body is skipped
            if state == '"""' and char == "\\" and text[i + 1 : i + 2] != "\n":
                i += 2
                continue
            if text.startswith(state, i):
                while text.startswith(state[0], i):  # up to two quotes may end the body: \"\"\"\"\"
                    i += 1
                state = None
                continue
            i += 1
            continue
        code.append(char)
        i += 1
    if starts_free and code:
        lines.append((number, "".join(code)))
    return lines


def locate(text: str) -> dict[tuple[str, ...], int]:
    """The line of every table header and ``key =`` of the file (dotted keys resolved)."""
    where: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, line in _code_lines(text):
        header = _TABLE.match(line.replace("[[", "[").replace("]]", "]"))
        if header:
            table = _parts(header.group(1))
            for depth in range(1, len(table) + 1):  # [filters.e.source] declares filters.e here too
                where.setdefault(table[:depth], number)
            continue
        key = _KEY.match(line)
        if key:
            path = (*table, *_parts(key.group(1)))
            for depth in range(len(table) + 1, len(path) + 1):
                where.setdefault(path[:depth], number)
    return where


def _line_of(where: dict[tuple[str, ...], int], path: tuple[str, ...]) -> int | None:
    for depth in range(len(path), 0, -1):
        if path[:depth] in where:
            return where[path[:depth]]
    return None


# --- the declarations -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    name: str
    url: str | None = None
    password_file: str | None = None
    password_env: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    cluster: bool | None = None
    connect_timeout: float | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class Declared:
    """One filter of the file."""

    name: str
    key: str
    profile: str
    kind: str  # bloom, cuckoo, windowed
    backend: str
    line: int | None
    capacity: int | None  # None: auto
    headroom: float | None
    min_capacity: int | None
    error_rate: float | None
    expansion: int | None
    nonscaling: bool
    shards: int | None
    bucket_size: int | None
    max_iterations: int | None
    fingerprint_bits: int | None
    source: dict[str, Any] = field(default_factory=dict)
    rebuild: dict[str, Any] = field(default_factory=dict)
    thresholds: dict[str, Any] = field(default_factory=dict)
    window: dict[str, Any] = field(default_factory=dict)

    @property
    def filter_type(self) -> str:
        """The type of the filter itself (a windowed one's buckets)."""
        return str(self.window.get("type", "bloom")) if self.kind == "windowed" else self.kind


@dataclass(frozen=True)
class Config:
    path: str
    profiles: dict[str, Profile]
    filters: dict[str, Declared]

    def select(self, names: list[str] | tuple[str, ...] | None = None) -> list[Declared]:
        """The filters called ``names`` (by their name in the file, or their key), all when none."""
        if not names:
            return list(self.filters.values())
        chosen = []
        for name in names:
            found = self.filters.get(name) or next((d for d in self.filters.values() if d.key == name), None)
            if found is None:
                close = difflib.get_close_matches(name, list(self.filters), n=1)
                raise UsageError(
                    "%s declares no filter %r%s", self.path, name, f" (did you mean {close[0]!r}?)" if close else ""
                )
            chosen.append(found)
        return chosen


def _declared(name: str, body: dict[str, Any], line: int | None) -> Declared:
    from bloomctl.sizing.bloom import parse_count, parse_error_rate

    capacity = body.get("capacity")
    return Declared(
        name=name,
        key=body.get("key", name),
        profile=body.get("profile", "default"),
        kind=body.get("type", "bloom"),
        backend=body.get("backend", "auto"),
        line=line,
        capacity=None if capacity in (None, "auto") else parse_count(capacity),
        headroom=body.get("headroom"),
        min_capacity=parse_count(body["min_capacity"]) if "min_capacity" in body else None,
        error_rate=parse_error_rate(body["error_rate"]) if "error_rate" in body else None,
        expansion=body.get("expansion"),
        nonscaling=bool(body.get("nonscaling", False)),
        shards=body.get("shards"),
        bucket_size=body.get("bucket_size"),
        max_iterations=body.get("max_iterations"),
        fingerprint_bits=body.get("fingerprint_bits"),
        source=dict(body.get("source", {})),
        rebuild=dict(body.get("rebuild", {})),
        thresholds=dict(body.get("thresholds", {})),
        window=dict(body.get("window", {})),
    )


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")  # a filter's or profile's name: typed on command lines
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _rules(data: dict[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """What the table of kinds cannot say: how keys go together (a value of the wrong kind, which
    the table reported, is passed over here)."""
    from bloomctl.server.connection import url_has_secret

    found: list[tuple[tuple[str, ...], str]] = []
    version = data.get("version", FORMAT)
    if version != FORMAT:
        found.append((("version",), f"this bloomctl reads version {FORMAT} of the file, not {version!r}"))
    profiles = data.get("profiles", {}) if isinstance(data.get("profiles"), dict) else {}
    for name, body in profiles.items():
        if not NAME.fullmatch(name):
            found.append(
                (("profiles", name), "a profile's name is letters, digits and _ . : - (it is typed on command lines)")
            )
        if not isinstance(body, dict):
            continue
        url = body.get("url")
        if isinstance(url, str) and url_has_secret(url if "://" in url else f"redis://{url}"):
            found.append(
                (("profiles", name, "url"), "the URL holds a password: put it in password_file or password_env")
            )
        if "password_file" in body and "password_env" in body:
            found.append((("profiles", name), "give password_file or password_env, not both"))
    filters = data.get("filters", {}) if isinstance(data.get("filters"), dict) else {}
    keys: dict[str, str] = {}
    profile_of: dict[str, Any] = {}
    for name, body in filters.items():
        if not NAME.fullmatch(name):
            found.append(
                (("filters", name), "a filter's name is letters, digits and _ . : - (it is typed on command lines)")
            )
        if not isinstance(body, dict):
            continue
        found += [((("filters", name, *path)), text) for path, text in _filter_rules(body, profiles)]
        key = body.get("key", name)
        if not isinstance(key, str):
            continue
        if key in keys:  # (on another profile too: the metrics and `rebuild KEY` name a filter by its key)
            found.append((("filters", name, "key"), f"the key {key!r} is declared by {keys[key]!r} too"))
        keys.setdefault(key, name)
        profile_of[name] = body.get("profile", "default")
        found += _family_clashes(name, key, profile_of[name], keys, profile_of)
        other = filters.get(key)
        if key != name and isinstance(other, dict):
            found.append(
                (
                    ("filters", name, "key"),
                    f"the key {key!r} is the name of another filter: `rebuild {key}` would be ambiguous",
                )
            )
    return found


# the names bloomctl keeps beside a filter (prefix:ROLE...): keys.KeyFamily, a build's, a probe's,
# a restore's, and a window's buckets (prefix:YYYY-MM-DD, prefix:YYYY-MM-DDTHH)
_COMPANION = re.compile(
    r"(standby|old|lock|meta|standby:meta|old:meta|standby:log|restore|restore:meta|build(:.*)?|probe:.*"
    r"|\d{4}-\d{2}-\d{2}(T\d{2})?)",
    re.S,
)


def _family_clashes(
    name: str, key: str, profile: Any, keys: dict[str, str], profiles: dict[str, Any]
) -> list[tuple[tuple[str, ...], str]]:
    """``key`` against the keys declared before it on the same profile: two keys whose companions
    (standby, old, meta, lock, a window's buckets) share names (``cq`` and ``{cq}``), or a key that
    is one of another's companions (``{users}:standby``): a rebuild of one would replace or rewrite
    the other. (``shop:{users}`` and ``shop:{users}:v2`` are two filters, not companions.)"""
    from bloomctl.errors import UsageError
    from bloomctl.keys import KeyFamily

    try:
        mine = KeyFamily.of(key).prefix
    except UsageError:
        return []
    found: list[tuple[tuple[str, ...], str]] = []
    for other_key, other_name in keys.items():
        if other_name == name or other_key == key or profiles.get(other_name, "default") != profile:
            continue  # (the same key twice is a problem of its own)
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


def _filter_rules(body: dict[str, Any], profiles: dict[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    found: list[tuple[tuple[str, ...], str]] = []
    kind = body.get("type", "bloom")
    profile = body.get("profile", "default")
    if profiles and isinstance(profile, str) and profile not in profiles:
        found.append((("profile",), f"no profile {profile!r} in the file (profiles: {', '.join(profiles)})"))
    if kind == "bloom" and "error_rate" not in body:
        found.append(((), "a Bloom filter needs error_rate"))
    if "shards" in body and kind != "bloom":
        found.append((("shards",), "is for Bloom filters: cuckoo filters and windows are not sharded"))
    if "expansion" in body and body.get("nonscaling"):
        found.append((("expansion",), "expansion and nonscaling exclude each other"))
    if kind != "cuckoo" and kind != "windowed":
        for name in ("bucket_size", "max_iterations", "fingerprint_bits"):
            if name in body:
                found.append(((name,), 'is for type = "cuckoo"'))
    if kind == "windowed":
        window = body.get("window", {}) if isinstance(body.get("window"), dict) else {}
        for name in ("period", "keep"):
            if name not in window:
                found.append((("window",), f"a windowed filter needs window.{name}"))
        if "period" in window:
            from bloomctl.window.core import parse_period

            try:
                parse_period(window["period"])
            except UsageError as exc:
                found.append((("window", "period"), str(exc).replace("`", "")))
        if window.get("type", "bloom") == "bloom" and "error_rate" not in body:
            found.append(((), "a window of Bloom filters needs error_rate"))
        if body.get("capacity", "auto") == "auto" and "min_capacity" not in body:
            found.append((("capacity",), "capacity auto needs min_capacity (the first buckets' capacity)"))
        if "source" in body:
            found.append((("source",), "a windowed filter has no source: it is fed by the application"))
    elif "window" in body:
        found.append((("window",), 'is for type = "windowed"'))
    limits = body.get("thresholds", {})
    if isinstance(limits, dict) and limits:
        from bloomctl.lifecycle.fill import Thresholds

        try:
            Thresholds(warn=limits.get("warn"), max=limits.get("max"))
        except (UsageError, TypeError) as exc:
            found.append((("thresholds",), str(exc).replace("`", "")))
    source = body.get("source", {})
    if kind != "windowed" and not source:
        if body.get("capacity", "auto") == "auto":
            found.append(
                (("capacity",), "a filter the application feeds (no source) needs a number: auto counts a source")
            )
        rebuild = body.get("rebuild", {})
        for name in ("every", "when_fill_above"):
            if isinstance(rebuild, dict) and name in rebuild:
                found.append((("rebuild", name), "a scheduled rebuild needs a source to rebuild from"))
    if isinstance(source, dict) and source:
        given = [name for name in ("csv", "parquet", "sql") if name in source]
        if len(given) != 1:
            found.append((("source",), "give one of source.csv, source.parquet or source.sql"))
        if "sql" in source and "db_url_env" not in source:
            found.append((("source",), "source.sql needs source.db_url_env, the variable that holds the database URL"))
        column = source.get("column")
        if isinstance(column, int) and not isinstance(column, bool) and column < 1:
            found.append((("source", "column"), "a column's position counts from 1 (or give the header's name)"))
    return found


def load(path: str | os.PathLike[str]) -> Config:
    """The file at ``path``, checked; ConfigError lists every problem, each with its line."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError("cannot read the config file %s: %s", name, exc.strerror or str(exc)) from None
    except UnicodeDecodeError:
        raise ConfigError(name, [(None, "is not UTF-8 text")]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise ConfigError(name, [(int(match.group(1)) if match else None, f"not valid TOML: {exc}")]) from None
    found: list[tuple[tuple[str, ...], str]] = []
    _walk(SPEC, data, (), found)
    found += _rules(data)
    where = locate(text)
    if found:
        problems = sorted(
            ((_line_of(where, path), f"{'.'.join(path) or 'the file'}: {text}") for path, text in found),
            key=lambda p: (p[0] or 0, p[1]),
        )
        raise ConfigError(name, problems)
    base = os.path.dirname(name)
    profiles = {n: Profile(name=n, **_relative(body, PATH_KEYS, base)) for n, body in data.get("profiles", {}).items()}
    filters = {}
    for n, body in data.get("filters", {}).items():
        if "source" in body:
            body = {**body, "source": _relative(body["source"], ("csv", "parquet"), base)}
        filters[n] = _declared(n, body, _line_of(where, ("filters", n)))
    return Config(name, profiles, filters)


PATH_KEYS = ("password_file", "tls_ca", "tls_cert", "tls_key")


def _relative(body: dict[str, Any], names: tuple[str, ...], base: str) -> dict[str, Any]:
    """Paths in the file are relative to the file's directory (cron runs bloomctl from anywhere);
    ``-`` (stdin) stays."""
    out = dict(body)
    for name in names:
        value = out.get(name)
        if isinstance(value, str) and value != "-" and base and not os.path.isabs(os.path.expanduser(value)):
            out[name] = os.path.join(base, value)
        elif isinstance(value, str) and value.startswith("~"):
            out[name] = os.path.expanduser(value)
    return out


def find(path: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The file to read: ``path`` (the ``--config`` flag), else $BLOOMCTL_CONFIG, else ./bloomctl.toml
    when it exists; None when there is none."""
    env = os.environ if environ is None else environ
    if path:
        return path
    if env.get(CONFIG_ENV):
        return env[CONFIG_ENV]
    return DEFAULT_FILE if Path(DEFAULT_FILE).is_file() else None


# --- the JSON Schema ------------------------------------------------------------------------------


def _schema_of(kind: Kind) -> dict[str, Any]:
    if isinstance(kind, dict):
        return {
            "type": "object",
            "additionalProperties": False,
            "properties": {name: _schema_of(sub) for name, sub in kind.items()},
        }
    if isinstance(kind, tuple) and kind[0] == "tables":
        return {"type": "object", "additionalProperties": _schema_of(kind[1])}
    if isinstance(kind, tuple) and kind[0] == "choice":
        return {"enum": list(kind[1])}
    if isinstance(kind, tuple) and kind[0] == "range":
        _range_kind, base, low, high = kind
        schema = {"type": "integer" if base == "int" else "number"}
        schema["exclusiveMinimum" if isinstance(low, float) else "minimum"] = low
        if high is not None:
            schema["maximum"] = high
        return schema
    count = {
        "oneOf": [
            {"type": "integer", "minimum": 1},
            {"type": "string", "pattern": r"^\s*[0-9][0-9_.]*(e[+-]?[0-9]+)?\s*[kmgbtKMGBT]?\s*$"},
        ]
    }
    simple: dict[str, dict[str, Any]] = {
        "str": {"type": "string", "minLength": 1},
        "envname": {"type": "string", "pattern": f"^{ENV_NAME.pattern}$"},
        "int": {"type": "integer"},
        "str|int": {"oneOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]},
        "bool": {"type": "boolean"},
        "number": {"type": "number"},
        "ratio": {
            "oneOf": [
                {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                {"type": "string", "pattern": r"^\s*[0-9.]+\s*%\s*$"},
            ]
        },
        "count": count,
        "count|auto": {"oneOf": [*count["oneOf"], {"const": "auto"}]},
        "duration": {
            "oneOf": [
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "string", "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*[smhdwSMHDW]\s*$"},
            ]
        },
    }
    return simple[kind]


def json_schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of the file, from the same table the checks use."""
    schema = _schema_of(SPEC)
    schema.update(
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "urn:redis-bloomctl:bloomctl.toml:1",
            "title": "bloomctl.toml",
            "description": "An application's filters for bloomctl (docs/config.md). Secrets never go in it.",
        }
    )
    return schema
