"""Making a window: its settings written once, refused over another window's or a leftover bucket's names."""

from __future__ import annotations

import contextlib
from dataclasses import replace

from bloomctl import __version__, backends
from bloomctl.errors import StateConflict
from bloomctl.keys import KeyFamily, to_display
from bloomctl.lifecycle.metadata import create_hash, now_utc
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.window.buckets import holds, other_parameters
from bloomctl.window.periods import server_time
from bloomctl.window.settings import WindowSpec, read_window


def aliases(name: bytes) -> list[bytes]:
    """Other names whose companions (the buckets) are this name's: ``X`` and ``{X}``, and the
    hex-tagged form of a name with a ``}`` in it (bloomctl.keys)."""
    prefix = KeyFamily.of(name).prefix
    candidates = {prefix}
    if name.startswith(b"{") and b"}" in name:
        close = name.index(b"}")
        candidates |= {name[1:close], name[close + 1 :]}
    return [c for c in candidates if c and c != name and KeyFamily.of(c).prefix == prefix]


def create(
    client: RedisClient, server: ServerInfo, spec: WindowSpec, *, if_not_exists: bool = False, dry_run: bool = False
) -> bool:
    """Write the window's settings (refused where the key exists, unless ``if_not_exists`` and the
    same window is there); True when created. ``rotate`` makes its buckets. ``dry_run``: every
    check, nothing written (True: it would be created)."""
    from bloomctl.backends.library import installs_nothing

    with installs_nothing() if dry_run else contextlib.nullcontext():
        for other in aliases(spec.name):  # `X` and `{X}` would share their buckets' names
            if backends.key_type(client, other) == b"hash" and client.hget(other, "bloomctl_window"):
                raise StateConflict(
                    "window %r exists, and its buckets' names (%r) are those %r would have: choose another name",
                    to_display(other),
                    to_display(spec.prefix) + ":...",
                    to_display(spec.name),
                )
        _refuse_leftovers(client, server, spec)
        if dry_run:
            return backends.key_type(client, spec.name) == b"none" or _exists(client, spec, if_not_exists)
        fields = replace(spec, created_at=now_utc(), created_by=f"bloomctl {__version__}").as_hash()
        return create_hash(client, spec.name, fields) or _exists(client, spec, if_not_exists)


def _exists(client: RedisClient, spec: WindowSpec, if_not_exists: bool) -> bool:
    """Where the window's key is taken: False when it is this same window and ``if_not_exists``
    allows that; StateConflict otherwise."""
    if backends.key_type(client, spec.name) == b"hash" and client.hget(spec.name, "bloomctl_window"):
        existing = read_window(client, spec.name)
        same = replace(existing, created_at="", created_by="") == replace(spec, created_at="", created_by="")
        if if_not_exists and same:
            return False
        raise StateConflict("window %r already exists%s", to_display(spec.name), "" if same else " with other settings")
    raise StateConflict("%r already exists and is not a window", to_display(spec.name))


def _refuse_leftovers(client: RedisClient, server: ServerInfo, spec: WindowSpec) -> None:
    """Buckets at the names the new window would add to (the current one and those ahead), left
    by an earlier window of the same name with other parameters, would take its adds: refused,
    before anything is written (buckets made as this window would make them are kept)."""
    if backends.key_type(client, spec.name) != b"none":
        return  # the window exists, and create says so
    backend = backends.get(spec.backend)
    current = spec.index(server_time(client, spec.name))
    for index in range(current, current + spec.ahead + 1):
        key = spec.key(index)
        if backends.key_type(client, key) == b"none" or not holds(client, key, backend):
            continue
        other = other_parameters(client, spec, backend, key, server.line)
        if other:
            raise StateConflict(
                "the bucket %r is left from an earlier window %r with other parameters (%s): new adds would go "
                "to it; remove it (UNLINK, its items are lost) or create the window with its parameters",
                to_display(key),
                to_display(spec.name),
                other,
            )
