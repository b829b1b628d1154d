"""``bloomctl plan``: capacity planning, no server needed."""

from __future__ import annotations

from typing import Any

import click

from bloomctl.cli.options import (
    capacity_callback,
    cuckoo_options,
    cuckoo_values,
    expansion_for,
    format_option,
    require_error_rate,
    shards_option,
    sizing_options,
)
from bloomctl.cli.render import emit_json, emit_pairs, emit_table, fmt_rate, human_bytes, to_flags, warn
from bloomctl.errors import UsageError
from bloomctl.sizing.bloom import DEFAULT_LINE, SERVER_LINES, Plan, for_line, plan, shard_plan, suggest_shards


def _overfills(backend: str) -> bool:
    """Whether the backend keeps taking items past its capacity, so that a plan shows its fill, not a chain."""
    from bloomctl.backends import get

    return get(backend).overfills


def plan_rows(p: Plan, backend: str = "redisbloom") -> list[tuple[str, str]]:
    if _overfills(backend):
        from bloomctl.backends import get

        size = get(backend).size_bytes(p)
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


def plan_data(p: Plan, backend: str = "redisbloom") -> dict[str, Any]:
    data: dict[str, Any] = {"backend": backend, **p.as_dict()}
    data["warnings"] = [to_flags(message) for message in data["warnings"]]
    if _overfills(backend):
        from bloomctl.backends import get

        data["size_bytes"] = get(backend).size_bytes(p)
        if "total_memory_bytes" in data:
            data["total_memory_bytes"] = data["size_bytes"]
        data["warnings"] = [to_flags(message) for message in p.warnings(BITMAP_WHEN_FULL)]
    return data


def render_plan(p: Plan, output_format: str, backend: str = "redisbloom") -> None:
    data = plan_data(p, backend)
    for message in data["warnings"]:
        warn(message)
    if output_format == "json":
        emit_json(data)
        return
    emit_pairs("Plan", plan_rows(p, backend))
    if p.items is not None and _overfills(backend):
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
@cuckoo_options
@click.option(
    "--items",
    "-n",
    callback=capacity_callback,
    help="Projected number of items: shows the growth chain, memory and compound error.",
)
@click.option(
    "--backend",
    type=click.Choice(["redisbloom", "module-free", "bitmap"]),
    default=None,
    help="Size for RedisBloom (BF.RESERVE, CF.RESERVE) or for the module-free backend (bitmap for a Bloom "
    "filter: never grows) [default: redisbloom; module-free with --server bitmap].",
)
@click.option(
    "--server",
    "line",
    type=click.Choice(list(SERVER_LINES)),
    default=None,
    help="The server line to plan for: redis8 (Redis 8: error rates above 0.25 are taken as 0.25), "
    "redisbloom2 (the RedisBloom 2.x module) or bitmap [default: redis8; bitmap with --backend bitmap].",
)
@shards_option("Split the capacity over N member filters.")
@click.option(
    "--max-shard-memory",
    metavar="BYTES",
    callback=capacity_callback,
    help="Suggest the number of shards so that no member needs more memory than this (e.g. 512M, 2G).",
)
@format_option("table", "json")
def plan_command(
    capacity: int,
    error_rate: float | None,
    expansion: int | None,
    nonscaling: bool,
    filter_type: str | None,
    bucket_size: int | None,
    max_iterations: int | None,
    fingerprint_bits: str | None,
    items: int | None,
    backend: str | None,
    line: str | None,
    shards: int | None,
    max_shard_memory: int | None,
    output_format: str,
) -> None:
    """Predict what RedisBloom allocates for a filter, to the byte. Needs no server.

    SIZE_BYTES is what BF.INFO Size reports right after BF.RESERVE with the same
    arguments on the --server line (Redis 8 by default: it takes an error rate above 0.25
    as 0.25; RedisBloom 2.x does not). A scaling filter (the default) builds its first
    sub-filter with half the error rate, and halves it again for every sub-filter it adds
    when full. With --backend bitmap it is the length of the module-free filter's string.

    \b
    Examples:
      bloomctl plan --capacity 1M --error-rate 1%
      bloomctl plan -c 10M -e 0.001 --items 50M --format json
      bloomctl plan -c 1e6 -e 0.01 --nonscaling --items 900k
      bloomctl plan -c 1M -e 1% --backend bitmap
      bloomctl plan -c 77 -e 0.3 --expansion 3 --server redisbloom2
      bloomctl plan -c 2G -e 0.1% --max-shard-memory 512M
      bloomctl plan --type cuckoo -c 1M --bucket-size 4 --items 900k
      bloomctl plan --type cuckoo -c 1M -e 0.01% --backend module-free
    """
    cuckoo = cuckoo_values(filter_type, bucket_size, max_iterations, fingerprint_bits)
    require_error_rate(error_rate, filter_type)
    if filter_type != "cuckoo":
        backend = BLOOM_OPTION.get(backend or "")
    backend, line = _backend_and_line(backend, line)
    if filter_type == "cuckoo":
        if shards is not None or max_shard_memory is not None:
            raise UsageError("cuckoo filters are not sharded: leave out --shards and --max-shard-memory")
        from bloomctl.backends import cuckoo_plan_for as make_plan
        from bloomctl.cli.cuckoo import render_cuckoo_plan

        name = CUCKOO_OPTION[backend]
        render_cuckoo_plan(
            make_plan(name, capacity, error_rate, expansion, nonscaling, cuckoo, items, line), output_format
        )
        return
    assert error_rate is not None
    the_plan = plan(capacity, error_rate, expansion_for(backend, expansion, nonscaling), items)
    if shards is None and max_shard_memory is None:
        the_plan = for_line(the_plan, line)  # (a sharded plan is split first: each member is checked)
    if shards is None and max_shard_memory is None:
        render_plan(the_plan, output_format, backend)
        return
    render_shards(the_plan, backend, shards, max_shard_memory, output_format, line)


