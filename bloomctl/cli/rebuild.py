"""``bloomctl rebuild``: stream CSV or SQL into the standby, verify, and optionally swap."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from bloomctl.cli.confirm import ask
from bloomctl.cli.context import AppContext
from bloomctl.cli.options import (
    SIZE_HELP,
    F,
    Number,
    backend_option,
    capacity_callback,
    cuckoo_options,
    error_rate_callback,
    format_option,
    shards_option,
    size_callback,
    swap_guard_options,
    yes_option,
)
from bloomctl.cli.output import current
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
    ENGINES,
    MAX_CATCHUP_SKEW,
    MAX_HEADROOM,
    MAX_JOBS,
)
from bloomctl.errors import classify
from bloomctl.sizing.bloom import MAX_EXPANSION

if TYPE_CHECKING:  # pragma: no cover - the library loads when a command runs (start-up time)
    from bloomctl.declared.config import Declared
    from bloomctl.declared.rebuild_all import Run
    from bloomctl.rebuild import RebuildReport


def _capacity(ctx: click.Context, param: click.Parameter, value: str | None) -> int | str | None:
    """A number, "auto", or None (the active filter's capacity, else auto)."""
    if value is None:
        return None
    if value.strip().lower() == AUTO:
        return AUTO
    return capacity_callback(ctx, param, value)


def source_options(f: F) -> F:
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


def plan_options(f: F) -> F:
    """The new filter's parameters; each defaults to the active filter's."""
    options: list[Callable[[F], F]] = [
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


def build_options(f: F) -> F:
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
            help="Processes for a client build, each on its share of the items (CSV: its byte range of the "
            "file, cut at record starts; gzip, stdin and multi-byte legacy encodings: the items a hash "
            "gives it; Parquet: every Nth row group; SQL: the rows of --split-column); their bits are ORed.",
        ),
        click.option(
            "--split-column",
            metavar="COLUMN",
            help="SQL with --jobs: a numeric column; job i reads the rows where it, cast to an integer, "
            "is i modulo --jobs.",
        ),
        click.option(
            "--engine",
            type=click.Choice(ENGINES),
            default=None,
            help="Build the bits on a cluster you run, from --from-parquet (a path or URL its workers read): "
            "dask (--scheduler) or spark (--spark-master or --spark-remote); bloomctl then uploads, verifies "
            "and swaps as always. For sources beyond one machine: an engine's start-up costs seconds "
            "(docs/distributed.md). Needs the [dask] or [spark] extra.",
        ),
        click.option(
            "--scheduler",
            metavar="URL",
            help="--engine dask: the scheduler to run on (tcp://host:8786); default: threads in this process.",
        ),
        click.option(
            "--spark-master",
            metavar="URL",
            help="--engine spark: the master (local[4], spark://host:7077, yarn); default local[*].",
        ),
        click.option(
            "--spark-remote",
            metavar="URL",
            help="--engine spark: a Spark Connect server (sc://host:15002), instead of a master.",
        ),
        click.option(
            "--engine-slots",
            type=click.IntRange(1, 100_000),
            default=None,
            help="--engine: the parts built at once, each the size of the whole filter (default: one per "
            "worker thread, or Spark's default parallelism).",
        ),
        click.option(
            "--client-memory",
            metavar="BYTES",
            callback=size_callback,
            default=str(DEFAULT_CLIENT_MEMORY),
            show_default=True,
            help="Memory a client build may use (the filter's bits and its working memory); auto builds "
            f"larger filters on the server. {SIZE_HELP}",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def load_options(f: F) -> F:
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
@click.argument("key", required=False)
@click.option(
    "--all",
    "all_filters",
    is_flag=True,
    help="Every filter of the config file, one at a time: those with a source rebuilt and swapped, windows "
    "rotated, those the application feeds left alone; a summary at the end.",
)
@click.option(
    "--due",
    is_flag=True,
    help="With --all: only the filters whose schedule says so (rebuild.every since the last build, "
    "rebuild.when_fill_above), and those missing.",
)
@source_options
@plan_options
@cuckoo_options
@build_options
@load_options
@click.option(
    "--swap/--no-swap",
    default=False,
    help="Swap the verified standby in at the end (atomic) [default: no swap; a filter of the config file: "
    "swap unless it says rebuild.swap = false]. Asks first on a terminal, unless --yes.",
)
@swap_guard_options
@yes_option
@click.option("--dry-run", is_flag=True, help="Read the source, print the count and the plan; write nothing.")
@click.option("--force", is_flag=True, help="Build the standby even if it is bigger than the server's free memory.")
@format_option("text", "json")
@click.option(
    "--metrics-file",
    metavar="FILE",
    default=None,
    help="Write Prometheus metrics of this run to FILE (node_exporter's textfile collector), also on failure: "
    "duration, items, exit code, swapped, last success time (with --all: each filter's). Renamed into place: "
    "never half written. A --dry-run writes none.",
)
@click.pass_obj
def rebuild_command(
    app: AppContext,
    key: str | None,
    all_filters: bool,
    due: bool,
    output_format: str,
    metrics_file: str | None,
    yes: bool,
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

    KEY may be a filter's name in the config file (bloomctl.toml, docs/config.md): its key,
    profile, source, parameters and rebuild options come from the file (a declared rebuild
    swaps unless `rebuild.swap = false`), and an option given here wins. `--all --due` is the
    one crontab line of an application: the first failure's exit code, after all were tried.

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
      bloomctl --config app/bloomctl.toml rebuild users          # all from the file
      bloomctl --config app/bloomctl.toml rebuild --all --due    # from cron
    """
    from bloomctl.rebuild.build import tune_allocator

    ctx = click.get_current_context()
    explicit = {
        name: options[name]
        for name in options
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
    }
    if metrics_file:
        from bloomctl.cli.metrics import check_writable

        check_writable(metrics_file, "--metrics-file")
    tune_allocator()
    if all_filters or due:
        _check_all(key, due, all_filters, explicit)
        if not explicit.get("dry_run"):
            ask(
                yes,
                "Rebuild every declared filter" + (" that is due" if due else "") + " and swap each as the file says?",
            )
        rebuild_all(app, due, explicit, output_format, metrics_file)
        return
    if key is None:
        raise click.UsageError("give the filter KEY (or its name in the config file), or --all")
    report = rebuild_key(app, ctx, key, options, explicit, metrics_file, yes)
    render_report(report, output_format, app.next_step("swap", report.key))


def _check_all(key: str | None, due: bool, all_filters: bool, explicit: dict[str, Any]) -> None:
    if not all_filters:
        raise click.UsageError("--due goes with --all: rebuild --all --due")
    if key is not None:
        raise click.UsageError("give a filter KEY or --all, not both")
    from bloomctl.declared.rebuild_all import ALL_OPTIONS

    per_filter = sorted(set(explicit) - ALL_OPTIONS)
    if per_filter:
        opts = {param.name: param.opts[0] for param in rebuild_command.params}
        flags = ", ".join(opts.get(name, name) for name in per_filter)
        raise click.UsageError(
            f"{flags}: each filter's own (its source, recipe and parameters are in the file): "
            "give it with `rebuild NAME`, or in the file"
        )


def rebuild_key(
    app: AppContext,
    ctx: click.Context,
    key: str,
    options: dict[str, Any],
    explicit: dict[str, Any],
    metrics_file: str | None,
    yes: bool = True,
) -> RebuildReport:
    """``rebuild KEY``: a key, or a filter of the config file; one that will swap asks first on a
    terminal unless ``yes``."""
    from bloomctl.cli.metrics import write_metrics_safely
    from bloomctl.cli.progress import run_one
    from bloomctl.declared.declarations import SOURCE_FLAGS, SOURCE_OPTIONS, declared_inputs, why_not_rebuilt
    from bloomctl.declared.rebuild_all import Run

    # With a source on the command line, the file counts only when --config itself was given: a
    # bloomctl.toml in the directory (or $BLOOMCTL_CONFIG) never changes what such a command does.
    named_source = bool(set(explicit) & SOURCE_FLAGS)
    given = ctx.find_root().get_parameter_source("config") == click.core.ParameterSource.COMMANDLINE
    from bloomctl.lifecycle.front import NotConfirmed

    run = Run(key, dry_run=bool(options.get("dry_run")))
    declined = False
    try:
        decl = declared(app, key) if given or not named_source else None
        if decl is None:
            client, server = app.client, app.server
            source_values = {name: options.pop(name) for name in SOURCE_OPTIONS}
            source_values["header"] = not options.pop("no_header")
        else:
            key = run.key = decl.key  # before anything can fail: the metrics are the key's
            client, server = app.connect_profile(decl.profile)
            refused = why_not_rebuilt(decl)
            if refused is not None:  # a click usage error: the message keeps its "--help" hint
                raise click.UsageError(refused)
            source_values, options = declared_inputs(decl, options, explicit)
        if options.get("swap") and not options.get("dry_run"):
            ask(yes, f"Rebuild {key!r} and swap it in once it is verified?")
        return run_one(app, client, server, key, source_values, options, run)
    except NotConfirmed:
        declined = True  # a "no" at the prompt is no run: the metrics of the last one stay
        raise
    except BaseException as exc:
        if run.code is None:  # it failed before the rebuild began: the file, the profile's connection
            run.code, run.detail = classify(exc).exit_code, str(exc)
        raise
    finally:
        if metrics_file and not run.dry_run and not declined:
            write_metrics_safely(metrics_file, [run] if run.code is not None else [])


def declared(app: AppContext, name: str) -> Declared | None:
    """The filter the config file declares as ``name`` (its name or key); None without a file or
    when it declares no such filter (KEY is then a key, as without a file)."""
    if not app.has_config:
        return None
    config = app.config
    return config.filters.get(name) or next((d for d in config.filters.values() if d.key == name), None)


def rebuild_all(
    app: AppContext, due: bool, explicit: dict[str, Any], output_format: str, metrics_file: str | None
) -> None:
    """``rebuild --all [--due]``: the library's run over every declared filter, with this command
    line's progress and log; a summary, and the first failure's code."""
    from bloomctl.cli.metrics import write_metrics_safely
    from bloomctl.cli.progress import failure_line, run_one
    from bloomctl.declared.fleet import Fleet
    from bloomctl.declared.rebuild_all import RebuildAll

    runner: RebuildAll | None = None
    outcome: int | None = None  # the whole run's code, for the metrics file
    declared_keys: set[str] | None = None
    dry_run = bool(explicit.get("dry_run"))
    try:
        config = app.config
        declared_keys = {decl.key for decl in config.filters.values()}
        fleet = Fleet(config.filters.values(), app.connect_profile)
        rebuild = functools.partial(run_one, app)
        runner = RebuildAll(fleet, explicit, due=due, rebuild=rebuild, log=app.output.log, describe=failure_line)
        outcome = runner.run()
    except BaseException as exc:  # the file, a signal: the metrics file still says so
        outcome = classify(exc).exit_code
        raise
    finally:  # what ran is recorded even then; a dry run records nothing
        runs = runner.runs if runner is not None else []
        if metrics_file and not dry_run:
            done = [r for r in runs if r.code is not None]
            write_metrics_safely(metrics_file, done, all_code=outcome, keep_keys=declared_keys)
    render_all(runs, output_format, outcome)
    if outcome:
        raise click.exceptions.Exit(outcome)


def render_all(runs: list[Run], output_format: str, code: int | None) -> None:
    if output_format == "json":
        emit_json({"filters": [r.as_dict() for r in runs], "exit_code": code})
        return
    width = max((len(r.name) for r in runs), default=4)
    words = {"rebuild": "rebuilt", "rotate": "rotated", "skip": "skipped"}
    if any(r.dry_run for r in runs):
        words = {"rebuild": "dry run", "rotate": "dry run", "skip": "skipped"}
    for run in runs:
        status = words.get(run.action, run.action) if not run.code else f"FAILED (exit {run.code})"
        why = f" ({run.reason})" if run.reason and run.detail != run.reason and run.action == "rebuild" else ""
        click.echo(f"{run.name:<{width}}  {status:<16}  {run.detail}{why}")
    counts = {action: sum(1 for r in runs if not r.code and r.action == action) for action in words}
    failed = sum(1 for r in runs if r.code)
    did = "would be rebuilt" if any(r.dry_run for r in runs) else "rebuilt"
    click.echo(
        f"\n{len(runs)} filter(s): {counts['rebuild']} {did}, {counts['rotate']} rotated, "
        f"{counts['skip']} skipped, {failed} failed (exit {code})"
    )


def render_report(report: RebuildReport, output_format: str, swap: str) -> None:
    """The rebuild's report; ``swap`` is the command that swaps its standby in (on this run's server)."""
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
        + (f", {report.build_kernel} kernel" if report.build_kernel else "")
        + (f" ({human_bytes(report.uploaded_bytes)} uploaded)" if report.build == "client" else "")
        + (f" ({report.build_note})" if report.build_note else ""),
        f"time           {data['seconds']:.1f}s, {data['items_per_second']:,} items/s",
        f"new filter     {report.standby if not report.swapped else report.key} "
        f"({report.backend}, {human_bytes(report.size_bytes)})",
        f"swapped        {'yes' if report.swapped else f'no: run {swap} to cut over'}",
    ]
    for example in data["bad_row_examples"]:
        current().warn(f"bad row: {example}")
    click.echo("\n".join(line for line in lines if line))
