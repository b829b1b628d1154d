"""``bloomctl fill-ratio``: threshold checks for cron and CI, in text, JSON or Prometheus format."""

from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING

import click

from bloomctl.cli.context import AppContext
from bloomctl.cli.options import Number, format_option
from bloomctl.cli.output import current
from bloomctl.cli.render import fmt_rate
from bloomctl.defaults import DEFAULT_MAX_FILL, DEFAULT_WARN
from bloomctl.errors import ExitCode, classify
from bloomctl.keys import to_display

if TYPE_CHECKING:  # pragma: no cover
    from bloomctl.cli.metrics import Metric
    from bloomctl.lifecycle.fill import FillReport, Thresholds

OVER, MISSING = "over", "missing"  # bloomctl.lifecycle.fill's statuses; that module loads lazily (start-up time)

PRESENT = ("bloomctl_filter_present", "1 when the key holds a Bloom filter, 0 when it is missing.")
TYPE = ("bloomctl_filter_type", "1 for the filter's type (bloom or cuckoo).")
EXIT_CODE = ("bloomctl_fill_ratio_exit_code", "The exit code of the fill-ratio run that wrote this file.")
SUCCESS_LABELS = {"command": "fill-ratio"}


def prometheus_text(
    reports: list[FillReport], limits: Thresholds, exit_code: int | None = None, previous: str | None = None
) -> str:
    """The textfile: per-key gauges and thresholds; with ``exit_code`` (``--output``), that code
    and the last success (now when 0, else kept from ``previous``, the file being replaced)."""
    from bloomctl.cli.metrics import exposition, last_success
    from bloomctl.lifecycle.fill import PROMETHEUS_METRICS

    keyed = [(to_display(r.key), r) for r in reports]
    metrics: list[Metric] = [(*PRESENT, ("key",), [((k,), 0.0 if r.state is None else 1.0) for k, r in keyed])]
    present = [(k, r, r.state) for k, r in keyed if r.state is not None]
    metrics.append((*TYPE, ("key", "type"), [((k, state.kind), 1.0) for k, _r, state in present]))
    for name, help_text, getter in PROMETHEUS_METRICS:
        samples = [((k,), value) for k, r, state in present if (value := getter(r, state)) is not None]
        metrics.append((name, help_text, ("key",), samples))
    bit_fill = [
        ((k, str(sub.index)), sub.bit_fill) for k, _r, state in present if state.exact for sub in state.subfilters
    ]
    bit_fill += [
        ((k, str(sub.index)), (sub.occupied or 0) / sub.slots)
        for k, _r, state in present
        if state.exact
        for sub in getattr(state, "cuckoo_subs", ())
    ]
    metrics.append(
        (
            "bloomctl_bit_fill_ratio",
            "Fraction of bits set in each sub-filter (a cuckoo filter's: of slots taken), measured.",
            ("key", "subfilter"),
            bit_fill,
        )
    )
    thresholds = [
        ((k, level), value)
        for k, r in keyed
        for level, value in zip(("warn", "max"), r.limits or (limits.warn_at, limits.max_at), strict=True)
    ]
    metrics.append(
        ("bloomctl_fill_threshold_ratio", "Fill-ratio thresholds the check used.", ("key", "level"), thresholds)
    )
    if limits.max_fpr is not None:
        fpr = [((k,), limits.max_fpr) for k, _r in keyed]
        metrics.append(("bloomctl_false_positive_threshold_ratio", "The --max-fpr the check used.", ("key",), fpr))
    if exit_code is not None:
        metrics.append((*EXIT_CODE, (), [((), exit_code)]))
        metrics.append(last_success(previous, SUCCESS_LABELS, exit_code == 0, time.time()))
    return exposition(metrics)


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
    if s.kind == "cuckoo":
        parts.insert(2, "type=cuckoo")
        parts.append(f"deleted={getattr(s, 'deletes', 0)}")
    shard_states = getattr(s, "shard_states", ())
    if shard_states:
        parts.append(f"shards={len(shard_states)} worst_shard={getattr(s, 'worst_shard', None)}")
    elif s.exact and s.kind == "cuckoo":
        parts.append(
            "slot_fill=" + ",".join(f"{(sub.occupied or 0) / sub.slots:.4f}" for sub in getattr(s, "cuckoo_subs", ()))
        )
    elif s.exact:
        parts.append("bit_fill=" + ",".join(f"{sub.bit_fill:.4f}" for sub in s.subfilters))
    if r.reasons:
        parts.append("(" + "; ".join(r.reasons) + ")")
    return " ".join(parts)


FILL_FORMATS = ("text", "json", "prometheus")