# What the options name when plan has no server to ask. For a Bloom filter, --backend module-free
# plans as RedisBloom unless --server bitmap says otherwise; for a cuckoo filter either module-free
# spelling is the module-free backend.
BLOOM_OPTION = {"redisbloom": "redisbloom", "bitmap": "bitmap"}
CUCKOO_OPTION = {"redisbloom": "redisbloom-cuckoo", "bitmap": "lua-cuckoo", "module-free": "lua-cuckoo"}
# The bitmap line is the module-free backend's own: --server bitmap and --backend bitmap go together.
LINE_BACKEND = {"bitmap": "bitmap"}
BACKEND_LINE = {backend: line for line, backend in LINE_BACKEND.items()}


def _backend_and_line(backend: str | None, line: str | None) -> tuple[str, str]:
    """--backend and --server agree: bitmap is both a backend and a line."""
    if backend is not None and line is not None and (backend in BACKEND_LINE) != (line in LINE_BACKEND):
        raise UsageError("--backend %s and --server %s disagree: the bitmap backend is its own line", backend, line)
    if backend is None:
        backend = LINE_BACKEND.get(line or "", "redisbloom")
    if line is None:
        line = BACKEND_LINE.get(backend, DEFAULT_LINE)
    return backend, line


def render_shards(
    total: Plan, backend: str, shards: int | None, max_shard_memory: int | None, output_format: str, line: str
) -> None:
    """Per-shard and total memory of a sharded filter; with --max-shard-memory, the suggested shard count."""
    from bloomctl.backends import get

    size_of = get(backend).size_bytes
    suggested = None
    if max_shard_memory is not None:
        suggested = suggest_shards(total, max_shard_memory, size_of)
        shards = shards or suggested
    assert shards is not None
    member = for_line(shard_plan(total, shards), line)
    member_bytes = size_of(member)
    data = {
        "backend": backend,
        "shards": shards,
        "suggested_shards": suggested,
        "max_shard_memory": max_shard_memory,
        "capacity": total.capacity,
        "error_rate": total.error_rate,
        "capacity_per_shard": member.capacity,
        "shard_bytes": member_bytes,
        "total_bytes": member_bytes * shards,
        "single_filter_bytes": size_of(total),
        "shard": plan_data(member, backend),
    }
    if max_shard_memory is not None and member_bytes > max_shard_memory:
        warn(f"{shards} shards of {member_bytes:,} bytes exceed --max-shard-memory {max_shard_memory:,}")
    if output_format == "json":
        emit_json(data)
        return
    emit_pairs(
        "Sharded plan",
        [
            (
                "shards",
                f"{shards}"
                + (
                    f"  (suggested for --max-shard-memory {human_bytes(max_shard_memory)})"
                    if suggested == shards and max_shard_memory
                    else ""
                ),
            ),
            ("capacity", f"{total.capacity:,} in all, {member.capacity:,} per shard"),
            ("error rate", fmt_rate(total.error_rate) + " (every shard; an item is looked up in one)"),
            ("memory per shard", f"{member_bytes:,}  ({human_bytes(member_bytes)})"),
            ("memory in all", f"{member_bytes * shards:,}  ({human_bytes(member_bytes * shards)})"),
            ("one unsharded filter", f"{size_of(total):,}  ({human_bytes(size_of(total))})"),
        ],
    )
