"""Validate a dump before a restore writes anything: its header's fields, and whether the target
server and key can hold the filter it describes.

A hand-edited or foreign header fails here with one line (exit 8), and so does one whose sizes are
not what its own capacity and error rate give: the server reserves what a header declares the
moment it loads it. A server without the backend's load command, or a target key holding another
kind of filter or another sharding, fails before any key is written. The chunks themselves are
checked by the filter's backend as they arrive.
"""

from __future__ import annotations

from typing import Any

from bloomctl import backends
from bloomctl.backends import Backend
from bloomctl.backends.base import in_range
from bloomctl.defaults import MAX_SHARDS
from bloomctl.errors import StateConflict, UnsupportedServer, UsageError
from bloomctl.keys import to_display
from bloomctl.lifecycle.manifest import read_manifest
from bloomctl.lifecycle.routing import ROUTING
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.sizing.bloom import ERROR_TIGHTENING_RATIO, MAX_EXPANSION, Plan, SubFilter, memory_bytes
from bloomctl.transfer.dumpfile import DumpCorrupt


def _member_ok(member: Any, backend: Backend) -> bool:
    return (
        isinstance(member, dict)
        and in_range(member.get("capacity"), 1)
        and in_range(member.get("items"), 0)
        and in_range(member.get("size_bytes"), 1)
        and in_range(member.get("filters"), 1)
        and (member.get("expansion") is None or in_range(member.get("expansion"), 1, MAX_EXPANSION))
        and backend.dump_member_ok(member)
    )


def check_header(header: dict[str, Any]) -> None:
    """Every field a restore uses, of the right kind and in range: a hand-edited or foreign header
    fails here with one line (exit 8), before anything is written."""
    shards = header.get("shards")
    members = header.get("members")
    metadata = header.get("metadata")
    source = header.get("source", {})
    error_rate = header.get("error_rate")
    ok = (
        header.get("backend") in backends.names()
        and (shards is None or in_range(shards, 1, MAX_SHARDS))
        and isinstance(members, list)
        and len(members) == (shards or 1)
        and all(_member_ok(m, backends.get(header["backend"])) for m in members)
        and (shards is None or backends.get(header["backend"]).shardable)
        and in_range(header.get("capacity"), 1)
        and isinstance(error_rate, float | int)
        and not isinstance(error_rate, bool)
        and 0 < error_rate < 1
        and (header.get("expansion") is None or in_range(header.get("expansion"), 1, MAX_EXPANSION))
        and in_range(header.get("items"), 0)
        and isinstance(metadata, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        and isinstance(source, dict)
        and (shards is None or header.get("routing") == ROUTING)
    )
    if not ok:
        raise DumpCorrupt("the dump's header is incomplete or inconsistent (backend, parameters, members)")


def check_sizes(header: dict[str, Any]) -> None:
    """Each member's size is the one its capacity, error rate, expansion and sub-filters give, to
    the byte: the server reserves what a header declares as soon as it loads it, and a forged size
    would reserve memory that the file's bits never fill."""
    backend = backends.get(header["backend"])
    for index, member in enumerate(header["members"]):
        if member["filters"] > 1 and backend.kind != "bloom":
            continue  # a grown cuckoo filter's sub-filters are checked against its own header chunk
        sizes = {_predicted_size(backend, member, rate) for rate in _error_rates(backend, header, member)}
        if member["size_bytes"] not in sizes:
            raise DumpCorrupt(
                "the dump's header declares %s bytes for %s, where its capacity %s and error rate %s give %s: "
                "the header is inconsistent",
                f"{member['size_bytes']:,}",
                f"member {index}" if header["shards"] else "the filter",
                f"{member['capacity']:,}",
                header["error_rate"],
                " or ".join(sorted({f"{size:,}" for size in sizes if size is not None})) or "no filter",
            )


def _error_rates(backend: Backend, header: dict[str, Any], member: dict[str, Any]) -> list[float]:
    """The rates a member may have been reserved with: the dump's, and the one its first
    sub-filter's rate says (Redis 8 caps a rate above 0.25, which the recipe may still name)."""
    rates = [float(header["error_rate"])]
    first = member.get("error_rates")
    if isinstance(first, list) and first and isinstance(first[0], float) and 0 < first[0] < 1:
        rates.append(backend.reserved_error_rate(member))
    return rates


def _predicted_size(backend: Backend, member: dict[str, Any], error_rate: float) -> int | None:
    """What ``info`` reports for a filter of ``member``'s parameters and sub-filters; None where
    they give no filter (an error rate out of range, more sub-filters than a chain can have)."""
    try:
        plan = backend.restore_plan(member, error_rate, member["expansion"])
    except (UsageError, ValueError, OverflowError):
        return None
    if member["filters"] == 1:
        return backend.size_bytes(plan)
    if not isinstance(plan, Plan) or plan.expansion is None:
        return None
    # Only RedisBloom's Bloom filters grow, as sizing.bloom models: each new sub-filter has
    # `expansion` times the capacity and half the error rate of the last. A sub-filter has more
    # bits than items (its error rate is at most 0.5), so the chain stops past the declared size.
    chain = [plan.first]
    while len(chain) < member["filters"]:
        last = chain[-1]
        rate = last.error_rate * ERROR_TIGHTENING_RATIO
        if rate <= 0 or last.capacity * plan.expansion > member["size_bytes"] * 8:
            return None
        chain.append(SubFilter.sized(len(chain), last.capacity * plan.expansion, rate))
    return memory_bytes(chain)


def check_target(client: RedisClient, server: ServerInfo, key: bytes, header: dict[str, Any]) -> Backend:
    """Whether ``server`` can hold the dump as the filter ``key``: the backend's commands, and an
    existing filter of the same backend and sharding."""
    backend = backends.get(header["backend"])
    source = header.get("source", {}).get("server", "another server")
    command = backend.load_command
    if command is not None and command.lower() not in server.commands:
        raise UnsupportedServer(
            "%s cannot load a RedisBloom dump (no %s): restore it on a server with RedisBloom or Redis 8, "
            "or rebuild the filter here from the source with `--backend module-free`",
            server.description,
            command,
        )
    manifest = read_manifest(client, key)
    if manifest is not None:
        active_backend, shards = backends.get(manifest.backend), manifest.shards
    elif backends.key_type(client, key) != b"none":
        active_backend, shards = backends.for_key(client, key, "active filter"), None
    else:
        return backend
    if active_backend is not backend:
        raise StateConflict(
            "the dump (from %s) holds a %s filter and %r is a %s filter: %s bits cannot become a %s filter "
            "(applications read them with other commands); rebuild from the source instead",
            source,
            backend.name,
            to_display(key),
            active_backend.name,
            backend.name,
            active_backend.name,
        )
    if shards != header["shards"]:
        raise StateConflict(
            "the dump holds %s and %r is %s: restore it under another name (the KEY of restore, --to-key of copy), "
            "or rebuild from the source",
            f"a filter of {header['shards']} shards" if header["shards"] else "one filter",
            to_display(key),
            f"sharded over {shards}" if shards else "one filter",
        )
    return backend
