"""Prometheus textfiles: the exposition text (prometheus_client), written atomically.

node_exporter's textfile collector reads whatever is in the directory when it is scraped, so a
file is written beside its target and renamed over it (one step: the collector never reads half a
file). ``bloomctl_last_success_timestamp_seconds`` survives a failed run: the failing run copies
the previous file's value, so "how long since the last success" keeps growing until one succeeds.
``rebuild --metrics-file`` writes each filter's gauges, and keeps those of the filters a run did
not rebuild.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bloomctl.cli.output import current
from bloomctl.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from bloomctl.declared.rebuild_all import Run

LAST_SUCCESS = "bloomctl_last_success_timestamp_seconds"
LAST_SUCCESS_HELP = "When this job last succeeded (exit 0), in seconds since the epoch."

# (name, help, label names, [(label values, value), ...]); a metric with no samples is left out
Metric = tuple[str, str, tuple[str, ...], Sequence[tuple[tuple[str, ...], float]]]


def exposition(metrics: Iterable[Metric]) -> str:
    """The text exposition format of these gauges (names, help, escaping: prometheus_client's)."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    for name, help_text, labels, samples in metrics:
        if not samples:
            continue
        gauge = Gauge(name, help_text, labels, registry=registry)
        for values, value in samples:
            (gauge.labels(*values) if labels else gauge).set(float(value))
    return generate_latest(registry).decode()


def check_writable(path: str, option: str, formats: tuple[str, ...] = (), *, make_dirs: bool = False) -> None:
    """Refuses, before any work, a file that cannot be written (a missing or read-only
    directory), that is not a regular file (a device, a FIFO: renaming over it would replace
    it), or that is named like one of the command's ``formats`` (`-o json` meant `--format
    json`). With ``make_dirs`` (a report's `-o reports/x.xml` in a fresh CI checkout) the missing
    directories are made, as `mkdir -p` would; a metrics file's are not: a collector's directory
    that is not there is a typo to report, not one to fill."""
    if path.endswith(("/", os.sep)):
        raise UsageError("%s %s names a directory: give the file's name in it", option, path)
    if path in formats:
        raise UsageError(
            "%s %s writes a file named %s: did you mean --format %s? (for that file, give ./%s)",
            option,
            path,
            path,
            path,
            path,
        )
    target = Path(os.path.realpath(path))  # a link: its target is written, the link kept
    if target.exists() and not target.is_file():
        raise UsageError("%s %s is not a regular file (a directory, device or FIFO)", option, path)
    directory = target.parent
    if not directory.exists() and not make_dirs:
        raise UsageError("%s %s: the directory %s does not exist", option, path, directory)
    if not directory.exists():
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError("%s %s: cannot make the directory %s: %s", option, path, directory, exc.strerror) from None
    if not directory.is_dir():
        raise UsageError("%s %s: %s is not a directory", option, path, directory)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError("%s %s: cannot write into %s (a file is written there, then renamed)", option, path, directory)


def write_atomically(path: str, text: str, option: str) -> None:
    """Writes a temporary file in the target's directory, syncs it, then renames it over the target
    (through a symbolic link: over the file it points to). The file keeps an existing file's mode,
    else gets 0644 (a collector running as another user reads it)."""
    check_writable(path, option)
    target = Path(os.path.realpath(path))
    try:
        mode = target.stat().st_mode & 0o777
    except OSError:
        mode = 0o644
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise UsageError("%s %s: cannot write: %s", option, path, exc.strerror or exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException as exc:  # a signal too: no temporary file is left behind
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError):
            raise UsageError("%s %s: cannot write: %s", option, path, exc.strerror or exc) from None
        raise


def previous_success(path: str | None, labels: Mapping[str, str]) -> float | None:
    """The last-success timestamp with these labels in the file a previous run wrote, if any."""
    if not path:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    from prometheus_client.parser import text_string_to_metric_families

    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == LAST_SUCCESS and dict(sample.labels) == dict(labels):
                    value = float(sample.value)
                    return value if math.isfinite(value) and value > 0 else None  # a damaged file: none
    except ValueError:  # not a metrics file (a previous run never wrote it): no timestamp to keep
        return None
    return None


def last_success(path: str | None, labels: Mapping[str, str], succeeded: bool, now: float) -> Metric:
    """``bloomctl_last_success_timestamp_seconds``: now on success, else the previous file's value."""
    names = tuple(labels)
    value = now if succeeded else previous_success(path, labels)
    samples: list[tuple[tuple[str, ...], Any]] = [] if value is None else [(tuple(labels.values()), value)]
    return (LAST_SUCCESS, LAST_SUCCESS_HELP, names, samples)


# --- rebuild's metrics file ---------------------------------------------------------------------


def write_metrics_safely(
    path: str, runs: list[Run], *, all_code: int | None = None, keep_keys: set[str] | None = None
) -> None:
    """The metrics file of these runs; a failure to write it is a warning (the run's own failure,
    if any, is what the user must see, with its code)."""
    try:
        write_metrics(path, runs, all_code=all_code, keep_keys=keep_keys)
    except Exception as failed:
        current().warn(f"no metrics written: {failed}")


REBUILD_GAUGES = (
    ("bloomctl_rebuild_duration_seconds", "How long the run took.", lambda r: r.seconds),
    ("bloomctl_rebuild_items", "Items read from the source (so far, when it failed).", lambda r: r.items),
    ("bloomctl_rebuild_exit_code", "The run's exit code (0: done).", lambda r: r.code),
    ("bloomctl_rebuild_success", "1 when the run succeeded (exit 0), else 0.", lambda r: int(r.code == 0)),
    ("bloomctl_rebuild_swapped", "1 when the run swapped the new filter in.", lambda r: int(r.swapped)),
)
ALL_EXIT_CODE = ("bloomctl_rebuild_all_exit_code", "The exit code of the last `rebuild --all` (0: every filter done).")


def write_metrics(
    path: str, runs: list[Run], *, all_code: int | None = None, keep_keys: set[str] | None = None
) -> None:
    """``rebuild --metrics-file``: each run's gauges, labelled by key; a key's last success kept on
    failure; and the samples of keys this run did not rebuild kept as the file had them (a filter
    not due keeps its last rebuild's), those of ``keep_keys`` only when given (``--all``: the keys
    the file declares). With ``all_code``, the exit code of ``rebuild --all``."""
    rebuilt = [r for r in runs if r.action == "rebuild" and r.code is not None]
    keys = {r.key for r in rebuilt}

    def kept_key(key: str | None) -> bool:
        return bool(key) and key not in keys and (keep_keys is None or key in keep_keys)

    kept = _previous_samples(path, {name for name, _h, _g in REBUILD_GAUGES} | {LAST_SUCCESS, ALL_EXIT_CODE[0]})
    metrics: list[Metric] = []
    for name, help_text, getter in REBUILD_GAUGES:
        samples: list[tuple[tuple[str, ...], float]] = [
            ((labels["key"],), value) for labels, value in kept.get(name, []) if kept_key(labels.get("key"))
        ]
        samples += [((r.key,), getter(r)) for r in rebuilt]
        metrics.append((name, help_text, ("key",), samples))
    now = time.time()
    success: dict[tuple[str, ...], float] = {}
    for labels, value in kept.get(LAST_SUCCESS, []):
        command, key = labels.get("command", ""), labels.get("key", "")
        if (command == "rebuild" and kept_key(key)) or (command == "rebuild --all" and all_code is None):
            success[(command, key)] = value
    for run in rebuilt:
        latest = last_success(path, {"command": "rebuild", "key": run.key}, run.code == 0, now)[3]
        success.update({tuple(values): value for values, value in latest})
    if all_code is not None:
        metrics.append((*ALL_EXIT_CODE, (), [((), all_code)]))
        latest = last_success(path, {"command": "rebuild --all", "key": ""}, all_code == 0, now)[3]
        success.update({tuple(values): value for values, value in latest})
    else:  # a single filter's run keeps the last --all's code where the file has it
        metrics.append((*ALL_EXIT_CODE, (), [((), value) for _labels, value in kept.get(ALL_EXIT_CODE[0], [])[:1]]))
    metrics.append((LAST_SUCCESS, LAST_SUCCESS_HELP, ("command", "key"), sorted(success.items())))
    write_atomically(path, exposition(metrics), "--metrics-file")


def _previous_samples(path: str, names: set[str]) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The samples of these metrics in the file a previous run wrote (none when it is not one)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = Path(path).read_text(encoding="utf-8")
        found: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in names:
                    found.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
        return found
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
