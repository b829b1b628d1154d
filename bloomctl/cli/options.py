"""Options shared by several commands, defined once."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from bloomctl.cli.output import current
from bloomctl.defaults import (
    AUTO,
    BACKEND_ENV,
    DEFAULT_EXPANSION,
    DEFAULT_KEEP_OLD_SECONDS,
    DEFAULT_MIN_RATIO,
    MAX_KEEP_OLD_SECONDS,
    MAX_LOCK_WAIT_SECONDS,
    MAX_SHARDS,
)
from bloomctl.errors import UsageError
from bloomctl.sizing.bloom import MAX_EXPANSION, parse_count, parse_error_rate, parse_size
from bloomctl.sizing.cuckoo import (
    DEFAULT_BUCKET_SIZE,
    DEFAULT_CUCKOO_EXPANSION,
    DEFAULT_LUA_FINGERPRINT_BITS,
    DEFAULT_MAX_ITERATIONS,
    MAX_BUCKET_SIZE,
    MAX_ITERATIONS,
)

F = TypeVar("F", bound=Callable[..., Any])  # a command function, as each decorator returns it
BACKEND_CHOICES = [AUTO, "redisbloom", "module-free", "bitmap"]
TYPE_CHOICES = ["bloom", "cuckoo"]


class Number(click.FloatRange):
    """A float in a range, never NaN or infinite (``ratio < nan`` is always false: a NaN guard
    guards nothing); with ``percent``, ``90%`` reads as 0.9."""

    name = "number"

    def __init__(
        self,
        min: float | None = None,
        max: float | None = None,
        *,
        min_open: bool = False,
        max_open: bool = False,
        percent: bool = False,
    ) -> None:
        super().__init__(min, max, min_open=min_open, max_open=max_open)
        self.percent = percent

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if self.percent and isinstance(value, str) and value.strip().endswith("%"):
            try:
                value = float(value.strip()[:-1]) / 100
            except ValueError:
                self.fail(f"{value!r} is not a number or a percentage (examples: 0.9, 90%)", param, ctx)
        if isinstance(value, str) and not math.isfinite(_as_float(value)):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _as_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0  # not a number at all: FloatRange says so in its own words


class _Choice(click.Choice):
    """A choice that accepts aliases (``table`` for ``text``) but shows only its own names."""

    def __init__(self, accepted: Sequence[str], shown: Sequence[str]) -> None:
        super().__init__(accepted)
        self.shown = list(shown)

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return f"[{'|'.join(self.shown)}]"


def format_option(*choices: str, tty_default: str | None = None, pipe_default: str | None = None) -> Callable[[F], F]:
    """``--format``: the first choice is the default on a terminal, ``pipe_default`` elsewhere;
    with ``--log-format json``, json (one line: a log file of JSON lines stays one)."""
    tty_default = tty_default or choices[0]
    pipe_default = pipe_default or tty_default
    default_text = tty_default if tty_default == pipe_default else f"{tty_default} on a terminal, else {pipe_default}"

    # 'text' and 'table' name the same human format: accept the other name wherever one is a choice
    aliases = {"text": "table", "table": "text"}
    accepted = choices + tuple(aliases[c] for c in choices if c in aliases and aliases[c] not in choices)

    def resolve(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str:
        if value:
            value = value if value in choices else aliases[value]
            current().output_format = value  # an explicit --format json: a failure prints a JSON error object too
            return value
        if current().log_format == "json" and "json" in choices:
            return "json"
        return tty_default if sys.stdout.isatty() else pipe_default

    return click.option(
        "--format",
        "output_format",
        type=_Choice(accepted, shown=choices),
        default=None,
        callback=resolve,
        help=f"Output format [default: {default_text}].",
    )


def yes_option(f: F) -> F:
    return click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation on a terminal.")(f)


def capacity_callback(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    """A count option: 1000000, 1_000_000, 1e6, 1M or 2.5k."""
    if value is None:
        return None
    try:
        return parse_count(value)
    except UsageError as exc:
        raise click.BadParameter(str(exc)) from None


# Every option that takes bytes says the same: the units as redis.conf reads them.
SIZE_HELP = (
    "Units as in redis.conf, any case: 1k = 1000, 1kb = 1024, 1m = 10^6, 1mb = 2^20, 1g = 10^9, 1gb = 2^30; "
    "also 1KiB, 1MiB, 1GiB (powers of 1024), b or none for bytes."
)


def size_callback(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    """A byte size option: 1073741824, 512mb, 1gb, 1GiB or 500M, the units as redis.conf reads them."""
    if value is None:
        return None
    try:
        return parse_size(value)
    except UsageError as exc:
        raise click.BadParameter(str(exc)) from None


def error_rate_callback(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    """An error rate option: 0.01 or 1%."""
    if value is None:
        return None
    try:
        return parse_error_rate(value)
    except UsageError as exc:
        raise click.BadParameter(str(exc)) from None


def sizing_options(f: F) -> F:
    """--capacity, --error-rate, --expansion, --nonscaling: the arguments of BF.RESERVE."""
    f = click.option(
        "--nonscaling",
        is_flag=True,
        help="Never grow: BF.ADD fails once the filter is full (plain error rate, no 0.5 tightening).",
    )(f)
    f = click.option(
        "--expansion",
        type=click.IntRange(1, MAX_EXPANSION),
        default=None,
        help=f"Growth factor of each new sub-filter when full [default: {DEFAULT_EXPANSION}; "
        f"cuckoo: {DEFAULT_CUCKOO_EXPANSION}, rounded up to a power of two].",
    )(f)
    f = click.option(
        "--error-rate",
        "-e",
        callback=error_rate_callback,
        help="Target false-positive rate: 0.01 or 1% (a Bloom filter needs it; a cuckoo filter's bucket size "
        "and fingerprints set its rate: given, it is checked against them).",
    )(f)
    f = click.option(
        "--capacity",
        "-c",
        required=True,
        callback=capacity_callback,
        help="Items the first sub-filter holds: 1000000, 1_000_000, 1e6, 1M or 2.5k.",
    )(f)
    return f


def cuckoo_options(f: F) -> F:
    """--type, and a cuckoo filter's --bucket-size, --max-iterations and --fingerprint-bits."""
    f = click.option(
        "--fingerprint-bits",
        type=click.Choice(["8", "16", "32"]),
        default=None,
        help="Module-free cuckoo filter: bits per fingerprint [default: the fewest that meet --error-rate, "
        f"else {DEFAULT_LUA_FINGERPRINT_BITS}]. RedisBloom's are 8.",
    )(f)
    f = click.option(
        "--max-iterations",
        type=click.IntRange(1, MAX_ITERATIONS),
        default=None,
        help=f"Cuckoo filter: relocations an insert may try before the filter grows or is full "
        f"[default: {DEFAULT_MAX_ITERATIONS}].",
    )(f)
    f = click.option(
        "--bucket-size",
        type=click.IntRange(1, MAX_BUCKET_SIZE),
        default=None,
        help=f"Cuckoo filter: fingerprints per bucket [default: {DEFAULT_BUCKET_SIZE}]; larger buckets fill "
        "fuller before inserts fail, and give more false positives.",
    )(f)
    f = click.option(
        "--type",
        "filter_type",
        type=click.Choice(TYPE_CHOICES),
        default=None,
        help="bloom, or cuckoo (items can be deleted; CF.* or the module-free cuckoo filter) [default: bloom; "
        "an existing filter's own].",
    )(f)
    return f


