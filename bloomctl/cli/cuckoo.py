"""Cuckoo filters on the command line: their plans, reserve, and what ``info`` shows of them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bloomctl.cli.render import emit_json, emit_pairs, emit_table, fmt_rate, human_bytes, note, to_flags, warn

if TYPE_CHECKING:  # pragma: no cover - the library loads when a command runs (start-up time)
    from bloomctl.backends import Backend
    from bloomctl.backends.base import AnyPlan
    from bloomctl.cli.context import AppContext
    from bloomctl.lifecycle.single import ReserveResult
    from bloomctl.sizing.cuckoo import CuckooPlan


def plan_rows(p: CuckooPlan) -> list[tuple[str, str]]:
    engine = "RedisBloom (CF.*)" if p.engine == "redisbloom" else "module-free (one Redis string, the function library)"
    rows = [
        ("type", f"cuckoo: {engine}"),
        ("capacity", f"{p.capacity:,}"),
        ("bucket size", str(p.bucket_size)),
        ("max iterations", str(p.max_iterations)),
        ("fingerprint bits", str(p.fingerprint_bits)),
        ("buckets", f"{p.buckets:,}  (capacity / bucket size, rounded up to a power of two)"),
        ("slots", f"{p.slots:,}"),
        ("expansion", f"{p.growth} (rounded up to a power of two)" if p.scaling else "none (never grows)"),
        (
            "inserts start to fail",
            f"at about {p.usable_capacity:,} items ({p.full_load:.0%} of the slots, measured)"
            + (": then the filter grows" if p.scaling else ": then inserts fail"),
        ),
        (
            "false-positive rate",
            f"{fmt_rate(p.error_rate)} at that load; {fmt_rate(p.worst_error_rate)} with every slot full",
        ),
        (
            "size_bytes (CF.INFO Size)" if p.engine == "redisbloom" else "size_bytes (STRLEN)",
            f"{p.size_bytes:,}  ({human_bytes(p.size_bytes)})",
        ),
    ]
    if p.target_error_rate is not None:
        rows.insert(7, ("target error rate", fmt_rate(p.target_error_rate)))
    return rows


def cuckoo_plan_data(p: CuckooPlan) -> dict[str, Any]:
    data: dict[str, Any] = {"backend": "redisbloom-cuckoo" if p.engine == "redisbloom" else "lua-cuckoo", **p.as_dict()}
    data["warnings"] = [to_flags(message) for message in data["warnings"]]
    return data


def render_cuckoo_plan(p: CuckooPlan, output_format: str) -> None:
    data = cuckoo_plan_data(p)
    for message in data["warnings"]:
        warn(message)
    if output_format == "json":
        emit_json(data)
        return
    emit_pairs("Plan", plan_rows(p))
    if p.items is not None:
        emit_table(
            f"Sub-filters for {p.items:,} items",
            ["#", "buckets", "slots"],
            [(s.index, f"{s.buckets:,}", f"{s.slots:,}") for s in p.chain],
        )
        emit_pairs(
            "",
            [
                ("sub-filters", str(len(p.chain))),
                ("load", f"{p.load_at_items:.1%}" if p.load_at_items is not None else "-"),
                ("total memory", f"{p.total_memory_bytes:,}  ({human_bytes(p.total_memory_bytes)})"),
                ("false-positive rate at that load", fmt_rate(p.error_rate_at_items)),
            ],
        )


def reserve_cuckoo(
    app: AppContext,
    key: str,
    chosen: Backend,
    the_plan: AnyPlan,
    dry_run: bool,
    if_not_exists: bool,
    force: bool,
) -> ReserveResult:
    """Create the cuckoo filter (after every check); the caller renders the result."""
    from bloomctl.lifecycle import front as lifecycle

    result = lifecycle.reserve(
        app.client,
        app.server,
        key,
        the_plan,
        if_not_exists=if_not_exists,
        backend=chosen.name,
        force=force,
        dry_run=dry_run,
    )
    if result.created and chosen.module_free and not app.server.has_cuckoo:
        note(f"{app.server.description} has no CF.* commands: created a module-free cuckoo filter")
    if result.size_mismatch and result.state is not None:
        warn(
            f"the server reports Size {result.state.size_bytes:,}, the plan predicted {result.predicted_size:,} "
            f"({app.server.description})"
        )
    return result


def describe_rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    """``info``'s table for a cuckoo filter (the JSON keys are its interface)."""
    rows = [
        ("key", data["key"]),
        ("type", f"cuckoo ({data['backend']})"),
        ("items", f"{data['items']:,}  ({data['deleted']:,} deleted since the last compaction)"),
        (
            "load factor",
            f"{data['load_factor']:.2%}  (items / slots; inserts start to fail near {data['full_load']:.0%})",
        ),
        ("slots (all sub-filters)", f"{data['capacity']:,}"),
        ("reserved slots", f"{data['reserved_capacity']:,}  ({data['buckets']:,} buckets of {data['bucket_size']})"),
        ("max iterations", str(data["max_iterations"])),
        ("fingerprint bits", str(data["fingerprint_bits"])),
        ("estimated FPR now", fmt_rate(data["estimated_fpr"]) + ("  (measured slots)" if data["exact"] else "")),
        ("sub-filters", str(data["filters"])),
        ("expansion", "none (never grows)" if data["nonscaling"] else str(data["expansion"])),
        ("size", f"{data['size_bytes']:,} bytes  ({human_bytes(data['size_bytes'])})"),
        ("ttl", "none" if data["ttl_seconds"] is None else f"{data['ttl_seconds']:.0f}s"),
        ("slot", str(data["slot"]) + (f"  (node {data['node']})" if data["node"] else "")),
    ]
    for role, companion in data["companions"].items():
        rows.append((role.replace("_", " "), f"{companion['key']}  ({'exists' if companion['exists'] else 'absent'})"))
    for name, value in data["metadata"].items():
        rows.append((f"meta {name}", value))
    return rows


def render_info(data: dict[str, Any]) -> None:
    emit_pairs(f"Filter {data['key']}", describe_rows(data))
    emit_table(
        "Sub-filters",
        ["#", "buckets", "slots", "occupied", "load", "est. FPR"],
        [
            (
                s["index"],
                f"{s['buckets']:,}",
                f"{s['slots']:,}",
                "-" if s["occupied"] is None else f"{s['occupied']:,}",
                "-" if s["load_factor"] is None else f"{s['load_factor']:.2%}",
                fmt_rate(s["estimated_fpr"]),
            )
            for s in data["subfilters"]
        ],
    )
    if not data["exact"]:
        note("the slots of each sub-filter are counted with --exact (CF.INFO counts items only in all)")


def info_warnings(state: Any) -> list[str]:
    """A cuckoo filter near or past the load where its inserts fail, or one that has grown."""
    notes = []
    if state.filters > 1:
        notes.append(
            f"the filter has grown to {state.filters} sub-filters: every lookup checks each, so its false-positive "
            "rate adds up, and a delete-heavy load may compact it; rebuild it with a larger capacity"
        )
    if state.fill_ratio >= state.full_load:
        verb = "grow" if state.expansion is not None else "fail ('Filter is full')"
        notes.append(
            f"its load is {state.fill_ratio:.1%}, past the {state.full_load:.0%} at which inserts start to {verb} "
            f"for bucket size {state.bucket_size} and {state.max_iterations} max iterations"
        )
    return notes
