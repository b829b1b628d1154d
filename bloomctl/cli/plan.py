"""``bloomctl plan``: capacity planning, no server needed."""

from __future__ import annotations

import click

from bloomctl.cli.options import _parse_capacity, format_option, resolve_expansion, sizing_options
from bloomctl.cli.render import emit_json, emit_pairs, emit_table, fmt_rate, human_bytes, warn
from bloomctl.planner import Plan, plan


def plan_rows(p: Plan, backend: str = "redisbloom") -> list[tuple[str, str]]:
    if backend == "bitmap":
        from bloomctl.backends import get

        size = get("bitmap").size_bytes(p)
        return [
            ("backend", "bitmap (one Redis string, hashed by server-side Lua; never grows)"),
            ("capacity", f"{p.capacity:,}"),
            ("error rate", fmt_rate(p.error_rate)),
            ("bits per item", f"{p.first.bits_per_item:.4f}"),
            ("hashes (k)", str(p.first.hashes)),
            ("bits (m)", f"{p.first.bits:,}"),
            ("size_bytes (STRLEN)", f"{size:,}  ({human_bytes(size)}: 64-byte header + bits)"),
            ("naive -n ln p / ln2^2", f"{p.naive_bytes:,}"),
        ]
    extra = p.size_bytes / p.naive_bytes - 1 if p.naive_bytes else 0
    return [
        ("capacity", f"{p.capacity:,}"),
        ("error rate", fmt_rate(p.error_rate)),
        ("expansion", str(p.expansion) if p.scaling else "none (NONSCALING)"),
        ("first sub-filter error", fmt_rate(p.first.error_rate) + ("  (x0.5 tightening)" if p.scaling else "")),
        ("bits per item", f"{p.first.bits_per_item:.4f}"),
        ("hashes (k)", str(p.first.hashes)),
        ("first sub-filter", f"{p.first.bits:,} bits = {human_bytes(p.first.bytes)}"),
        ("size_bytes (BF.INFO Size)", f"{p.size_bytes:,}  ({human_bytes(p.size_bytes)})"),
        ("naive -n ln p / ln2^2", f"{p.naive_bytes:,}  (RedisBloom needs {extra:+.1%})"),
    ]


BITMAP_WHEN_FULL = "a bitmap filter keeps accepting items, and its false-positive rate keeps rising"


def plan_data(p: Plan, backend: str = "redisbloom") -> dict:
    data = {"backend": backend, **p.as_dict()}
    if backend == "bitmap":
        from bloomctl.backends import get

        data["size_bytes"] = get("bitmap").size_bytes(p)
        if "total_memory_bytes" in data:
            data["total_memory_bytes"] = data["size_bytes"]
        data["warnings"] = p.warnings(BITMAP_WHEN_FULL)
    return data


def render_plan(p: Plan, output_format: str, backend: str = "redisbloom") -> None:
    data = plan_data(p, backend)
    for message in data["warnings"]:
        warn(message)
    if output_format == "json":
        emit_json(data)
        return
    emit_pairs("Plan", plan_rows(p, backend))
    if p.items is not None and backend == "bitmap":
        emit_pairs(
            "",
            [
                ("items", f"{p.items:,}  ({p.items / p.capacity:.0%} of capacity)"),
                ("false-positive rate at that fill", fmt_rate(p.compound_error_rate)),
            ],
        )
    elif p.items is not None:
        emit_table(
            f"Growth chain for {p.items:,} items",
            ["#", "capacity", "error rate", "hashes", "bytes"],
            [(s.index, f"{s.capacity:,}", fmt_rate(s.error_rate), s.hashes, f"{s.bytes:,}") for s in p.chain],
        )
        emit_pairs(
            "",
            [
                ("sub-filters", str(len(p.chain))),
                ("total capacity", f"{p.total_capacity:,}"),
                ("total memory", f"{p.total_memory_bytes:,}  ({human_bytes(p.total_memory_bytes)})"),
                ("compound false-positive rate", fmt_rate(p.compound_error_rate)),
            ],
        )


@click.command("plan")
@sizing_options
@click.option(
    "--items",
    "-n",
    callback=_parse_capacity,
    help="Projected number of items: shows the growth chain, memory and compound error.",
)
@click.option(
    "--backend",
    type=click.Choice(["redisbloom", "bitmap"]),
    default="redisbloom",
    show_default=True,
    help="Size for RedisBloom (BF.RESERVE) or for the module-free bitmap backend (always NONSCALING).",
)
@format_option("table", "json")
def plan_command(
    capacity: int,
    error_rate: float,
    expansion: int | None,
    nonscaling: bool,
    items: int | None,
    backend: str,
    output_format: str,
) -> None:
    """Predict what RedisBloom allocates for a filter, to the byte. Needs no server.

    SIZE_BYTES is what BF.INFO Size reports right after BF.RESERVE with the same
    arguments. A scaling filter (the default) builds its first sub-filter with half the
    error rate, and halves it again for every sub-filter it adds when full. With
    --backend bitmap it is the length of the module-free filter's string.

    \b
    Examples:
      bloomctl plan --capacity 1M --error-rate 1%
      bloomctl plan -c 10M -e 0.001 --items 50M --format json
      bloomctl plan -c 1e6 -e 0.01 --nonscaling --items 900k
      bloomctl plan -c 1M -e 1% --backend bitmap
    """
    the_plan = plan(capacity, error_rate, resolve_expansion(expansion, nonscaling, backend), items)
    render_plan(the_plan, output_format, backend)
