"""``bloomctl rebuild``: stream CSV or SQL into the standby, verify, and optionally swap."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

import click

from bloomctl.cli.context import AppContext
from bloomctl.cli.options import (
    Number,
    backend_option,
    capacity_callback,
    cuckoo_options,
    cuckoo_values,
    error_rate_callback,
    format_option,
    shards_option,
    swap_guard_options,
)
from bloomctl.cli.output import Output, current
from bloomctl.cli.render import emit_json, fmt_rate, human_bytes
from bloomctl.defaults import (
    AUTO,
    BITMAP_BATCH_SIZE,
    BUILD_CHOICES,
    DB_URL_ENV,
    DEFAULT_BATCH_SIZE,
    DEFAULT_CATCHUP_SKEW,
    DEFAULT_CLIENT_MEMORY,
    DEFAULT_DELIMITER,
    DEFAULT_ENCODING,
    DEFAULT_EXPANSION,
    DEFAULT_HEADROOM,
    DEFAULT_SKIP_BAD_ROWS,
    DEFAULT_VERIFY_SAMPLE,
    DEFAULT_WINDOW,
    MAX_CATCHUP_SKEW,
    MAX_HEADROOM,
    MAX_JOBS,
)
from bloomctl.errors import ExitCode
from bloomctl.planner import MAX_EXPANSION

if TYPE_CHECKING:  # pragma: no cover - the library loads when a command runs (start-up time)
    from bloomctl.rebuild import RebuildReport

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


def _capacity(ctx: click.Context, param: click.Parameter, value: str | None) -> int | str | None:
    """A number, "auto", or None (the active filter's capacity, else auto)."""
    if value is None:
        return None
    if value.strip().lower() == AUTO:
        return AUTO
    return capacity_callback(ctx, param, value)


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


def source_options(f: Any) -> Any:
    """Where the items come from and how each item is made of a row."""
    options = [
        click.option(
            "--from-csv",
            "csv_path",
            metavar="PATH",
            help="Read items from a CSV file ('-' for stdin, .gz read transparently).",
        ),
        click.option(
            "--from-parquet",
            "parquet_path",
            metavar="PATH",
            help="Read items from a Parquet file, or every Parquet file in a directory (needs the fast extra).",
        ),
        click.option(
            "--from-sql", "sql", metavar="QUERY", help="Read items from a SQL query (first column, or --column)."
        ),
        click.option(
            "--db-url",
            envvar=DB_URL_ENV,
            metavar="URL",
            help=f"SQLAlchemy URL: postgresql://, mysql://, sqlite:///path. [env: {DB_URL_ENV} keeps passwords out of argv]",
        ),
        click.option(
            "--column",
            metavar="NAME|N",
            help="The column holding the item: a header name or a 1-based position [default: the first].",
        ),
        click.option("--no-header", is_flag=True, help="The CSV has no header line."),
        click.option("--delimiter", default=DEFAULT_DELIMITER, show_default=True, help="CSV field separator."),
        click.option(
            "--encoding",
            default=DEFAULT_ENCODING,
            show_default=True,
            help="CSV text encoding (items are stored as UTF-8).",
        ),
        click.option(
            "--template", metavar="TEXT", help="Build items from columns, e.g. 'user:{user_id}' or 'order:{1}:{3}'."
        ),
        click.option("--prefix", metavar="TEXT", help="Prepend this to every item, e.g. 'user:'."),
        click.option(
            "--skip-bad-rows",
            type=click.IntRange(min=0),
            default=DEFAULT_SKIP_BAD_ROWS,
            show_default=True,
            help="Tolerate up to N unreadable rows (reported); one more stops the run.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def plan_options(f: Any) -> Any:
    """The new filter's parameters; each defaults to the active filter's."""
    options = [
        click.option(
            "--capacity",
            "-c",
            callback=_capacity,
            metavar="N|auto",
            help="Capacity, or auto: rows counted x --headroom (a cuckoo filter's: over the load at which its "
            "inserts start to fail) [default: the active filter's, else auto].",
        ),
        click.option(
            "--headroom",
            type=Number(1, MAX_HEADROOM),
            default=DEFAULT_HEADROOM,
            show_default=True,
            help="Multiplier on the counted rows for --capacity auto.",
        ),
        click.option("--error-rate", "-e", callback=error_rate_callback, help="[default: the active filter's]"),
        click.option(
            "--expansion",
            type=click.IntRange(1, MAX_EXPANSION),
            help=f"[default: the active filter's, else {DEFAULT_EXPANSION}]",
        ),
        click.option("--nonscaling", is_flag=True, help="Build a filter that never grows."),
        backend_option("For a first build; an existing filter keeps its backend."),
        shards_option("First build of a sharded filter with N members."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def build_options(f: Any) -> Any:
    """Where the filter is built: the client (and in how many processes) or the server."""
    options = [
        click.option(
            "--build",
            type=click.Choice(BUILD_CHOICES),
            default=AUTO,
            show_default=True,
            help="Where the filter's bits are computed: in the client (uploaded in bounded chunks: almost no "
            "work for the server), on the server (items sent in batches), or auto: the client where a "
            "compatibility probe shows it builds exactly the server's filter.",
        ),
        click.option(
            "--jobs",
            type=click.IntRange(1, MAX_JOBS),
            default=1,
            show_default=True,
            help="Processes for a client build, each on its share of the items (CSV and Parquet: each "
            "reads the whole source and keeps the items a hash gives it; SQL: the rows of --split-column); "
            "their bits are ORed.",
        ),
        click.option(
            "--split-column",
            metavar="COLUMN",
            help="SQL with --jobs: a numeric column; job i reads the rows where it, cast to an integer, "
            "is i modulo --jobs.",
        ),
        click.option(
            "--client-memory",
            metavar="BYTES",
            callback=capacity_callback,
            default=str(DEFAULT_CLIENT_MEMORY),
            show_default=True,
            help="Memory a client build may use (the filter's bits and its working memory); auto builds "
            "larger filters on the server. 1G = 10^9.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def load_options(f: Any) -> Any:
    """How the server path sends items, and what is verified before a swap."""
    options = [
        click.option(
            "--batch-size",
            type=click.IntRange(min=1),
            default=None,
            help=f"Server path: items per BF.INSERT / FCALL [default: {DEFAULT_BATCH_SIZE} RedisBloom, "
            f"{BITMAP_BATCH_SIZE} bitmap: each well under 20 ms on the server].",
        ),
        click.option(
            "--max-rate",
            metavar="ITEMS/S",
            type=Number(min=0, min_open=True),
            default=None,
            help="Server path: send at most this many items per second (a shared production server).",
        ),
        click.option(
            "--window",
            type=click.IntRange(min=1),
            default=DEFAULT_WINDOW,
            show_default=True,
            help="Batches in flight at once.",
        ),
        click.option(
            "--verify-sample",
            type=click.IntRange(min=0),
            default=DEFAULT_VERIFY_SAMPLE,
            show_default=True,
            help="Check this many random source items in the standby before swapping (0: none).",
        ),
        click.option(
            "--verify",
            "verify_mode",
            type=click.Choice(["sample", "all"]),
            default="sample",
            show_default=True,
            help="all: a second pass over the source checks every item.",
        ),
        click.option(
            "--since-column",
            metavar="COLUMN",
            help="SQL: after the load, re-read rows whose COLUMN >= load start - skew.",
        ),
        click.option(
            "--catchup-skew",
            type=Number(min=0, max=MAX_CATCHUP_SKEW),
            default=DEFAULT_CATCHUP_SKEW,
            show_default=True,
            help="Seconds subtracted from the load start for catch-up.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.command("rebuild")
@click.argument("key")
@source_options
@plan_options
@cuckoo_options
@build_options
@load_options
@click.option("--swap", is_flag=True, help="Swap the verified standby in at the end (atomic).")
@swap_guard_options
@click.option("--dry-run", is_flag=True, help="Read the source, print the count and the plan; write nothing.")
@click.option("--force", is_flag=True, help="Build the standby even if it is bigger than the server's free memory.")
@click.option("--quiet", "-q", is_flag=True, hidden=True, help="The global --quiet, accepted here too.")
@click.option("--log-format", type=click.Choice(["text", "json"]), hidden=True, help="The global --log-format.")
@format_option("text", "json")
@click.option(
    "--metrics-file",
    metavar="FILE",
    default=None,
    help="Write Prometheus metrics of this run to FILE (node_exporter's textfile collector), also on failure: "
    "duration, items, exit code, swapped, last success time. Renamed into place: never half written.",
)
@click.pass_obj
def rebuild_command(
    app: AppContext,
    key: str,
    no_header: bool,
    quiet: bool,
    log_format: str | None,
    output_format: str,
    metrics_file: str | None,
    **options: Any,
) -> None:
    """Rebuild the filter KEY from its source of truth into the standby, verify it, and swap with --swap.

    Streams the source (constant memory) into the standby key ({KEY}:standby, same hash slot)
    with several batches in flight, under the filter's lock (a second rebuild exits 6 at once).
    A cuckoo filter (--type cuckoo, or an existing one) gets each distinct item once, and the
    application's adds and deletes during the load replayed (docs/cuckoo.md).
    Before any swap, a random sample of source items (or all, with --verify all) must be found
    in the standby: a miss exits 7 with nothing swapped. Without --swap the verified standby
    stays for `bloomctl swap` later. The active filter is never touched until the final,
    atomic swap.

    \b
    Examples:
      bloomctl rebuild users --from-csv users.csv.gz --column user_id --prefix user: --swap
      bloomctl rebuild big --from-csv ids.csv --capacity auto -e 0.1% --shards 6 --swap
      bloomctl rebuild users --from-sql 'SELECT id FROM users' --capacity auto --error-rate 0.1% --swap
      bloomctl rebuild users --from-parquet exports/users/ --column email -e 0.1% --swap
      BLOOMCTL_DB_URL=postgresql://app@db/prod bloomctl rebuild users \\
          --from-sql 'SELECT id, updated_at FROM users' --since-column updated_at --swap --keep-old 3600
      zcat users.csv.gz | bloomctl rebuild users --from-csv - --no-header -c 10M -e 1% --dry-run
      bloomctl rebuild sessions --type cuckoo --from-sql 'SELECT id FROM sessions' --bucket-size 4 --swap
    """
    from bloomctl.build import tune_allocator
    from bloomctl.rebuild import rebuild
    from bloomctl.sources import open_source

    started = time.monotonic()
    if metrics_file:
        from bloomctl.cli.metrics import check_writable

        check_writable(metrics_file, "--metrics-file")
    tune_allocator()

    if quiet:  # given after the command (as before they were global): the same effect
        app.output.quiet = True
    if log_format:
        app.output.log_format = log_format
    reporter = Reporter(app.output)
    try:  # (the source opened inside: a missing file or driver also lands in the metrics file)
        source = open_source(header=not no_header, **{name: options.pop(name) for name in SOURCE_OPTIONS})
        report = rebuild(
            app.client,
            app.server,
            key,
            source,
            rebuild_options(options),
            events=reporter.event,
            progress=reporter.progress,
        )
    except BaseException as exc:
        if metrics_file:
            from bloomctl.cli.metrics import exit_code_of

            try:
                write_metrics(metrics_file, key, started, exit_code_of(exc), reporter.done, swapped=False)
            except Exception as failed:  # the run's own failure is what the user must see, with its code
                current().warn(f"no metrics written: {failed}")
        raise
    finally:
        reporter.close()
    if metrics_file:
        write_metrics(metrics_file, key, started, ExitCode.OK, report.source.items, swapped=report.swapped)
    render_report(report, output_format)


def rebuild_options(options: dict[str, Any]) -> Any:
    """The command's options (the source's taken out) as the library's ``RebuildOptions``."""
    from bloomctl.rebuild import RebuildOptions

    options["verify_all"] = options.pop("verify_mode") == "all"
    cuckoo = [options.pop(name) for name in ("bucket_size", "max_iterations", "fingerprint_bits")]
    options.update(cuckoo_values(options["filter_type"], *cuckoo))
    return RebuildOptions.from_mapping(options)


def write_metrics(path: str, key: str, started: float, code: int, items: int, *, swapped: bool) -> None:
    """``rebuild --metrics-file``: this run's gauges, labelled by key; the last success kept on failure."""
    from bloomctl.cli.metrics import Metric, exposition, last_success, write_atomically

    labels = (("key",), ((key,),))
    gauges = [
        ("bloomctl_rebuild_duration_seconds", "How long the run took.", time.monotonic() - started),
        ("bloomctl_rebuild_items", "Items read from the source (so far, when it failed).", items),
        ("bloomctl_rebuild_exit_code", "The run's exit code (0: done).", code),
        ("bloomctl_rebuild_success", "1 when the run succeeded (exit 0), else 0.", int(code == 0)),
        ("bloomctl_rebuild_swapped", "1 when the run swapped the new filter in.", int(swapped)),
    ]
    metrics: list[Metric] = [(name, help_text, labels[0], [(labels[1][0], value)]) for name, help_text, value in gauges]
    metrics.append(last_success(path, {"command": "rebuild", "key": key}, code == 0, time.time()))
    write_atomically(path, exposition(metrics), "--metrics-file")


def render_report(report: RebuildReport, output_format: str) -> None:
    data = report.as_dict()
    if output_format == "json":
        emit_json(data)
        return
    if report.dry_run:
        click.echo(
            f"dry run: {data['items_read']:,} items in {data['rows']:,} rows ({data['blank']:,} blank, "
            f"{data['bad_rows']:,} bad); plan: capacity {report.plan.capacity:,}, error rate "
            f"{fmt_rate(report.plan.error_rate)}, {report.backend}; nothing written"
        )
        return
    lines = [
        f"items read     {data['items_read']:,} ({data['rows']:,} rows, {data['blank']:,} blank, {data['bad_rows']:,} bad)",
        f"added          {data['added']:,} new, {data['duplicates']:,} already present",
        f"catch-up       {data['catchup_rows']:,} rows" if report.catchup is not None else None,
        f"verified       {data['verified']:,} items ({data['verify_mode']})",
        f"built in       the {report.build}"
        + (f" ({human_bytes(report.uploaded_bytes)} uploaded)" if report.build == "client" else "")
        + (f" ({report.build_note})" if report.build_note else ""),
        f"time           {data['seconds']:.1f}s, {data['items_per_second']:,} items/s",
        f"new filter     {report.standby if not report.swapped else report.key} "
        f"({report.backend}, {human_bytes(report.size_bytes)})",
        f"swapped        {'yes' if report.swapped else 'no: run `bloomctl swap ' + report.key + '` to cut over'}",
    ]
    for example in data["bad_row_examples"]:
        current().warn(f"bad row: {example}")
    click.echo("\n".join(line for line in lines if line))
