"""``bloomctl reserve`` and ``bloomctl info``: create a filter with guardrails, and inspect one."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import click

from bloomctl.cli.confirm import ask, confirmer
from bloomctl.cli.context import AppContext
from bloomctl.cli.options import (
    backend_option,
    cuckoo_options,
    cuckoo_values,
    format_option,
    require_error_rate,
    shards_option,
    sizing_options,
    yes_option,
)
from bloomctl.cli.output import current
from bloomctl.cli.plan import plan_data, render_plan
from bloomctl.cli.render import emit_json, emit_pairs, emit_table, fmt_rate, human_bytes, note, warn
from bloomctl.defaults import AUTO
from bloomctl.keys import to_display
from bloomctl.server.topology import node_address

if TYPE_CHECKING:  # pragma: no cover - the library loads when a command runs (start-up time)
    from collections.abc import Callable

    from bloomctl.backends import Backend
    from bloomctl.backends.base import AnyPlan
    from bloomctl.lifecycle.single import ReserveResult


@click.command("reserve")
@click.argument("key")
@sizing_options
@cuckoo_options
@click.option("--dry-run", is_flag=True, help="Print the plan and check the key, create nothing.")
@click.option(
    "--if-not-exists", is_flag=True, help="Succeed without change when a filter with the same parameters exists."
)
@click.option("--force", is_flag=True, help="Create the filter even if it is bigger than the server's free memory.")
@shards_option("Create a sharded filter: N member filters on different slots (and nodes), CAPACITY split between them.")
@backend_option(
    "For a new filter: RedisBloom (BF.*) or the module-free bitmap; auto picks RedisBloom when the server has it. "
    "An existing filter's backend is read from the key."
)
@yes_option
@format_option("table", "json")
@click.pass_obj
def reserve_command(
    app: AppContext,
    key: str,
    capacity: int,
    error_rate: float | None,
    expansion: int | None,
    nonscaling: bool,
    filter_type: str | None,
    bucket_size: int | None,
    max_iterations: int | None,
    fingerprint_bits: str | None,
    dry_run: bool,
    if_not_exists: bool,
    force: bool,
    shards: int | None,
    backend: str,
    yes: bool,
    output_format: str,
) -> None:
    """Create the filter KEY (BF.RESERVE or CF.RESERVE, or a module-free one) after printing its plan.

    Refuses an existing key (exit 5) unless --if-not-exists and the existing filter has the
    same capacity, error rate and expansion. Asks first on a terminal (an empty filter answers
    "absent" for every item until it is filled), unless --yes. Records the error rate, creation time and
    bloomctl version in the metadata hash beside it ({KEY}:meta, same hash slot). On a
    server without BF.* (CF.*) commands, --backend auto creates a module-free filter.

    \b
    Examples:
      bloomctl reserve users --capacity 10M --error-rate 0.1%
      bloomctl reserve 'bf:{users}' -c 1M -e 1% --nonscaling --if-not-exists
      bloomctl reserve users -c 10M -e 0.001 --dry-run
      bloomctl reserve users -c 1M -e 1% --backend bitmap
      bloomctl reserve users -c 3G -e 0.1% --shards 8
      bloomctl reserve sessions --type cuckoo -c 1M --bucket-size 4
    """

    cuckoo = cuckoo_values(filter_type, bucket_size, max_iterations, fingerprint_bits)
    require_error_rate(error_rate, filter_type)
    planned = functools.partial(_plan_for, capacity, error_rate, expansion, nonscaling, cuckoo, shards)
    chosen, the_plan = _chosen(app, backend, planned, filter_type, shards)
    reserve = functools.partial(_reserve, app, key, chosen, the_plan, shards, if_not_exists, force)
    # on a terminal: every check first (a dry run), then the question; nothing to create, nothing asked
    if not dry_run and confirmer(yes) is not None and not reserve(True).existing:
        shape = f", {shards} shards" if shards is not None else ""
        rate = f" at error rate {fmt_rate(the_plan.error_rate)}" if the_plan.error_rate is not None else ""
        ask(yes, f"Create {key!r}: capacity {the_plan.capacity:,}{rate}, {chosen.name}{shape}?")
    # Create first, print after: a refused reserve leaves stdout empty.
    result = reserve(dry_run)
    if chosen.kind == "cuckoo":
        render_reserve(key, the_plan, result, dry_run, output_format)
        return
    if shards is not None:
        render_sharded_reserve(app, key, result, dry_run, output_format)
        return
    if result.created and backend == AUTO and chosen.module_free:
        note(f"{app.server.description} has no BF.* commands: created a module-free bitmap filter")
    if result.size_mismatch and result.state is not None:
        warn(
            f"the server reports Size {result.state.size_bytes:,}, the plan predicted {result.predicted_size:,} "
            f"({app.server.description})"
        )
    render_reserve(key, the_plan, result, dry_run, output_format)


def _chosen(
    app: AppContext, backend: str, planned: Callable[[Backend], AnyPlan], filter_type: str | None, shards: int | None
) -> tuple[Backend, AnyPlan]:
    """The backend and the plan: one filter's as this server builds it (Redis 8 takes an error rate
    above 0.25 as 0.25); a sharded filter's members are checked as they are made."""
    from bloomctl import backends
    from bloomctl.backends.bitmap import TooLarge
    from bloomctl.lifecycle import front as lifecycle

    if shards is not None:
        chosen = backends.choose(app.server, backend, filter_type or "bloom")
        return chosen, planned(chosen)
    try:
        return backends.plan_reserve(app.server, backend, planned, filter_type or "bloom")
    except TooLarge as exc:
        raise lifecycle.too_large(planned(backends.get("bitmap")), None, exc) from None


