"""``bloomctl plan``: capacity planning, offline, or for the line of a server named on the command line."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from bloomctl.cli.context import AppContext
from bloomctl.cli.options import (
    SIZE_HELP,
    capacity_callback,
    cuckoo_options,
    cuckoo_values,
    expansion_for,
    format_option,
    require_error_rate,
    shards_option,
    size_callback,
    sizing_options,
)
from bloomctl.cli.render import emit_json, emit_pairs, emit_table, fmt_rate, human_bytes, to_flags, warn
from bloomctl.defaults import MAX_SHARDS
from bloomctl.errors import UsageError
from bloomctl.sizing.bloom import DEFAULT_LINE, SERVER_LINES, Plan, plan, shard_plan, suggest_shards

if TYPE_CHECKING:  # pragma: no cover - annotations only: plan loads the server code only when it asks one
    from bloomctl.server.capabilities import ServerInfo


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


def render_plan(
    p: Plan, output_format: str, backend: str = "redisbloom", planned_for: dict[str, Any] | None = None
) -> None:
    """The plan as text or JSON; ``planned_for`` (plan's own output, not reserve's) names the server line."""
    data = plan_data(p, backend)
    for message in data["warnings"]:
        warn(message)
    if output_format == "json":
        emit_json({"backend": backend, **(planned_for or {}), **data})
        return
    emit_pairs("Plan", (planned_for_rows(planned_for) if planned_for else []) + plan_rows(p, backend))
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
    "filter: never grows) [default: redisbloom; module-free with --server bitmap; with --url, what reserve "
    "would choose on that server].",
)
@click.option(
    "--server",
    "line",
    type=click.Choice(list(SERVER_LINES)),
    default=None,
    help="The server line to plan for: redis8 (Redis 8: error rates above 0.25 are taken as 0.25), "
    "redisbloom2 (the RedisBloom 2.x module) or bitmap [default: redis8; bitmap with --backend bitmap; "
    "with --url, -h or -p, the line that server runs].",
)
@shards_option("Split the capacity over N member filters.")
@click.option(
    "--max-shard-memory",
    metavar="BYTES",
    callback=size_callback,
    help=f"Suggest the number of shards so that no member needs more memory than this (e.g. 512mb, 2gb). {SIZE_HELP}",
)
@format_option("table", "json")
@click.pass_obj
def plan_command(
    app: AppContext,
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
    """Predict what RedisBloom allocates for a filter, to the byte. Needs no server, unless given one.

    SIZE_BYTES is what BF.INFO Size reports right after BF.RESERVE with the same
    arguments on the --server line (Redis 8 by default: it takes an error rate above 0.25
    as 0.25; RedisBloom 2.x does not). A scaling filter (the default) builds its first
    sub-filter with half the error rate, and halves it again for every sub-filter it adds
    when full. With --backend bitmap it is the length of the module-free filter's string.

    Given a server on the command line (--url, -h or -p), plan asks it which line it runs
    and which backend reserve would use there, and plans for that; an unreachable server
    exits 3. $BLOOMCTL_URL alone does not make it connect. The output names the line.

    \b
    Examples:
      bloomctl plan --capacity 1M --error-rate 1%
      bloomctl plan -c 10M -e 0.001 --items 50M --format json
      bloomctl plan -c 1e6 -e 0.01 --nonscaling --items 900k
      bloomctl plan -c 1M -e 1% --backend bitmap
      bloomctl plan -c 77 -e 0.3 --expansion 3 --server redisbloom2
      bloomctl plan -c 77 -e 0.3 --expansion 3 --url redis://cache.internal:6379
      bloomctl plan -c 2G -e 0.1% --max-shard-memory 512mb
      bloomctl plan --type cuckoo -c 1M --bucket-size 4 --items 900k
      bloomctl plan --type cuckoo -c 1M -e 0.01% --backend module-free
    """
    cuckoo = cuckoo_values(filter_type, bucket_size, max_iterations, fingerprint_bits)
    require_error_rate(error_rate, filter_type)
    if filter_type == "cuckoo" and (shards is not None or max_shard_memory is not None):
        raise UsageError("cuckoo filters are not sharded: leave out --shards and --max-shard-memory")
    target, line_given = asked_server(app, line), line is not None
    if target is None:
        name, line, fit = offline_backend(backend, line, filter_type)
    else:
        name, line, fit = server_backend(target, backend, filter_type)
    planned_for = planned_for_data(line, line_given, target, app)
    if filter_type == "cuckoo":
        from bloomctl.backends import cuckoo_plan_for as make_plan

        cuckoo_plan = make_plan(name, capacity, error_rate, expansion, nonscaling, cuckoo, items, line)
        render_cuckoo(fit(cuckoo_plan), output_format, planned_for)
        return
    assert error_rate is not None
    the_plan = plan(capacity, error_rate, expansion_for(name, expansion, nonscaling), items)
    if shards is None and max_shard_memory is None:
        render_plan(fit(the_plan), output_format, name, planned_for)
        return
    # a sharded plan is split first: each member is checked against the line, not the whole
    render_shards(the_plan, name, shards, max_shard_memory, output_format, fit, planned_for)


# What the options name when plan has no server to ask. For a Bloom filter, --backend module-free
# plans as RedisBloom unless --server bitmap says otherwise; for a cuckoo filter either module-free
# spelling is the module-free backend.
BLOOM_OPTION = {"redisbloom": "redisbloom", "bitmap": "bitmap"}
CUCKOO_OPTION = {"redisbloom": "redisbloom-cuckoo", "bitmap": "lua-cuckoo", "module-free": "lua-cuckoo"}
# The bitmap line is the module-free backend's own: --server bitmap and --backend bitmap go together.
LINE_BACKEND = {"bitmap": "bitmap"}
BACKEND_LINE = {backend: line for line, backend in LINE_BACKEND.items()}
# The global options that name a server: given on the command line, plan asks that server.
SERVER_OPTIONS = frozenset({"url", "host", "port"})
Fit = Callable[[Any], Any]  # a plan as the chosen backend builds it on the line planned for


def asked_server(app: AppContext, line: str | None) -> ServerInfo | None:
    """The server the command line names (--url, -h, -p), asked which line it runs; None when it
    names none. A --server that says another line than the server's is refused."""
    if not SERVER_OPTIONS & app.overrides.keys():
        return None
    server = app.server
    if line is not None and line != server.line:
        raise UsageError(
            "--server %s disagrees with the server at %s, which runs the %s line (%s): leave out one of them",
            line,
            app.settings.redacted_url,
            server.line,
            server.description,
        )
    return server


