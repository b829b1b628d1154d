"""A rebuild's progress on stderr, and the one call that runs a rebuild with it.

tqdm on a terminal with text logs, a log line every few seconds elsewhere; ``--quiet`` silences
both. ``run_one`` is what ``rebuild KEY``, ``rebuild --all`` and ``apply``'s first builds call:
the library's rebuild with this progress wired in, its outcome recorded in a ``Run``.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

import click

from bloomctl.cli.context import AppContext
from bloomctl.cli.options import cuckoo_values
from bloomctl.cli.output import Output
from bloomctl.cli.render import to_flags
from bloomctl.declared.rebuild_all import Run
from bloomctl.errors import ExitCode, UsageError, classify, first_line

if TYPE_CHECKING:  # pragma: no cover - the library loads when a command runs (start-up time)
    from bloomctl.distributed.frame import FrameSource
    from bloomctl.rebuild import RebuildOptions, RebuildReport

LOG_EVERY_SECONDS = 5.0


class Reporter:
    """Progress and log lines on stderr (through the command's Output): tqdm on a terminal with
    text logs, a log line every few seconds elsewhere."""

    def __init__(self, output: Output, total: int | None = None) -> None:
        self.output = output
        self.bar: Any = None
        self.total = total
        self.last_log = time.monotonic()
        self.started = time.monotonic()
        self.done = 0

    def event(self, message: str, fields: dict[str, Any]) -> None:
        if fields.get("phase") == "count" and "rows" in fields:
            self.total = fields["rows"]
        level = "warning" if "warning" in fields else str(fields.get("level", "info"))
        if self.bar is not None and self.output.log_format == "text" and not self.output.quiet:
            self.bar.clear()
            self.output.log(message, fields, level)
            self.bar.refresh()
        else:
            self.output.log(message, fields, level)

    def progress(self, done: int) -> None:
        step, self.done = done - self.done, done  # counted also when quiet: the metrics file says it
        if self.output.quiet:
            return
        if sys.stderr.isatty() and self.output.log_format == "text":
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=self.total, unit=" items", unit_scale=True, file=sys.stderr, leave=False)
            self.bar.update(step)
            return
        now = time.monotonic()
        if now - self.last_log >= LOG_EVERY_SECONDS:
            self.last_log = now
            rate = done / (now - self.started) if now > self.started else 0
            total = f" of ~{self.total:,}" if self.total else ""
            self.event(
                f"loaded {done:,}{total} items ({rate:,.0f} items/s)",
                {"phase": "load", "items": done, "items_per_second": round(rate)},
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_one(
    app: AppContext,
    client: Any,
    server: Any,
    key: str,
    source_values: dict[str, Any],
    options: dict[str, Any],
    run: Run,
) -> RebuildReport:
    """One rebuild with its progress on stderr; ``run`` records its outcome (a failure's code too)."""
    from bloomctl.rebuild import rebuild
    from bloomctl.sources import open_source

    reporter = Reporter(app.output)
    run.started = time.monotonic()
    try:  # the source is opened inside, so that a missing file or driver also lands in the metrics file
        settings = rebuild_options(dict(options))
        source = engine_source(settings.engine, source_values) if settings.engine else open_source(**source_values)
        report = rebuild(client, server, key, source, settings, events=reporter.event, progress=reporter.progress)
    except BaseException as exc:
        run.code, run.items, run.detail = classify(exc).exit_code, reporter.done, failure_line(exc)
        raise
    finally:
        reporter.close()
        run.seconds = time.monotonic() - run.started
    run.code, run.items, run.swapped = int(ExitCode.OK), report.source.items, report.swapped
    run.detail = f"{report.source.items:,} items in {report.seconds:.1f}s" + (", swapped" if report.swapped else "")
    return report


ENGINE_PLACES = ("scheduler", "spark_master", "spark_remote", "engine_slots")  # where --engine runs


def rebuild_options(options: dict[str, Any]) -> RebuildOptions:
    """The command's options (the source's taken out) as the library's ``RebuildOptions``."""
    from bloomctl.rebuild import RebuildOptions

    engine, places = options.pop("engine", None), {name: options.pop(name, None) for name in ENGINE_PLACES}
    if engine is not None:
        from bloomctl.distributed import open_engine

        slots = places.pop("engine_slots")
        options["engine"] = open_engine(engine, slots=slots, **places)
    elif any(value is not None for value in places.values()):
        raise UsageError("--scheduler, --spark-master, --spark-remote and --engine-slots go with --engine")
    options["verify_all"] = options.pop("verify_mode") == "all"
    cuckoo = [options.pop(name) for name in ("bucket_size", "max_iterations", "fingerprint_bits")]
    options.update(cuckoo_values(options["filter_type"], *cuckoo))
    return RebuildOptions.from_mapping(options)


def engine_source(engine: Any, values: dict[str, Any]) -> FrameSource:
    """The source an engine's workers read: Parquet files (a path or a URL they reach)."""
    if not values.get("parquet_path") or values.get("csv_path") or values.get("sql"):
        raise UsageError("--engine reads --from-parquet files (a path or URL its workers reach)")
    recipe = {name: values.get(name) for name in ("column", "template", "prefix")}
    return engine.read_parquet(values["parquet_path"], **recipe)


def failure_line(exc: BaseException) -> str:
    """An error's one line, in the command line's terms (--force, not `force`)."""
    if isinstance(exc, click.ClickException):
        return exc.format_message()
    return to_flags(first_line(exc))
