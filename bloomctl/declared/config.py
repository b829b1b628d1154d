"""bloomctl.toml: one file that declares an application's filters, found, read and checked.

Connection profiles (a URL, where the password comes from, TLS, Cluster) and filters (key, type,
backend, capacity, error rate, the item recipe of their source, rebuild options and schedule,
thresholds), read with the standard library's ``tomllib``. Every key is checked against one table
of what it may hold (``bloomctl.declared.schema``, which also gives the JSON Schema), then against
the rules of how keys go together (``rules``); each problem names the file and its line
(``locate``). Secrets are never in the file: a profile names a password file or an environment
variable, and a database URL comes from an environment variable. docs/config.md describes every key.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bloomctl.declared.locate import line_of, locate
from bloomctl.declared.rules import check_rules
from bloomctl.declared.schema import check_keys
from bloomctl.defaults import CONFIG_ENV
from bloomctl.errors import UsageError

DEFAULT_FILE = "bloomctl.toml"
PATH_KEYS = ("password_file", "tls_ca", "tls_cert", "tls_key")


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
    found = check_keys(data) + check_rules(data)
    found += _outside(data, os.path.dirname(name)) if not found else []
    where = locate(text)
    if found:
        problems = sorted(
            ((line_of(where, path), f"{'.'.join(path) or 'the file'}: {text}") for path, text in found),
            key=lambda p: (p[0] or 0, p[1]),
        )
        raise ConfigError(name, problems)
    base = os.path.dirname(name)
    profiles = {n: Profile(name=n, **_relative(body, PATH_KEYS, base)) for n, body in data.get("profiles", {}).items()}
    filters = {}
    for n, body in data.get("filters", {}).items():
        if "source" in body:
            body = {**body, "source": _relative(body["source"], ("csv", "parquet"), base)}
        filters[n] = _declared(n, body, line_of(where, ("filters", n)))
    return Config(name, profiles, filters)


def _outside(data: dict[str, Any], base: str) -> list[tuple[tuple[str, ...], str]]:
    """A source file outside the config file's directory: refused unless ``allow_outside`` says it
    is meant. Whoever may edit the file would otherwise read any file bloomctl can (a path ``../``
    away, an absolute one, a symbolic link out), and a refused header echoed its first line."""
    home = os.path.realpath(base or ".")
    problems: list[tuple[tuple[str, ...], str]] = []
    for name, body in data.get("filters", {}).items():
        source = body.get("source") if isinstance(body, dict) else None
        if not isinstance(source, dict) or source.get("allow_outside") is True:
            continue
        for kind in ("csv", "parquet"):
            value = _relative(source, (kind,), base).get(kind)
            if not isinstance(value, str) or value == "-":
                continue
            real = os.path.realpath(value)
            if os.path.commonpath([home, real]) != home:
                problems.append(
                    (
                        ("filters", name, "source", kind),
                        f"{source[kind]!r} is outside the file's directory ({home}): put the file there, or set "
                        "source.allow_outside = true if reading it from there is meant",
                    )
                )
    return problems


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