def offline_backend(backend: str | None, line: str | None, filter_type: str | None) -> tuple[str, str, Fit]:
    """The backend and line the options name, with no server to ask."""
    if filter_type != "cuckoo":
        backend = BLOOM_OPTION.get(backend or "")
    backend, line = _backend_and_line(backend, line)
    if filter_type == "cuckoo":
        return CUCKOO_OPTION[backend], line, lambda p: p  # cuckoo_plan_for checks the line itself
    from bloomctl.backends import get

    # as the backend checks a plan on that line (a bitmap filter's 512 MB string limit holds offline too)
    return backend, line, lambda p: get(backend).check_plan(p, line)


def server_backend(server: ServerInfo, backend: str | None, filter_type: str | None) -> tuple[str, str, Fit]:
    """The backend reserve would choose on ``server`` (or the one --backend names, if the server
    has its commands), and the server's line."""
    from bloomctl.backends import AUTO, choose

    chosen = choose(server, backend or AUTO, filter_type or "bloom")
    return chosen.name, server.line, lambda p: chosen.check_plan(p, server.line)


def planned_for_data(line: str, given: bool, server: ServerInfo | None, app: AppContext) -> dict[str, Any]:
    """The line planned for, where it came from (the server asked, --server, or the default) and
    the server asked: part of plan's JSON."""
    if server is None:
        return {"server_line": line, "server_line_from": "--server" if given else "default", "server": None}
    return {
        "server_line": line,
        "server_line_from": "server",
        "server": {"url": app.settings.redacted_url, "description": server.description, **server.as_dict()},
    }


def planned_for_rows(planned_for: dict[str, Any]) -> list[tuple[str, str]]:
    """The line planned for, and why that one, as a row of the text output."""
    line, server = planned_for["server_line"], planned_for["server"]
    if server is not None:
        why = f"{server['description']} at {server['url']}"
    elif planned_for["server_line_from"] == "--server":
        why = "--server"
    else:
        why = "the default: --server or --url chooses"
    return [("server line", f"{line}  ({why})")]


def render_cuckoo(p: Any, output_format: str, planned_for: dict[str, Any]) -> None:
    from bloomctl.cli.cuckoo import cuckoo_plan_data, render_cuckoo_plan

    if output_format != "json":
        emit_pairs("", planned_for_rows(planned_for))
        render_cuckoo_plan(p, output_format)
        return
    data = cuckoo_plan_data(p)
    for message in data["warnings"]:
        warn(message)
    emit_json({"backend": data["backend"], **planned_for, **data})


def _backend_and_line(backend: str | None, line: str | None) -> tuple[str, str]:
    """--backend and --server agree: bitmap is both a backend and a line."""
    if backend is not None and line is not None and (backend in BACKEND_LINE) != (line in LINE_BACKEND):
        raise UsageError("--backend %s and --server %s disagree: the bitmap backend is its own line", backend, line)
    if backend is None:
        backend = LINE_BACKEND.get(line or "", "redisbloom")
    if line is None:
        line = BACKEND_LINE.get(backend, DEFAULT_LINE)
    return backend, line


def _fitted_member(total: Plan, shards: int, fit: Fit, suggesting: bool) -> tuple[Plan, int]:
    """A member's plan as the line builds it, and the shards. A bitmap member past Redis's 512 MB
    string: with a suggestion to make, the fewest shards that fit; else the error naming them."""
    from bloomctl.backends.bitmap import TooLarge
    from bloomctl.lifecycle import front as lifecycle

    try:
        return fit(shard_plan(total, shards)), shards
    except TooLarge as exc:
        if not suggesting:
            raise lifecycle.too_large(total, shards, exc) from None
        for more in range(shards + 1, MAX_SHARDS + 1):
            try:
                return fit(shard_plan(total, more)), more
            except TooLarge:
                continue
        raise


def render_shards(
    total: Plan,
    backend: str,
    shards: int | None,
    max_shard_memory: int | None,
    output_format: str,
    fit: Fit,
    planned_for: dict[str, Any],
) -> None:
    """Per-shard and total memory of a sharded filter; with --max-shard-memory, the suggested shard count."""
    from bloomctl.backends import get

    size_of = get(backend).size_bytes
    suggested = None
    if max_shard_memory is not None:
        suggested = suggest_shards(total, max_shard_memory, size_of)
        shards = shards or suggested
    assert shards is not None
    member, fitted = _fitted_member(total, shards, fit, suggested is not None)
    if fitted != shards:  # a bitmap member past Redis's string limit: the shards that fit
        shards = suggested = fitted
    member_bytes = size_of(member)
    data = {
        "backend": backend,
        **planned_for,
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
            *planned_for_rows(planned_for),
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