def _reserve(
    app: AppContext,
    key: str,
    chosen: Backend,
    the_plan: AnyPlan,
    shards: int | None,
    if_not_exists: bool,
    force: bool,
    dry_run: bool,
) -> ReserveResult:
    """The reserve itself (a cuckoo filter's, or one or a sharded Bloom filter), after every check."""
    from bloomctl.lifecycle import front as lifecycle

    if chosen.kind == "cuckoo":
        from bloomctl.cli.cuckoo import reserve_cuckoo

        return reserve_cuckoo(app, key, chosen, the_plan, dry_run, if_not_exists, force)
    return lifecycle.reserve(
        app.client,
        app.server,
        key,
        the_plan,
        shards=shards,
        if_not_exists=if_not_exists,
        backend=chosen.name,
        force=force,
        dry_run=dry_run,
    )


def _plan_for(
    capacity: int,
    error_rate: float | None,
    expansion: int | None,
    nonscaling: bool,
    cuckoo: dict[str, Any],
    shards: int | None,
    chosen: Backend,
) -> AnyPlan:
    """The plan of reserve's options, for the backend chosen (its filter type, expansion and engine)."""
    from bloomctl.backends import cuckoo_plan_for
    from bloomctl.sizing.bloom import plan as make_plan

    if chosen.kind == "cuckoo":
        if shards is not None:
            raise click.UsageError("cuckoo filters are not sharded: leave out --shards")
        return cuckoo_plan_for(chosen.name, capacity, error_rate, expansion, nonscaling, cuckoo, None, None)
    assert error_rate is not None
    return make_plan(capacity, error_rate, chosen.expansion_for(expansion, nonscaling))


def render_reserve(key: str, the_plan: AnyPlan, result: ReserveResult, dry_run: bool, output_format: str) -> None:
    from bloomctl.sizing.cuckoo import CuckooPlan

    exists = result.state is not None
    if isinstance(the_plan, CuckooPlan):
        from bloomctl.cli.cuckoo import cuckoo_plan_data, render_cuckoo_plan

        plan_dict = cuckoo_plan_data(the_plan)
    else:
        plan_dict = plan_data(the_plan, result.backend)
    if output_format == "json":
        data: dict[str, Any] = {"plan": plan_dict}
        if dry_run:
            data.update(dry_run=True, key_exists=exists)
        else:
            data.update(created=result.created, filter=result.state.as_dict() if result.state else None)
        emit_json(data)
        return
    if isinstance(the_plan, CuckooPlan):
        render_cuckoo_plan(the_plan, output_format)
    else:
        render_plan(the_plan, output_format, result.backend)
    if dry_run:
        verdict = "it already exists with these parameters" if exists else "would create it"
        note(f"dry run: nothing created ({verdict})")
    elif result.created and result.state is not None:
        click.echo(f"created {key!r}: Size {result.state.size_bytes:,} bytes, capacity {result.state.capacity:,}")
    else:
        click.echo(f"{key!r} already exists with these parameters: nothing to do")


