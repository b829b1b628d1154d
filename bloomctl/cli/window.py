"""``bloomctl window create|rotate|info``: time-windowed filters, one bucket per period."""

from __future__ import annotations

from typing import Any

import click

from bloomctl.cli.confirm import ask, confirmer
from bloomctl.cli.context import AppContext
from bloomctl.cli.options import (
    Number,
    backend_option,
    capacity_callback,
    cuckoo_options,
    cuckoo_values,
    error_rate_callback,
    format_option,
    require_error_rate,
    yes_option,
)
from bloomctl.cli.output import current
from bloomctl.cli.render import emit_json, emit_pairs, emit_table, fmt_rate, human_bytes, to_flags
from bloomctl.defaults import AUTO, DEFAULT_HEADROOM, MAX_HEADROOM
from bloomctl.errors import ExitCode
from bloomctl.sizing.bloom import MAX_EXPANSION

# The same number as bloomctl.window.settings.DEFAULT_AHEAD, typed again because that module loads
# the backends, which `bloomctl --help` must not.
DEFAULT_AHEAD = 2


@click.group("window")
def window_group() -> None:
    """Time-windowed filters: one filter per period (a bucket), the last N looked up together.

    Items go into the current period's bucket; lookups ask the last --keep buckets in one call;
    old buckets expire by themselves (EXPIREAT). Run `window rotate` from cron: it pre-creates the
    coming buckets, so that applications never write into a missing one (the add functions
    refuse one rather than create a filter with the server's defaults). Bucket boundaries are UTC,
    by the server's clock; a window's buckets share its hash slot (docs/windows.md).

    \b
    Examples:
      bloomctl window create dedupe --period 1d --keep 7 --capacity auto --min-capacity 1M -e 0.1%
      bloomctl window rotate dedupe          # from cron, more often than once a period
      bloomctl window info dedupe
    """


def _capacity(ctx: click.Context, param: click.Parameter, value: str) -> int | None:
    if value.strip().lower() == AUTO:
        return None
    return capacity_callback(ctx, param, value)


@window_group.command("create")
@click.argument("name")
@click.option("--period", required=True, metavar="1h|1d|7d|30d", help="Each bucket's span: Nh, Nd or Nw (whole hours).")
@click.option(
    "--keep", required=True, type=click.IntRange(1, 1000), help="Buckets a lookup asks: the current and the N-1 before."
)
@click.option(
    "--capacity",
    "-c",
    required=True,
    metavar="N|auto",
    callback=_capacity,
    help="Each new bucket's capacity, or auto: the most items in a recent bucket x --headroom.",
)
@click.option(
    "--min-capacity", callback=capacity_callback, help="With --capacity auto: the least a bucket gets (the first ones)."
)
@click.option(
    "--headroom",
    type=Number(1, MAX_HEADROOM),
    default=DEFAULT_HEADROOM,
    show_default=True,
    help="Multiplier on the recent buckets' items for --capacity auto.",
)
@click.option(
    "--error-rate", "-e", callback=error_rate_callback, help="Each bucket's false-positive rate (Bloom filters)."
)
@click.option("--expansion", type=click.IntRange(1, MAX_EXPANSION), help="Growth factor of a full bucket (RedisBloom).")
@click.option("--nonscaling", is_flag=True, help="Buckets that never grow.")
@cuckoo_options
@backend_option("The buckets' backend (auto: RedisBloom when the server has it, else the module-free one).")
@click.option(
    "--ahead",
    type=click.IntRange(0, 1000),
    default=DEFAULT_AHEAD,
    show_default=True,
    help="Buckets made ahead of the current one: missed rotations up to this many do not matter.",
)
@click.option("--if-not-exists", is_flag=True, help="Succeed without change when the same window exists.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Make every check and print the buckets it would create (keys, capacities, sizes); create nothing.",
)
@yes_option
@format_option("text", "json")
@click.pass_obj
def create_command(
    app: AppContext, name: str, output_format: str, if_not_exists: bool, dry_run: bool, yes: bool, **options: Any
) -> None:
    """Create the window NAME (its settings, at NAME) and its first buckets.

    Asks first on a terminal (the application adds into these buckets), unless --yes.

    \b
    Examples:
      bloomctl window create dedupe --period 1d --keep 7 --capacity 5M -e 0.1%
      bloomctl window create dedupe --period 1d --keep 7 --capacity 5M -e 0.1% --dry-run
      bloomctl window create seen --period 1h --keep 24 --capacity auto --min-capacity 100k -e 1%
      bloomctl window create carts --period 7d --keep 4 --capacity 1M --type cuckoo
    """
    from bloomctl import window

    cuckoo = cuckoo_values(
        options["filter_type"],
        options.pop("bucket_size"),
        options.pop("max_iterations"),
        options.pop("fingerprint_bits"),
    )
    require_error_rate(options["error_rate"], options["filter_type"])
    spec = window.new_window(
        app.server,
        name,
        kind=options.pop("filter_type") or "bloom",
        **options,
        **cuckoo,
    )
    asking = not dry_run and confirmer(yes) is not None  # on a terminal: every check first, then the question
    if asking and window.create(app.client, app.server, spec, if_not_exists=if_not_exists, dry_run=True):
        every = window.format_period(spec.period)
        ask(yes, f"Create window {name!r}: a {spec.kind} bucket every {every}, {spec.keep} kept?")
    created = window.create(app.client, app.server, spec, if_not_exists=if_not_exists, dry_run=dry_run)
    # a dry run rotates with the settings in hand: the window's own are not written
    report = window.rotate(app.client, app.server, name, dry_run=dry_run, spec=spec if dry_run else None)
    warn_report(report)
    if dry_run:
        note = "dry run: nothing created" + ("" if created else "; the same window exists already")
    else:
        note = "created" if created else "exists already"
    render_rotate(report, output_format, note)


