"""Prometheus textfiles: the exposition text (prometheus_client), written atomically.

node_exporter's textfile collector reads whatever is in the directory when it is scraped, so a
file is written beside its target and renamed over it (one step: the collector never reads half a
file). ``bloomctl_last_success_timestamp_seconds`` survives a failed run: the failing run copies
the previous file's value, so "how long since the last success" keeps growing until one succeeds.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bloomctl.errors import UsageError

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


def check_writable(path: str, option: str) -> None:
    """Refuses, before any work, a file that cannot be written (a missing or read-only directory)
    or that is not a regular file (a device, a FIFO: renaming over it would replace it)."""
    target = Path(os.path.realpath(path))  # a link: its target is written, the link kept
    if target.exists() and not target.is_file():
        raise UsageError("%s %s is not a regular file (a directory, device or FIFO)", option, path)
    directory = target.parent
    if not directory.is_dir():
        raise UsageError("%s %s: the directory %s does not exist", option, path, directory)
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


def exit_code_of(exc: BaseException) -> int:
    """The exit code bloomctl ends with for this exception (what the command group makes of it)."""
    import click

    from bloomctl.errors import BloomctlError, ExitCode, Terminated

    if isinstance(exc, BloomctlError):
        return int(exc.exit_code)
    if isinstance(exc, Terminated):
        return int(ExitCode.TERMINATED)
    if isinstance(exc, KeyboardInterrupt):
        return int(ExitCode.INTERRUPTED)
    if isinstance(exc, click.exceptions.Exit):
        return int(exc.exit_code)
    if isinstance(exc, click.ClickException):  # a usage error: 2
        return int(exc.exit_code)
    if type(exc).__module__.startswith("redis"):
        return int(ExitCode.CONNECTION)
    return int(ExitCode.INTERNAL)