def render_sharded_reserve(app: AppContext, key: str, result: ReserveResult, dry_run: bool, output_format: str) -> None:
    manifest = result.manifest
    assert manifest is not None
    if result.existing:
        if output_format == "json":
            emit_json({"created": False, "key": to_display(manifest.key), "shards": manifest.shards})
        else:
            click.echo(f"{to_display(manifest.key)!r} already exists with {manifest.shards} shards: nothing to do")
        return
    states = result.member_states
    if output_format == "json":
        emit_json(
            {
                "manifest": manifest.as_dict(),
                "dry_run": dry_run,
                "created": result.created,
                "shards": [state.as_dict() for state in states],
            }
        )
        return
    emit_table(
        f"Sharded filter {to_display(manifest.key)}: {manifest.shards} shards of {manifest.capacity:,}",
        ["#", "member", "node", "bytes"],
        [
            (i, to_display(m), node_address(app.client, m) or "-", f"{states[i].size_bytes:,}" if states else "-")
            for i, m in enumerate(manifest.members)
        ],
    )
    note(
        "dry run: nothing created"
        if dry_run
        else f"created the manifest {to_display(manifest.key)!r} and {manifest.shards} members"
    )


def describe_rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [
        ("key", data["key"]),
        ("backend", data["backend"]),
        ("reserved capacity", f"{data['reserved_capacity']:,}"),
        ("capacity (all sub-filters)", f"{data['capacity']:,}"),
        ("items", f"{data['items']:,}"),
        ("fill ratio", f"{data['fill_ratio']:.2%}  (items / reserved capacity)"),
        ("estimated FPR now", fmt_rate(data["estimated_fpr"]) + ("  (measured bit fill)" if data["exact"] else "")),
        ("sub-filters", str(data["filters"])),
        ("expansion", "none (NONSCALING)" if data["nonscaling"] else str(data["expansion"])),
        ("size", f"{data['size_bytes']:,} bytes  ({human_bytes(data['size_bytes'])})"),
        ("ttl", "none" if data["ttl_seconds"] is None else f"{data['ttl_seconds']:.0f}s"),
        ("slot", str(data["slot"]) + (f"  (node {data['node']})" if data["node"] else "")),
    ]
    for role, companion in data["companions"].items():
        rows.append((role.replace("_", " "), f"{companion['key']}  ({'exists' if companion['exists'] else 'absent'})"))
    for name, value in data["metadata"].items():
        rows.append((f"meta {name}", value))
    return rows


@click.command("info")
@click.argument("key")
@click.option(
    "--exact",
    is_flag=True,
    help="Scan the bits (BF.SCANDUMP; CF.SCANDUMP: the slots) for the true fill and FPR of every sub-filter.",
)
@format_option("table", "json")
@click.pass_obj
def info_command(app: AppContext, key: str, exact: bool, output_format: str) -> None:
    """Show the filter KEY: BF.INFO (CF.INFO), fill, error rate and hashes per sub-filter, FPR now, TTL, companions, metadata.

    A cuckoo filter shows its load factor (items / slots), deletions, buckets and sub-filters;
    --exact counts the slots that hold a fingerprint in each sub-filter (CF.SCANDUMP).

    \b
    Examples:
      bloomctl info users
      bloomctl info 'bf:{users}' --format json | jq .fill_ratio
      bloomctl info users --exact
    """
    from bloomctl.lifecycle import front as lifecycle
    from bloomctl.lifecycle.sharded import ShardedDescription

    description = lifecycle.describe(app.client, key, exact=exact)
    if isinstance(description, ShardedDescription):
        render_sharded(description.as_dict(), output_format)
        return
    data = description.as_dict()
    data["warnings"] = info_warnings(app, description)
    for warning in data["warnings"]:
        current().warn(warning)
    if output_format == "json":
        emit_json(data)
        return
    if data["type"] == "cuckoo":
        from bloomctl.cli.cuckoo import render_info

        render_info(data)
        return
    emit_pairs(f"Filter {to_display(description.key)}", describe_rows(data))
    if data["subfilters"]:
        emit_table(
            "Sub-filters",
            ["#", "capacity", "items", "error rate", "hashes", "bytes", "bit fill", "est. FPR"],
            [
                (
                    s["index"],
                    f"{s['capacity']:,}",
                    f"{s['items']:,}",
                    fmt_rate(s["error_rate"]),
                    s["hashes"],
                    f"{s['bytes']:,}",
                    f"{s['bit_fill']:.2%}" + ("" if s["bits_set"] is not None else "*"),
                    fmt_rate(s["estimated_fpr"]),
                )
                for s in data["subfilters"]
            ],
        )
        if not data["exact"]:
            note("* expected bit fill from the item count; --exact measures it")