@window_group.command("rotate")
@click.argument("names", nargs=-1, required=True)
@click.option("--dry-run", is_flag=True, help="Say what would be created and expired; change nothing.")
@format_option("text", "json")
@click.pass_obj
def rotate_command(app: AppContext, names: tuple[str, ...], dry_run: bool, output_format: str) -> None:
    """Pre-create the coming buckets of each window NAME, set every bucket's expiry, drop stray old ones.

    Idempotent, and safe to run twice at once; run it from cron more often than once a period
    (a bucket made --ahead periods early leaves room for missed runs).

    \b
    Examples:
      bloomctl window rotate dedupe seen
      */10 * * * *  bloomctl -q window rotate dedupe
    """
    from bloomctl import window
    from bloomctl.errors import BloomctlError

    failed: list[BloomctlError] = []
    for name in names:
        try:
            report = window.rotate(app.client, app.server, name, dry_run=dry_run)
        except BloomctlError as exc:
            if len(names) == 1:
                raise
            failed.append(exc)  # one broken window does not stop the others' rotation
            current().error(f"{name}: {exc.render(to_flags)}", int(exc.exit_code))
            continue
        if report.current_was_missing:
            current().warn(
                f"the current bucket of {name!r} was missing: adds failed until now; rotate more often, "
                "or give the window more --ahead buckets"
            )
        warn_report(report)
        render_rotate(report, output_format, "dry run: nothing changed" if dry_run else None)
    if failed:
        raise click.exceptions.Exit(int(failed[0].exit_code))


def warn_report(report: Any) -> None:
    for warning in report.warnings:
        current().warn(warning)


def render_rotate(report: Any, output_format: str, note: str | None = None) -> None:
    if output_format == "json":
        emit_json({**report.as_dict(), "settings": report.spec.as_dict(), "note": note})
        return
    spec = report.spec.as_dict()
    click.echo(
        f"window {spec['name']}: period {spec['period']}, keep {spec['keep']}, {spec['type']} ({spec['backend']}); "
        f"current bucket {report.as_dict()['current']}; new buckets' capacity {report.capacity:,} ({report.capacity_basis})"
        + (f" [{note}]" if note else "")
    )
    for action in report.actions:
        data = action.as_dict()
        detail = f" until {data['expire_at']}" if data["expire_at"] else ""
        if data["capacity"]:
            detail += f", capacity {data['capacity']:,}"
        if data["size_bytes"]:
            detail += f", {human_bytes(data['size_bytes'])}"
        # a dry run's actions are what a real run would do: said as such, not as done
        if report.dry_run:
            click.echo(f"  {DRY_RUN_VERBS.get(data['action'], data['action']):12} {data['key']}{detail}")
        else:
            click.echo(f"  {data['action']:8} {data['key']}{detail}")


DRY_RUN_VERBS = {"created": "would create", "expired": "would expire"}


@window_group.command("info")
@click.argument("name")
@format_option("table", "json")
@click.pass_obj
def info_command(app: AppContext, name: str, output_format: str) -> None:
    """Show each bucket of the window NAME (period, items, fill, FPR, TTL) and the window's FPR.

    Warns about every bucket past its capacity (fill over 100%, marked OVER; in JSON
    `over_capacity` per bucket and a `warnings` list): until it expires, lookups see a
    false-positive rate above the window's. Exits 1 when the current bucket is missing
    (adds are failing: run `window rotate`).

    \b
    Examples:
      bloomctl window info dedupe
      bloomctl window info dedupe --format json | jq .combined_fpr
    """
    from bloomctl import window

    info = window.describe(app.client, name)
    data = info.as_dict()
    for warning in data["warnings"]:
        current().warn(warning)
    if info.current_missing:
        current().warn(
            f"the current bucket of {name!r} is missing: adds fail until `bloomctl window rotate {name}` runs"
        )
    if output_format == "json":
        emit_json(data)
    else:
        render_info(data)
    if info.current_missing:
        raise click.exceptions.Exit(ExitCode.CHECK_FAILED)


def render_info(data: dict[str, Any]) -> None:
    emit_pairs(
        f"Window {data['name']}",
        [
            ("period", f"{data['period']} (buckets start in UTC, by the server's clock)"),
            ("keep", f"{data['keep']} buckets looked up (the current one and {data['keep'] - 1} before)"),
            ("ahead", f"{data['ahead']} buckets made in advance"),
            ("type", f"{data['type']} ({data['backend']})"),
            (
                "capacity",
                f"{data['capacity']}" + (f" (at least {data['min_capacity']:,})" if data["capacity"] == "auto" else ""),
            ),
            ("current bucket", data["current"] + ("  (MISSING)" if data["current_missing"] else "")),
            ("items in the window", f"{data['items']:,}"),
            ("false-positive rate of a lookup", fmt_rate(data["combined_fpr"])),
        ],
    )
    emit_table(
        "Buckets",
        ["bucket", "role", "start", "items", "capacity", "fill", "est. FPR", "bytes", "ttl"],
        [
            (
                b["key"],
                b["role"],
                b["start"],
                f"{b['items']:,}" if b["exists"] else "missing",
                f"{b['capacity']:,}" if b["exists"] else "-",
                (f"{b['fill_ratio']:.2%}" + (" OVER" if b["over_capacity"] else "")) if b["exists"] else "-",
                fmt_rate(b["estimated_fpr"]) if b["exists"] else "-",
                human_bytes(b["size_bytes"]) if b["exists"] else "-",
                "-" if b["ttl_seconds"] is None else f"{b['ttl_seconds']:.0f}s",
            )
            for b in data["buckets"]
        ],
    )