def cuckoo_values(
    filter_type: str | None, bucket_size: int | None, max_iterations: int | None, fingerprint_bits: str | None
) -> dict[str, Any]:
    """The cuckoo options as the library names them; refused for a Bloom filter."""
    if filter_type != "cuckoo" and (bucket_size, max_iterations, fingerprint_bits) != (None, None, None):
        given = [
            name
            for name, value in (
                ("--bucket-size", bucket_size),
                ("--max-iterations", max_iterations),
                ("--fingerprint-bits", fingerprint_bits),
            )
            if value is not None
        ]
        if filter_type == "bloom" or filter_type is None:
            raise click.UsageError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for --type cuckoo")
    return {
        "bucket_size": bucket_size,
        "max_iterations": max_iterations,
        "fingerprint_bits": int(fingerprint_bits) if fingerprint_bits else None,
    }


def backend_option(help_text: str) -> Callable[[F], F]:
    """``--backend auto|redisbloom|bitmap`` for commands that create a filter."""
    return click.option(
        "--backend",
        type=click.Choice(BACKEND_CHOICES),
        default=AUTO,
        show_default=True,
        envvar=BACKEND_ENV,
        help=f"{help_text} [env: {BACKEND_ENV}]",
    )


def shards_option(help_text: str) -> Callable[[F], F]:
    return click.option("--shards", type=click.IntRange(1, MAX_SHARDS), help=help_text)


def expansion_for(backend: str, expansion: int | None, nonscaling: bool) -> int | None:
    """The planner's expansion for ``backend``'s filters from the two sizing flags."""
    from bloomctl.backends import get

    return get(backend).expansion_for(expansion, nonscaling)


def require_error_rate(error_rate: float | None, filter_type: str | None) -> None:
    if error_rate is None and filter_type != "cuckoo":
        raise click.UsageError("Missing option '--error-rate' / '-e' (a Bloom filter needs it)")


def swap_guard_options(f: F) -> F:
    """--keep-old, --min-ratio, --allow-shrink: how a swap treats the replaced filter, and its shrink guard."""
    f = click.option(
        "--allow-recipe-change",
        is_flag=True,
        help="Swap in items built otherwise (source kind, column, template, prefix) than the active filter's.",
    )(f)
    f = click.option("--allow-shrink", is_flag=True, help="Swap even when the standby is below --min-ratio.")(f)
    f = click.option(
        "--min-ratio",
        type=Number(min=0, percent=True),
        default=DEFAULT_MIN_RATIO,
        show_default=True,
        help="Refuse to swap when the standby has fewer items than this fraction of the active filter's.",
    )(f)
    f = click.option(
        "--keep-old",
        metavar="SECONDS",
        type=Number(min=0, max=MAX_KEEP_OLD_SECONDS),
        default=DEFAULT_KEEP_OLD_SECONDS,
        show_default=True,
        help="Keep the replaced filter this long so `rollback` can restore it (it holds its memory "
        "meanwhile); 0 unlinks it now.",
    )(f)
    return lock_wait_option(f)


def lock_wait_option(f: F) -> F:
    """--lock-wait: wait for a held lock instead of exiting 6 at once."""
    return click.option(
        "--lock-wait",
        metavar="SECONDS",
        type=Number(min=0, max=MAX_LOCK_WAIT_SECONDS),
        default=0,
        show_default=True,
        help="Wait up to this long for another run's lock on the filter before giving up (exit 6).",
    )(f)
