"""What each key of bloomctl.toml may hold: one table, the check of a value against it, and the
JSON Schema that editors check the file with, made from the same table.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from typing import Any

from bloomctl.defaults import (
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

FORMAT = 1
TYPES = ("bloom", "cuckoo", "windowed")
BACKENDS = ("auto", "redisbloom", "module-free", "bitmap")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|d|w)\s*$", re.I)
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
Problem = tuple[tuple[str, ...], str]  # the path of a key in the file, and what is wrong there

# --- what each key may hold ---------------------------------------------------------------------
# A kind: "str", "int", "number", "bool", "ratio" (0 < x < 1, or "1%"), "count" (an int, or "1M"), "size" (bytes: "1gb"),
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
    "allow_outside": "bool",  # a csv or parquet path outside the file's directory, on purpose
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
    "client_memory": "size",
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_SIMPLE_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "str": lambda v: None if isinstance(v, str) and v != "" else "must be a non-empty string",
    "envname": lambda v: (
        None
        if isinstance(v, str) and ENV_NAME.fullmatch(v)
        else "must be the name of an environment variable (letters, digits, _), never the secret itself"
    ),
    "int": lambda v: None if _is_int(v) else f"must be a whole number, got {v!r}",
    "str|int": lambda v: None if (isinstance(v, str) and v) or _is_int(v) else f"must be a name or a number, got {v!r}",
    "bool": lambda v: None if isinstance(v, bool) else f"must be true or false, got {v!r}",
    "number": lambda v: (
        None
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        else f"must be a number, got {v!r}"
    ),
}


def _check(kind: Kind, value: Any) -> str | None:
    """What is wrong with ``value`` for ``kind`` (None: nothing)."""
    if isinstance(kind, tuple) and kind[0] == "choice":
        return None if value in kind[1] else f"must be one of {', '.join(map(repr, kind[1]))}, got {value!r}"
    if isinstance(kind, tuple) and kind[0] == "range":
        return _check_range(kind, value)
    if kind in _SIMPLE_CHECKS:
        return _SIMPLE_CHECKS[kind](value)
    return _check_parsed(kind, value)


def _check_range(kind: Kind, value: Any) -> str | None:
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


def _check_parsed(kind: Kind, value: Any) -> str | None:
    """The kinds whose values are parsed as the command line parses them: ratio, count, duration."""
    from bloomctl.sizing.bloom import parse_count, parse_error_rate, parse_size

    if isinstance(value, bool):
        return "must be a number, not true or false"
    try:
        if kind == "ratio":
            parse_error_rate(value)
        elif kind == "count":
            parse_count(value)
        elif kind == "size":
            parse_size(value)
        elif kind == "count|auto":
            if value != "auto":
                parse_count(value)
        elif kind == "duration":
            parse_duration(value)
    except (UsageError, ValueError) as exc:
        return str(exc).replace("%%", "%")
    return None


def check_keys(data: dict[str, Any]) -> list[Problem]:
    """Every key of the parsed file against the table: unknown keys, secrets, values of the wrong kind."""
    found: list[Problem] = []
    _walk(SPEC, data, (), found)
    return found


def _walk(spec: dict[str, Kind], data: dict[str, Any], path: tuple[str, ...], found: list[Problem]) -> None:
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
        # bytes, as redis.conf writes them (1gb = 2^30, 1g = 10^9) or as bloomctl prints them (1GiB)
        "size": {
            "oneOf": [
                {"type": "integer", "minimum": 1},
                {
                    "type": "string",
                    "pattern": r"^\s*[0-9][0-9_.]*([eE][+-]?[0-9]+)?\s*([kmgtKMGT]([bB]|[iI][bB])?|[bB])?\s*$",
                },
            ]
        },
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
