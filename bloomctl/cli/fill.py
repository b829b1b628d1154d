"""``bloomctl fill-ratio``: threshold checks for cron and CI, in text, JSON or Prometheus format."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from bloomctl.cli.context import AppContext
from bloomctl.cli.options import Number, format_option
from bloomctl.cli.output import current
from bloomctl.cli.render import emit_json, fmt_rate
from bloomctl.defaults import DEFAULT_MAX_FILL, DEFAULT_WARN
from bloomctl.errors import ExitCode
from bloomctl.keys import to_display

if TYPE_CHECKING:  # pragma: no cover
    from bloomctl.backends import FilterState
    from bloomctl.fill import FillReport

OVER, MISSING = "over", "missing"  # bloomctl.fill's statuses; that module loads lazily (start-up time)

Getter = Callable[["FillReport", "FilterState"], "float | None"]
PROMETHEUS_METRICS: tuple[tuple[str, str, Getter], ...] = (
    ("bloomctl_fill_ratio", "Items inserted divided by the reserved capacity.", lambda r, s: s.fill_ratio),
    ("bloomctl_items", "Items inserted (BF.INFO).", lambda r, s: s.items),
    ("bloomctl_capacity", "Capacity of all sub-filters (BF.INFO).", lambda r, s: s.capacity),
    (
        "bloomctl_reserved_capacity",
        "Capacity given to BF.RESERVE (first sub-filter).",
        lambda r, s: s.reserved_capacity,
    ),
    ("bloomctl_size_bytes", "Memory of the filter (BF.INFO Size).", lambda r, s: s.size_bytes),
    ("bloomctl_subfilters", "Number of sub-filters.", lambda r, s: s.filters),
    ("bloomctl_estimated_fpr", "Estimated false-positive rate now.", lambda r, s: s.estimated_fpr),
    ("bloomctl_over_max", "1 when the filter is over the --max thresholds.", lambda r, s: int(r.status == OVER)),
)
PRESENT = ("bloomctl_filter_present", "1 when the key holds a Bloom filter, 0 when it is missing.")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(reports: list[FillReport], warn: float, max_: float) -> str:
    lines: list[str] = [f"# HELP {PRESENT[0]} {PRESENT[1]}", f"# TYPE {PRESENT[0]} gauge"]
    lines += [f'{PRESENT[0]}{{key="{_label(to_display(r.key))}"}} {0.0 if r.state is None else 1.0}' for r in reports]
    present = [(r, r.state) for r in reports if r.state is not None]
    for name, help_text, getter in PROMETHEUS_METRICS:
        samples = [(r, value) for r, state in present if (value := getter(r, state)) is not None]
        if not samples:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        lines += [f'{name}{{key="{_label(to_display(r.key))}"}} {float(v)!r}' for r, v in samples]
    exact = [(r, state) for r, state in present if state.exact]
    if exact:
        name = "bloomctl_bit_fill"
        lines += [f"# HELP {name} Fraction of bits set in each sub-filter (measured).", f"# TYPE {name} gauge"]
        for r, state in exact:
            for sub in state.subfilters:
                lines.append(f'{name}{{key="{_label(to_display(r.key))}",subfilter="{sub.index}"}} {sub.bit_fill!r}')
    lines += [
        "# HELP bloomctl_fill_ratio_threshold Thresholds the check used.",
        "# TYPE bloomctl_fill_ratio_threshold gauge",
        f'bloomctl_fill_ratio_threshold{{level="warn"}} {float(warn)!r}',
        f'bloomctl_fill_ratio_threshold{{level="max"}} {float(max_)!r}',
    ]
    return "\n".join(lines) + "\n"


def text_line(r: FillReport) -> str:
    s = r.state
    if s is None:
        return f"{to_display(r.key)} {r.status.upper()} ({'; '.join(r.reasons)})"
    parts = [
        to_display(r.key),
        r.status.upper(),
        f"fill={s.fill_ratio:.4f}",
        f"items={s.items}",
        f"reserved={s.reserved_capacity}",
        f"filters={s.filters}",
        f"fpr={fmt_rate(s.estimated_fpr)}",
    ]
    shard_states = getattr(s, "shard_states", ())
    if shard_states:
        parts.append(f"shards={len(shard_states)} worst_shard={getattr(s, 'worst_shard', None)}")
    elif s.exact:
        parts.append("bit_fill=" + ",".join(f"{sub.bit_fill:.4f}" for sub in s.subfilters))
    if r.reasons:
        parts.append("(" + "; ".join(r.reasons) + ")")
    return " ".join(parts)


@click.command("fill-ratio")
@click.argument("keys", nargs=-1, required=True)
@click.option(
    "--warn",
    "warn_at",
    type=Number(min=0, percent=True),
    default=None,
    help=f"Mark a filter WARN above this fill ratio (items / reserved capacity) [default: {DEFAULT_WARN}, or --max if lower].",
)
@click.option(
    "--max",
    "max_at",
    type=Number(min=0, percent=True),
    default=DEFAULT_MAX_FILL,
    show_default=True,
    help="Fail (exit 1) when a filter is above this fill ratio.",
)
@click.option(
    "--max-fpr",
    type=Number(min=0, max=1, percent=True),
    default=None,
    help="Also fail when the estimated false-positive rate is above this.",
)
@click.option("--exact", is_flag=True, help="Stream BF.SCANDUMP and popcount: true bit fill and FPR per sub-filter.")
@format_option("text", "json", "prometheus")
@click.pass_obj
def fill_ratio_command(
    app: AppContext,
    keys: tuple[str, ...],
    warn_at: float | None,
    max_at: float,
    max_fpr: float | None,
    exact: bool,
    output_format: str,
) -> None:
    """Check how full filters are: one line per filter, exit 1 when any is over --max (5 when one is missing).

    The fill ratio is items / reserved capacity (what BF.RESERVE was given): above 1.0 a
    scaling filter has grown extra sub-filters and a NONSCALING one is full.

    KEYS are filter names or glob patterns (SCAN ... TYPE on every master; standby and
    old companions are skipped). Write the prometheus format to a file for node_exporter's
    textfile collector.

    \b
    Examples:
      bloomctl fill-ratio users orders --max 0.9
      bloomctl fill-ratio 'bf:*' --warn 0.7 --max 0.9 --format json
      bloomctl fill-ratio 'bf:*' --exact --format prometheus > /var/lib/node_exporter/bloom.prom
    """
    from bloomctl.fill import Thresholds, fill_ratio

    limits = Thresholds(warn=warn_at, max=max_at, max_fpr=max_fpr)
    reports = fill_ratio(app.client, list(keys), limits, exact=exact)
    if output_format == "json":
        emit_json(
            {
                "thresholds": {"warn": limits.warn, "max": limits.max, "max_fpr": limits.max_fpr},
                "filters": [r.as_dict() for r in reports],
            }
        )
    elif output_format == "prometheus":
        click.echo(prometheus_text(reports, limits.warn_at, limits.max), nl=False)
    else:
        for report in reports:
            click.echo(text_line(report))
    missing = [to_display(r.key) for r in reports if r.status == MISSING]
    over = [to_display(r.key) for r in reports if r.status == OVER]
    if missing:
        current().log(f"{len(missing)} of {len(reports)} not found: {', '.join(missing)}", level="error")
        raise click.exceptions.Exit(ExitCode.CONFLICT)
    if over:
        current().log(f"{len(over)} of {len(reports)} filters over the limit: {', '.join(over)}", level="warning")
        raise click.exceptions.Exit(ExitCode.CHECK_FAILED)