def info_warnings(app: AppContext, description: Any) -> list[str]:
    """What an operator should hear about a filter: one auto-created with the server's defaults
    (the classic forgotten BF.RESERVE: 100 items, then a chain of ever bigger sub-filters)."""
    from bloomctl import backends
    from bloomctl.server.capabilities import BloomDefaults, bloom_defaults, looks_auto_created

    state = description.state
    if state.kind == "cuckoo":
        from bloomctl.cli.cuckoo import info_warnings as cuckoo_warnings

        return cuckoo_warnings(state)
    made_by_plain_add = backends.get(state.backend).made_by_plain_add
    if not made_by_plain_add:
        return []
    defaults = bloom_defaults(app.client, app.server)
    first_error = state.subfilters[0].error_rate if state.subfilters else None
    # the server's defaults now, or the module's built-in ones (a filter made before a CONFIG SET)
    matched = next(
        (
            d
            for d in (defaults, BloomDefaults())
            if looks_auto_created(
                made_by_plain_add, state.reserved_capacity, state.expansion, first_error, description.metadata, d
            )
        ),
        None,
    )
    if matched is None:
        return []
    defaults = matched
    return [
        f"{to_display(description.key)!r} looks auto-created with the server's defaults (capacity {defaults.capacity:,}, "
        f"error rate {defaults.error_rate:g}, from {defaults.source}): a BF.ADD, BF.MADD or BF.INSERT on a missing key "
        "creates it so. Reserve filters before the application writes (`bloomctl reserve`), then rebuild this one "
        "with a planned capacity (`bloomctl rebuild ... --capacity N`)"
    ]


def render_sharded(data: dict[str, Any], output_format: str) -> None:
    if output_format == "json":
        emit_json(data)
        return
    manifest = data["manifest"]
    emit_pairs(
        f"Sharded filter {data['key']}",
        [
            ("backend", data["backend"]),
            ("shards", f"{data['shards']} (routing: crc32(item) mod {data['shards']})"),
            ("reserved capacity", f"{data['reserved_capacity']:,}"),
            ("items", f"{data['items']:,}"),
            ("fill ratio (worst shard)", f"{data['fill_ratio']:.2%}  (shard {data['worst_shard']})"),
            ("estimated FPR now (worst shard)", fmt_rate(data["estimated_fpr"])),
            ("size", f"{data['size_bytes']:,} bytes  ({human_bytes(data['size_bytes'])})"),
            ("created", f"{manifest['created_at']} by {manifest['created_by']}"),
            ("missing members", ", ".join(data["missing_members"]) or "none"),
        ],
    )
    emit_table(
        "Shards",
        ["#", "member", "node", "items", "fill", "est. FPR", "bytes", "standby", "old"],
        [
            (
                i,
                m["key"],
                m["node"] or "-",
                f"{m['items']:,}",
                f"{m['fill_ratio']:.2%}",
                fmt_rate(m["estimated_fpr"]),
                f"{m['size_bytes']:,}",
                "yes" if m["companions"]["standby"]["exists"] else "no",
                "yes" if m["companions"]["old"]["exists"] else "no",
            )
            if m is not None
            else (i, data["manifest"]["members"][i], "-", "missing", "-", "-", "-", "-", "-")
            for i, m in enumerate(data["members"])
        ],
    )
