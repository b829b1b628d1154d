"""What a filter declared in bloomctl.toml asks for, in the library's terms: its connection, plan,
source, rebuild options and thresholds, the optional dependencies its rebuild needs, and how the
filter on the server differs from it (drift).

``bloomctl.declared.config`` reads and checks the file; this module turns one declaration into the calls
the commands make (``rebuild``, ``reserve``, ``window.create``), and compares the server's filter
with it. Nothing here writes to a server.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bloomctl.declared.config import Config, Declared, Profile
from bloomctl.declared.schema import parse_duration
from bloomctl.defaults import (
    AUTO,
    DEFAULT_CATCHUP_SKEW,
    DEFAULT_CLIENT_MEMORY,
    DEFAULT_DELIMITER,
    DEFAULT_ENCODING,
    DEFAULT_HEADROOM,
    DEFAULT_KEEP_OLD_SECONDS,
    DEFAULT_MIN_RATIO,
    DEFAULT_SKIP_BAD_ROWS,
    DEFAULT_VERIFY_SAMPLE,
    DEFAULT_WINDOW,
    PASSWORD_ENV,
)
from bloomctl.errors import MissingExtra, StateConflict, UsageError
from bloomctl.lifecycle.metadata import RECIPE, recipe_field
from bloomctl.server.connection import ConnectionSettings, settings_from, url_has_secret

if TYPE_CHECKING:  # pragma: no cover - annotations only: the fill module loads when thresholds are read
    from bloomctl.lifecycle.fill import Thresholds

SOURCE_KINDS = ("csv", "parquet", "sql")
BACKEND_NAMES = {  # a declared backend, and the backends' own names it covers
    "module-free": {"bitmap", "lua-cuckoo"},
    "bitmap": {"bitmap", "lua-cuckoo"},
    "redisbloom": {"redisbloom", "redisbloom-cuckoo"},
}


def settings_for(profile: Profile | None, environ: dict[str, str] | None = None, **override: Any) -> ConnectionSettings:
    """The connection of a profile; ``override`` (the command line's own --url, --host, --port...)
    wins. The password comes from the profile's password_file, or the variable password_env names."""
    env = dict(os.environ if environ is None else environ)
    kwargs: dict[str, Any] = {}
    if profile is not None:
        # a profile's password is its own: $BLOOMCTL_PASSWORD (meant for the command line's server)
        # is never sent to the profile's server; unless the command line replaces that server
        if not {"url", "host", "port"} & {name for name, value in override.items() if value is not None}:
            env.pop(PASSWORD_ENV, None)
        if profile.password_env:
            if profile.password_env not in env:
                raise UsageError(
                    "the profile %r takes its password from $%s, which is not set", profile.name, profile.password_env
                )
            env[PASSWORD_ENV] = env[profile.password_env]
        kwargs = {
            "url": profile.url,
            "password_file": profile.password_file,
            "cluster": profile.cluster,
            "tls_ca": profile.tls_ca,
            "tls_cert": profile.tls_cert,
            "tls_key": profile.tls_key,
        }
        if profile.connect_timeout is not None:
            kwargs["connect_timeout"] = profile.connect_timeout
        if profile.timeout is not None:
            kwargs["timeout"] = profile.timeout
    kwargs.update({name: value for name, value in override.items() if value is not None})
    settings = settings_from(environ=env, **{k: v for k, v in kwargs.items() if v is not None})
    if profile is not None and not override.get("password_file"):
        source = f"${profile.password_env}" if profile.password_env else profile.password_file
        if source and settings.password is not None and not url_has_secret(settings.url):
            settings = dataclasses.replace(settings, password_from=source)  # (a URL's own password wins)
    return settings


def source_values(
    decl: Declared, environ: dict[str, str] | None = None, *, db_url: str | None = None
) -> dict[str, Any]:
    """``open_source``'s arguments for the declared source (the database URL read from the variable
    the file names, unless ``db_url``, the command line's, is given)."""
    source = decl.source
    if not source:
        raise UsageError("the filter %r declares no source to rebuild from (it is fed by the application)", decl.name)
    values: dict[str, Any] = {}
    if "csv" in source:
        values["csv_path"] = source["csv"]
    elif "parquet" in source:
        values["parquet_path"] = source["parquet"]
    else:
        values.update(sql=source["sql"], db_url=db_url or declared_db_url(decl, environ))
    for name in ("template", "prefix", "delimiter", "encoding", "skip_bad_rows", "header"):
        if name in source:
            values[name] = source[name]
    if "column" in source:
        values["column"] = str(source["column"])
    return values


def declared_db_url(decl: Declared, environ: dict[str, str] | None = None) -> str:
    """The database URL of a SQL source, from the variable the file names."""
    env = os.environ if environ is None else environ
    variable = decl.source.get("db_url_env")
    if not variable:
        raise UsageError("the filter %r declares no SQL source (give `db_url`)", decl.name)
    if not env.get(variable):
        raise UsageError("the filter %r reads its database URL from $%s, which is not set", decl.name, variable)
    return env[variable]


@dataclass(frozen=True)
class Extras:
    """What a declared filter's rebuild needs beyond bloomctl's own dependencies, on this machine."""

    needed: bool  # its source, or its build, needs an optional dependency at all
    missing: MissingExtra | None = None  # the first one that is not installed here
    unknown: str | None = None  # why what it needs cannot be told here


def extras_of(decl: Declared, environ: dict[str, str] | None = None) -> Extras:
    """The optional dependencies a rebuild of ``decl`` needs, checked here: pyarrow for Parquet,
    numpy for ``rebuild.build = "client"``, the driver of a SQL source's URL (read from its
    variable: when that is not set, the driver cannot be told). A CSV source needs none."""
    from bloomctl import extras

    if not decl.source:
        return Extras(False)
    features = [extras.PARQUET] if "parquet" in decl.source else []
    if decl.rebuild.get("build") == "client":
        features.append(extras.CLIENT_BUILD)
    for feature in features:
        problem = extras.missing(feature)
        if problem is not None:
            return Extras(True, problem)
    if "sql" not in decl.source:
        return Extras(bool(features))
    env = os.environ if environ is None else environ
    variable = decl.source.get("db_url_env")
    url = env.get(variable) if variable else None
    if not url:
        return Extras(True, unknown=f"${variable} is not set here: which database driver it needs is not known")
    from bloomctl.sources.sql import missing_for

    return Extras(True, missing_for(url))


def declared_recipe(decl: Declared) -> str | None:
    """The item recipe the metadata of a filter rebuilt from the declared source records."""
    if not decl.source:
        return None
    kind = next(k for k in SOURCE_KINDS if k in decl.source)
    column = decl.source.get("column")
    recipe = {
        "source": kind,
        "column": str(column) if column is not None else None,
        "template": decl.source.get("template") or None,
        "prefix": decl.source.get("prefix") or None,
    }
    return recipe_field(recipe)


# the rebuild table's keys that are the command line's options of the same name
REBUILD_OPTIONS = (
    "swap",
    "keep_old",
    "min_ratio",
    "allow_shrink",
    "allow_recipe_change",
    "verify_sample",
    "since_column",
    "catchup_skew",
    "build",
    "jobs",
    "split_column",
    "client_memory",
    "batch_size",
    "max_rate",
    "lock_wait",
)


def rebuild_values(decl: Declared) -> dict[str, Any]:
    """The ``rebuild`` command's option values the declaration sets (by the options' names): the
    filter's parameters and its rebuild table. A declared rebuild swaps unless ``swap = false``."""
    values: dict[str, Any] = {
        "capacity": decl.capacity if decl.capacity is not None else "auto",
        "error_rate": decl.error_rate,
        "expansion": decl.expansion,
        "nonscaling": decl.nonscaling or None,
        "backend": decl.backend,
        "filter_type": decl.kind,
        "shards": decl.shards,
        "bucket_size": decl.bucket_size,
        "max_iterations": decl.max_iterations,
        "fingerprint_bits": str(decl.fingerprint_bits) if decl.fingerprint_bits is not None else None,
        "headroom": float(decl.headroom) if decl.headroom is not None else None,
        "swap": True,
    }
    for name in REBUILD_OPTIONS:
        if name in decl.rebuild:
            values[name] = decl.rebuild[name]
    if "client_memory" in values:
        from bloomctl.sizing.bloom import parse_size

        values["client_memory"] = parse_size(values["client_memory"])
    if "verify" in decl.rebuild:
        values["verify_mode"] = decl.rebuild["verify"]
    return {name: value for name, value in values.items() if value is not None}


# --- a declared filter's rebuild: the declaration's settings under the command line's -------------

# the rebuild command's options that say where the items come from and how each is made of a row
SOURCE_OPTIONS = (
    "csv_path",
    "parquet_path",
    "sql",
    "db_url",
    "column",
    "delimiter",
    "encoding",
    "template",
    "prefix",
    "skip_bad_rows",
)
SOURCE_FLAGS = {"csv_path", "parquet_path", "sql"}  # those that name the source itself


def rebuild_defaults() -> dict[str, Any]:
    """The ``rebuild`` command's option values when none is given, by the options' names: what a
    declared filter's rebuild starts from (``rebuild --all``, ``apply``'s first build)."""
    return {
        **{name: None for name in SOURCE_OPTIONS},
        "no_header": False,
        "delimiter": DEFAULT_DELIMITER,
        "encoding": DEFAULT_ENCODING,
        "skip_bad_rows": DEFAULT_SKIP_BAD_ROWS,
        "capacity": None,
        "headroom": float(DEFAULT_HEADROOM),
        "error_rate": None,
        "expansion": None,
        "nonscaling": False,
        "backend": AUTO,
        "shards": None,
        "filter_type": None,
        "bucket_size": None,
        "max_iterations": None,
        "fingerprint_bits": None,
        "build": AUTO,
        "jobs": 1,
        "split_column": None,
        **{name: None for name in ("engine", "scheduler", "spark_master", "spark_remote", "engine_slots")},
        "client_memory": DEFAULT_CLIENT_MEMORY,
        "batch_size": None,
        "max_rate": None,
        "window": DEFAULT_WINDOW,
        "verify_sample": DEFAULT_VERIFY_SAMPLE,
        "verify_mode": "sample",
        "since_column": None,
        "catchup_skew": float(DEFAULT_CATCHUP_SKEW),
        "swap": False,
        "lock_wait": 0.0,
        "keep_old": float(DEFAULT_KEEP_OLD_SECONDS),
        "min_ratio": float(DEFAULT_MIN_RATIO),
        "allow_shrink": False,
        "allow_recipe_change": False,
        "dry_run": False,
        "force": False,
    }


def why_not_rebuilt(decl: Declared) -> str | None:
    """Why a declared filter is not rebuilt, when it is not: a window is rotated."""
    if decl.kind == "windowed":
        return f"{decl.name!r} is a windowed filter: it is rotated, not rebuilt (bloomctl window rotate {decl.key})"
    return None


def declared_inputs(
    decl: Declared, options: dict[str, Any], explicit: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The source and the options of a declared filter's rebuild: the declaration's, and over them
    what the command line gave (``explicit``; ``options`` holds every option's value). A source
    named there replaces the declared one, and then the new filter is swapped in only when the
    command line says so (it may not hold what the application added)."""
    refused = why_not_rebuilt(decl)
    if refused is not None:
        raise UsageError("%s", refused)
    options = {**options, **{name: value for name, value in explicit.items() if name in options}}
    source = {name: options.pop(name) for name in SOURCE_OPTIONS}
    source["header"] = not options.pop("no_header")
    named_source = bool(set(explicit) & SOURCE_FLAGS)
    if named_source:
        variable = decl.source.get("db_url_env")
        if (
            source.get("sql")
            and "db_url" not in explicit
            and variable
            and (os.environ.get(variable) or not source["db_url"])
        ):
            source["db_url"] = declared_db_url(decl)  # the declared database, for the command line's query
    else:
        given = source_values(decl, db_url=explicit.get("db_url"))
        for name in ("csv_path", "parquet_path", "sql"):
            source[name] = given.get(name)
        for name, value in given.items():
            flag = "no_header" if name == "header" else name
            if flag not in explicit:
                source[name] = value
    for name, value in rebuild_values(decl).items():
        if name in explicit or (name == "swap" and named_source):
            continue
        options[name] = value
    return source, options


def thresholds(decl: Declared) -> Thresholds:
    """The fill-ratio limits the declaration sets (the type's own defaults for the rest)."""
    from bloomctl.lifecycle.fill import Thresholds
    from bloomctl.sizing.bloom import parse_error_rate

    given = decl.thresholds
    max_fpr = parse_error_rate(given["max_fpr"]) if "max_fpr" in given else None
    return Thresholds(warn=given.get("warn"), max=given.get("max"), max_fpr=max_fpr)


# --- the server's filter against the declaration ---------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """One filter, or a sharded one as a whole (its members' numbers, judged by the worst)."""

    state: Any
    metadata: dict[str, str]
    manifest: Any = None


def summarize(description: Any) -> Summary:
    """``lifecycle.describe``'s answer as one state and one metadata (a sharded filter's: its
    members' combined, the first member's metadata); StateConflict when no member is there."""
    from bloomctl.keys import to_display
    from bloomctl.lifecycle.sharded import ShardedDescription, ShardedState

    if not isinstance(description, ShardedDescription):
        return Summary(description.state, description.metadata)
    present = [member for member in description.shards if member is not None]
    if not present:
        raise StateConflict("every member of the sharded filter %r is missing", to_display(description.manifest.key))
    state = ShardedState.of([member.state for member in present])
    return Summary(state, present[0].metadata, description.manifest)


@dataclass(frozen=True)
class Difference:
    what: str  # the parameter
    declared: Any
    found: Any
    rebuildable: bool  # a rebuild under the same key resolves it (else: another key, or recreate)

    def describe(self) -> str:
        return f"{self.what}: declared {_shown(self.declared)}, found {_shown(self.found)}"


def _shown(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "none"}[value]
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        from bloomctl.sizing.bloom import format_rate

        return format_rate(value)
    return str(value)


def _close(a: float | None, b: float | None) -> bool:
    return a is None or b is None or math.isclose(a, b, rel_tol=1e-9)


def drift(decl: Declared, description: Any) -> list[Difference]:
    """How the filter ``description`` (``lifecycle.describe``'s) differs from its declaration."""
    state = description.state if hasattr(description, "state") else description
    meta = getattr(description, "metadata", {}) or {}
    diffs: list[Difference] = []
    kind = getattr(state, "kind", "bloom")
    if kind != decl.kind:
        return [Difference("type", decl.kind, kind, False)]
    backend = state.backend
    if decl.backend != "auto" and backend not in BACKEND_NAMES[decl.backend]:
        diffs.append(Difference("backend", decl.backend, backend, False))
    manifest = getattr(description, "manifest", None)
    found_shards = manifest.shards if manifest is not None else None
    if decl.shards != found_shards:
        diffs.append(Difference("shards", decl.shards, found_shards, False))
    if decl.capacity is not None and manifest is not None and decl.shards == found_shards:
        per_shard = max(math.ceil(decl.capacity / manifest.shards), 1)  # (planner.shard_plan's split)
        if per_shard != manifest.capacity:
            diffs.append(Difference("capacity per shard", per_shard, manifest.capacity, True))
    elif decl.capacity is not None and manifest is None:
        # what bloomctl recorded when it made the filter; else (made by BF.ADD, say) what it holds
        recorded = _int(meta.get("capacity"))
        found = recorded if recorded is not None else getattr(state, "reserved_capacity", None)
        # (a cuckoo filter's own count is its slots: the capacity rounded up to a power of two)
        rounded = (
            recorded is None and kind == "cuckoo" and found is not None and decl.capacity <= found < 2 * decl.capacity
        )
        if found is not None and found != decl.capacity and not rounded:
            diffs.append(Difference("capacity", decl.capacity, found, True))
    recorded_rate = _float(meta.get("error_rate"))
    if kind == "bloom" and decl.error_rate is not None and not _close(decl.error_rate, recorded_rate):
        diffs.append(Difference("error_rate", decl.error_rate, recorded_rate, True))
    diffs += _expansion_drift(decl, state)
    if kind == "cuckoo":
        for name in ("bucket_size", "max_iterations", "fingerprint_bits"):
            want, have = getattr(decl, name), getattr(state, name, None)
            if want is not None and have is not None and want != have:
                diffs.append(Difference(name, want, have, True))
    return diffs


def _expansion_drift(decl: Declared, state: Any) -> list[Difference]:
    found = "nonscaling" if state.expansion is None else state.expansion
    if decl.nonscaling and found != "nonscaling":
        return [Difference("nonscaling", True, found, True)]
    if decl.expansion is not None and found != decl.expansion:
        return [Difference("expansion", decl.expansion, found, True)]
    return []


def recipe_drift(decl: Declared, description: Any) -> Difference | None:
    """The declared item recipe against the one the filter was built with (None: equal, or not recorded)."""
    meta = getattr(description, "metadata", {}) or {}
    recorded, declared = meta.get(RECIPE), declared_recipe(decl)
    if recorded is None or declared is None or recorded == declared:
        return None
    from bloomctl.lifecycle.metadata import describe_recipe

    return Difference("recipe", describe_recipe(declared), describe_recipe(recorded), True)


def window_drift(decl: Declared, spec: Any) -> list[Difference]:
    from bloomctl.window.periods import parse_period

    diffs = []
    for name, want, have in (
        ("window.period", parse_period(decl.window["period"]), spec.period),
        ("window.keep", decl.window["keep"], spec.keep),
        ("window.type", decl.window.get("type", "bloom"), spec.kind),
        ("capacity", decl.capacity if decl.capacity is not None else "auto", spec.capacity or "auto"),
    ):
        if want != have:
            diffs.append(Difference(name, want, have, False))
    if decl.min_capacity is not None and decl.capacity is None and decl.min_capacity != spec.min_capacity:
        diffs.append(Difference("min_capacity", decl.min_capacity, spec.min_capacity, False))
    if decl.backend != "auto" and spec.backend not in BACKEND_NAMES[decl.backend]:
        diffs.append(Difference("backend", decl.backend, spec.backend, False))
    if decl.error_rate is not None and not _close(decl.error_rate, spec.error_rate):
        diffs.append(Difference("error_rate", decl.error_rate, spec.error_rate, False))
    if decl.nonscaling and spec.expansion is not None:
        diffs.append(Difference("nonscaling", True, spec.expansion, False))
    elif decl.expansion is not None and spec.expansion != decl.expansion:
        diffs.append(Difference("expansion", decl.expansion, spec.expansion or "nonscaling", False))
    return diffs


def drift_fix(decl: Declared, path: str, diffs: list[Difference]) -> str:
    """What resolves these differences of the filter from its declaration."""
    if decl.kind == "windowed":
        return "a window keeps its settings: create it under a new name, or declare what it is"
    if not all(d.rebuildable for d in diffs):
        return "a rebuild cannot change this: build the filter under a new key, or declare what it is"
    if not decl.source:
        return "the application feeds it: reserve a new key as declared, or declare what the server has"
    option = " --allow-recipe-change" if any(d.what == "recipe" for d in diffs) else ""
    return f"bloomctl --config {path} rebuild {decl.name}{option}"


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def every_seconds(decl: Declared) -> float | None:
    every = decl.rebuild.get("every")
    return parse_duration(every) if every is not None else None


def profiles_of(config: Config, decls: list[Declared]) -> list[str]:
    """The profiles the filters use, in order, each once."""
    return list(dict.fromkeys(d.profile for d in decls))
