"""Rebuild step 3, first half: where the filter's bits are computed, the client or the server.

``auto`` builds in the client wherever that is known to give the server's own filter: numpy is
installed, the server can load and dump chunks (RedisBloom), the bits fit ``client_memory``, a
scaling filter's source can be read again should it outgrow one link, and the compatibility
probe (``bloomctl.rebuild.build.probe``) finds the client's bits equal to the server's. Otherwise the
server path, and the reason, which the log states. ``client`` turns each reason into an error;
numpy missing, the error that names the extra to install.
"""

from __future__ import annotations

from dataclasses import dataclass

from bloomctl import extras
from bloomctl.backends import Backend
from bloomctl.defaults import AUTO
from bloomctl.errors import UnsupportedServer
from bloomctl.lifecycle.standby import Targets
from bloomctl.rebuild.settings import LoadSettings
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.sources import Source


@dataclass(frozen=True)
class Path:
    where: str  # "client" or "server"
    reason: str | None = None  # why the server, when the client was possible in principle


def _server(reason: str, settings: LoadSettings) -> Path:
    if settings.engine is not None:
        raise UnsupportedServer("cannot build with the engine: %s (rebuild without `engine`)", reason)
    if settings.build == "client":
        raise UnsupportedServer("cannot build in the client: %s (use `build` server)", reason)
    return Path("server", reason)


def choose(
    client: RedisClient,
    server: ServerInfo,
    backend: Backend,
    source: Source,
    targets: Targets,
    settings: LoadSettings,
    force: bool = False,
) -> Path:
    """Where to build; reads the standbys' layouts and runs the probe (the standbys exist).
    ``force`` skips the check of the server's room for the upload's second copy."""
    if settings.build == "server":
        return Path("server")
    if not backend.client_buildable:  # where each item lands depends on the others: only the server knows
        return _server("cuckoo filters are built on the server", settings)
    missing = extras.missing(extras.CLIENT_BUILD)
    if missing is not None:
        if settings.engine is not None or settings.build == "client":
            raise missing
        return Path("server", str(missing))  # auto: the server builds it all the same
    from bloomctl.rebuild.build.client import scheme_for

    needed = scheme_for(backend.name).SERVER_COMMANDS
    if not all(name in server.commands for name in needed):
        return _server(f"{server.description} lacks {'/'.join(name.upper() for name in needed)}", settings)
    reason = _unsuitable(client, backend, source, targets, settings, force)
    if reason is not None:
        return _server(reason, settings)
    return Path("client")


def _unsuitable(
    client: RedisClient, backend: Backend, source: Source, targets: Targets, settings: LoadSettings, force: bool
) -> str | None:
    from bloomctl.rebuild.build import client as client_build
    from bloomctl.rebuild.build import probe

    scheme = client_build.scheme_for(backend.name)
    try:
        layouts = [scheme.read_layout(client, family.standby) for family in targets.families]
    except (scheme.Unsuitable, ValueError) as exc:
        return str(exc)
    needed = client_build.memory_needed(
        [layout.nbytes for layout in layouts], settings.jobs, engine=settings.engine is not None
    )
    if needed > settings.client_memory:
        return (
            f"the build needs {needed:,} bytes of memory, more than the client memory limit {settings.client_memory:,}"
        )
    if scheme.UPLOADS_A_COPY and not force:
        room = _server_room(client, targets, [layout.nbytes for layout in layouts])
        if room is not None:
            return room
    plan = backend.bloom_plan(targets.plan)
    if plan.scaling and not source.rewindable:
        return "a scaling filter fed from a source read once could outgrow one sub-filter"
    mismatch = probe.check(client, backend, targets.families[0], plan.error_rate, plan.expansion)
    if mismatch is not None:
        return f"the compatibility probe found this server's filter different ({mismatch})"
    return None


def _server_room(client: RedisClient, targets: Targets, sizes: list[int]) -> str | None:
    """The upload holds a second copy of each filter on its node until the cutover (and would
    make an evicting server drop other keys, the active filter among them): is there room?"""
    from bloomctl.errors import StateConflict
    from bloomctl.server.memory import check_memory

    try:
        check_memory(
            client, [(family.companion("build"), size) for family, size in zip(targets.families, sizes, strict=True)]
        )
    except StateConflict:
        return f"the server has no room for the upload's second copy of the filter ({sum(sizes):,} bytes)"
    return None


def describe(path: Path) -> str:
    if path.where == "client":
        from bloomctl import native as kernel

        return f"building in the client, {kernel.name()} kernel (the compatibility probe matched this server)"
    return "building on the server" + (f": {path.reason}" if path.reason else "")


__all__ = ["AUTO", "Path", "choose", "describe"]