@click.command("fill-ratio")
@click.argument("keys", nargs=-1, required=True)
@click.option(
    "--warn",
    "warn_at",
    type=Number(min=0, percent=True),
    default=None,
    help=f"Mark a filter WARN above this fill ratio (items / reserved capacity; a cuckoo filter's: items / slots) "
    f"[default: {DEFAULT_WARN}, or --max if lower; a cuckoo filter: 80% of its max].",
)
@click.option(
    "--max",
    "max_at",
    type=Number(min=0, percent=True),
    default=None,
    help=f"Fail (exit 1) when a filter is above this fill ratio [default: {DEFAULT_MAX_FILL}; a cuckoo filter: "
    "the load at which its inserts start to fail].",
)
@click.option(
    "--max-fpr",
    type=Number(min=0, max=1, percent=True),
    default=None,
    help="Also fail when the estimated false-positive rate is above this.",
)
@click.option("--exact", is_flag=True, help="Stream BF.SCANDUMP and popcount: true bit fill and FPR per sub-filter.")
@format_option(*FILL_FORMATS)
@click.option(
    "--output",
    "-o",
    "output_file",
    metavar="FILE",
    default=None,
    help="Write the result to FILE (a temporary file renamed over it: never half written; missing "
    "directories made) instead of stdout; with --format prometheus it also gets the exit code and the "
    "last success time. The format is --format's.",
)
@click.pass_obj
def fill_ratio_command(
    app: AppContext,
    keys: tuple[str, ...],
    warn_at: float | None,
    max_at: float | None,
    max_fpr: float | None,
    exact: bool,
    output_format: str,
    output_file: str | None,
) -> None:
    """Check how full filters are: one line per filter, exit 1 when any is over --max (5 when one is missing).

    The fill ratio is items / reserved capacity (what BF.RESERVE was given): above 1.0 a
    scaling filter has grown extra sub-filters and a NONSCALING one is full. A cuckoo
    filter's is its load factor (items / slots), judged by default against the load at
    which its inserts start to fail (measured for its bucket size and MAXITERATIONS).

    KEYS are filter names or glob patterns (SCAN ... TYPE on every master; standby and
    old companions are skipped). Write the prometheus format to a file for node_exporter's
    textfile collector.

    \b
    Examples:
      bloomctl fill-ratio users orders --max 0.9
      bloomctl fill-ratio 'bf:*' --warn 0.7 --max 0.9 --format json
      bloomctl fill-ratio 'bf:*' --exact --format prometheus > /var/lib/node_exporter/bloom.prom
    """
    from bloomctl.lifecycle.fill import Thresholds, fill_ratio

    limits = Thresholds(warn=warn_at, max=max_at, max_fpr=max_fpr)
    output_file = None if output_file == "-" else output_file  # '-': stdout
    if output_file:
        from bloomctl.cli.metrics import check_writable

        check_writable(output_file, "--output", FILL_FORMATS, make_dirs=True)
    try:
        reports = fill_ratio(app.client, list(keys), limits, exact=exact)
    except BaseException as exc:  # no reports (Redis unreachable, a signal...): the textfile still says so
        if output_file and output_format == "prometheus":
            with contextlib.suppress(Exception):  # the failure itself is what the user must see
                _write(output_file, prometheus_text([], limits, classify(exc).exit_code, output_file))
        raise
    reports = _with_suggestions(app, reports)
    missing = [to_display(r.key) for r in reports if r.status == MISSING]
    over = [to_display(r.key) for r in reports if r.status == OVER]
    code = ExitCode.CONFLICT if missing else ExitCode.CHECK_FAILED if over else ExitCode.OK
    if output_format == "json":
        data = {
            "thresholds": {"warn": limits.warn_at, "max": limits.max_at, "max_fpr": limits.max_fpr},
            "filters": [r.as_dict() for r in reports],
        }
        text = json.dumps(data, indent=2, default=str) + "\n"
    elif output_format == "prometheus":
        text = prometheus_text(reports, limits, int(code) if output_file else None, output_file)
    else:
        text = "".join(text_line(report) + "\n" for report in reports)
    if output_file:
        _write(output_file, text)
    else:
        from bloomctl.cli.render import one_line

        click.echo(one_line(text, output_format), nl=False)
    if missing:
        wrong = [to_display(r.key) for r in reports if r.status == MISSING and " holds " in " ".join(r.reasons)]
        absent = [name for name in missing if name not in wrong]
        parts = [
            f"not found: {', '.join(absent)}" if absent else "",
            f"not a filter: {', '.join(wrong)}" if wrong else "",
        ]
        summary = "; ".join(part for part in parts if part)
        current().log(f"{len(missing)} of {len(reports)} are not filters ({summary})", level="error")
        raise click.exceptions.Exit(code)
    if over:
        current().log(f"{len(over)} of {len(reports)} filters over the limit: {', '.join(over)}", level="warning")
        raise click.exceptions.Exit(code)


def _with_suggestions(app: AppContext, reports: list[FillReport]) -> list[FillReport]:
    """Each filter name that does not exist gets '; did you mean ...?' (one bounded look for all)."""
    import dataclasses

    from bloomctl.lifecycle.fill import is_pattern
    from bloomctl.lifecycle.suggest import did_you_mean, key_names

    def unknown(report: FillReport) -> bool:
        return report.status == MISSING and not is_pattern(report.key) and "does not exist" in report.reasons[0]

    if not any(unknown(r) for r in reports):
        return reports
    names: set[str] = set()
    with contextlib.suppress(Exception):  # best effort: no suggestion rather than a failure
        names = key_names(app.client)
    out = []
    for report in reports:
        hint = did_you_mean(app.client, report.key, names) if unknown(report) else ""
        out.append(
            dataclasses.replace(report, reasons=(report.reasons[0] + hint, *report.reasons[1:])) if hint else report
        )
    return out


def _write(path: str, text: str) -> None:
    from bloomctl.cli.metrics import write_atomically

    write_atomically(path, text, "--output")
