"""The ``bloomctl`` function library: the server-side Lua of the module-free backends.

One library, loaded with FUNCTION LOAD on Redis 7+ (and Valkey), or run through EVALSHA on older
servers, holds every operation: the bitmap Bloom filter (``bitmap.lua``), the cuckoo filter
(``cuckoo.lua``), dual writes to a cuckoo filter during a rebuild (``dual.lua``) and time-windowed
filters (``window.lua``). Any client in any language that sends FCALL gets the same answers.
``LuaBackend`` is what a backend built on it shares: finding the mode, installing the library,
and sending an operation.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from importlib import resources
from typing import Any

from bloomctl.backends.base import Backend
from bloomctl.errors import UnsupportedServer
from bloomctl.server.client import RedisClient
from bloomctl.server.topology import node_name, primaries

LIBRARY_NAME = "bloomctl"
# 2: bloomctl_add/exists pass errors on instead of answering nil; 3: cuckoo filters, dual writes to
# them, time-windowed filters; 4: a cuckoo dual write is logged from the moment the rebuild marks its
# standby, before the standby exists (version 3 lost a write made between the two)
LIBRARY_VERSION = 4
PARTS = ("bitmap.lua", "cuckoo.lua", "dual.lua", "window.lua")
FUNCTIONS, SCRIPT = "functions", "script"
HANDLERS = {  # every operation of the library, and whether it only reads
    "reserve": False,
    "add": False,
    "madd": False,
    "exists": True,
    "mexists": True,
    "info": True,
    "card": True,
    "bitcount": True,
    "version": True,
    "cf_reserve": False,
    "cf_add": False,
    "cf_addnx": False,
    "cf_madd": False,
    "cf_maddnx": False,
    "cf_exists": True,
    "cf_mexists": True,
    "cf_count": True,
    "cf_del": False,
    "cf_mdel": False,
    "cf_info": True,
    "cf_dual": False,
    "cf_replay": False,
    "window_add": False,
    "window_exists": True,
    "window_bucket": True,
}
_INSTALLS_NOTHING: ContextVar[bool] = ContextVar("bloomctl_installs_nothing", default=False)


@contextlib.contextmanager
def installs_nothing() -> Iterator[None]:
    """Within: a missing function library is not loaded (FUNCTION LOAD writes to the server and
    its replicas); the same code runs from the script cache instead. For dry runs and reads."""
    token = _INSTALLS_NOTHING.set(True)
    try:
        yield
    finally:
        _INSTALLS_NOTHING.reset(token)


def library_source() -> str:
    """The library's code without its registrations: a prelude, then each part in a block of its own."""
    folder = resources.files("bloomctl.backends")
    parts = [folder.joinpath(name).read_text(encoding="utf-8") for name in PARTS]
    prelude = f"#!lua name={LIBRARY_NAME}\nlocal LIB_VERSION = {LIBRARY_VERSION}\nlocal HANDLERS = {{}}\n"
    return prelude + "\n".join(parts)


def functions_source() -> str:
    # One explicit call per function: the loading context of Redis 7.0 has no `pairs`.
    lines = [library_source()]
    for op, read_only in HANDLERS.items():
        flags = "{'no-writes'}" if read_only else "{}"
        lines.append(
            f"redis.register_function{{function_name = 'bloomctl_{op}', callback = HANDLERS.{op}[1], flags = {flags}}}"
        )
    return "\n".join(lines) + "\n"


def script_source() -> str:
    body = library_source().split("\n", 1)[1]  # EVAL rejects the `#!lua name=` shebang
    return body + "\nlocal op = table.remove(ARGV, 1)\nreturn HANDLERS[op][1](KEYS, ARGV)\n"


def _library_state(version: int | None) -> str:
    if version is None:
        return "missing"
    return "current" if version == LIBRARY_VERSION else "outdated" if version < LIBRARY_VERSION else "newer"


class Library:
    """The library on one server (standalone or Cluster): its mode (Functions, or EVALSHA where the
    server has none; ``mode`` forces one), installing it, and the command that runs an operation."""

    def __init__(self, mode: str | None = None) -> None:
        self.forced_mode = mode
        self._modes: weakref.WeakKeyDictionary[Any, tuple[str, str | None]] = weakref.WeakKeyDictionary()

    def detect_mode(self, client: RedisClient) -> str:
        """Functions on Redis 7+ (FUNCTION exists), else EVALSHA."""
        if self.forced_mode:
            return self.forced_mode
        node = primaries(client)[0]
        try:
            node.execute_command("FUNCTION LIST", "LIBRARYNAME", "__bloomctl_probe__")
        except Exception as exc:  # unknown command on Redis < 7 and on servers without Functions
            if "unknown" in str(exc).lower():
                return SCRIPT
            raise
        return FUNCTIONS

    def installed_versions(self, client: RedisClient) -> dict[str, int | None]:
        """The library version on every primary (None: not installed)."""
        found: dict[str, int | None] = {}
        for node in primaries(client):
            try:
                found[node_name(node)] = int(node.execute_command("FCALL_RO", "bloomctl_version", 0))
            except Exception as exc:
                if "not found" not in str(exc).lower():
                    raise
                found[node_name(node)] = None
        return found

    def install(self, client: RedisClient, *, force: bool = False) -> str:
        """Load the library (Functions, REPLACE) or the script (EVALSHA) on every primary; idempotent.

        A newer library (from a newer bloomctl) is never downgraded unless ``force``.
        """
        mode = self.detect_mode(client)
        if mode == FUNCTIONS and not force:
            newer = {node: v for node, v in self.installed_versions(client).items() if v and v > LIBRARY_VERSION}
            if newer:
                raise UnsupportedServer(
                    "a newer bloomctl installed library version %s on %s: upgrade bloomctl (this one has version %s), or pass `force` to downgrade",
                    max(newer.values()),
                    ", ".join(newer),
                    LIBRARY_VERSION,
                )
        sha = None
        for node in primaries(client):
            if mode == FUNCTIONS:
                node.execute_command("FUNCTION LOAD", "REPLACE", functions_source())
            else:
                sha = node.script_load(script_source())
        self._modes[client] = (mode, sha)
        return mode

    def library_status(self, client: RedisClient) -> dict[str, Any]:
        """The library on every primary: its version and ``current``, ``outdated``, ``newer`` or ``missing``."""
        mode = self.detect_mode(client)
        versions = self.installed_versions(client) if mode == FUNCTIONS else {}
        states = {node: _library_state(version) for node, version in versions.items()}
        return {
            "mode": mode,
            "library": LIBRARY_NAME,
            "expected_version": LIBRARY_VERSION,
            "nodes": [{"node": node, "version": versions[node], "state": state} for node, state in states.items()],
            "ok": all(state == "current" for state in states.values()),
        }

    def ensure(self, client: RedisClient) -> tuple[str, str | None]:
        """Make sure the current library is callable; install it when absent, refuse an outdated one."""
        cached = self._modes.get(client)
        if cached:
            return cached
        mode = self.detect_mode(client)
        if mode == SCRIPT:
            self.install(client)
            return self._modes[client]
        versions = self.installed_versions(client)
        newer = {node: v for node, v in versions.items() if v is not None and v > LIBRARY_VERSION}
        if newer:
            raise UnsupportedServer(
                "the server has the bloomctl function library version %s, newer than this bloomctl's %s: upgrade bloomctl",
                max(newer.values()),
                LIBRARY_VERSION,
            )
        outdated = {node: v for node, v in versions.items() if v is not None and v < LIBRARY_VERSION}
        if outdated:
            detail = ", ".join(f"{node} has version {v}" for node, v in outdated.items())
            raise UnsupportedServer(
                "the bloomctl function library on the server is outdated (%s, this bloomctl needs %s): run `bloomctl functions install`",
                detail,
                LIBRARY_VERSION,
            )
        if any(v is None for v in versions.values()):
            if _INSTALLS_NOTHING.get():  # a dry run: the same code through the script cache, no FUNCTION LOAD
                sha = None
                for node in primaries(client):
                    sha = node.script_load(script_source())
                return (SCRIPT, sha)
            self.install(client)
        self._modes[client] = (FUNCTIONS, None)
        return self._modes[client]

    def command_keys(
        self, client: RedisClient, op: str, keys: list[bytes], *args: Any, read_only: bool = False
    ) -> tuple[Any, ...]:
        """The command (ready for execute_command, a pipeline or hiredis.pack_command) that runs ``op``
        on ``keys`` (all of one slot)."""
        mode, sha = self.ensure(client)
        if mode == FUNCTIONS:
            return ("FCALL_RO" if read_only else "FCALL", f"bloomctl_{op}", len(keys), *keys, *args)
        return ("EVALSHA", sha, len(keys), *keys, op, *args)

    def call_keys(self, client: RedisClient, op: str, keys: list[bytes], *args: Any, read_only: bool = False) -> Any:
        """Run ``op``; redis-py's ResponseError comes through as it is."""
        import redis

        try:
            return client.execute_command(*self.command_keys(client, op, keys, *args, read_only=read_only))
        except redis.exceptions.NoScriptError:
            self._modes.pop(client, None)  # the script cache was flushed: load again, once
            return client.execute_command(*self.command_keys(client, op, keys, *args, read_only=read_only))


class LuaBackend(Backend):
    """A backend whose operations are the library's; ``translate_error`` turns a server error into
    the library's typed one."""

    translate_error: Callable[[Exception, bytes], Exception] = staticmethod(lambda exc, key: exc)

    def __init__(self, mode: str | None = None) -> None:
        self.library = Library(mode)

    @property
    def forced_mode(self) -> str | None:
        return self.library.forced_mode

    def detect_mode(self, client: RedisClient) -> str:
        return self.library.detect_mode(client)

    def installed_versions(self, client: RedisClient) -> dict[str, int | None]:
        return self.library.installed_versions(client)

    def install(self, client: RedisClient, *, force: bool = False) -> str:
        return self.library.install(client, force=force)

    def library_status(self, client: RedisClient) -> dict[str, Any]:
        return self.library.library_status(client)

    def ensure(self, client: RedisClient) -> tuple[str, str | None]:
        return self.library.ensure(client)

    def command(self, client: RedisClient, op: str, key: bytes, *args: Any, read_only: bool = False) -> tuple[Any, ...]:
        return self.library.command_keys(client, op, [key], *args, read_only=read_only)

    def call(self, client: RedisClient, op: str, key: bytes, *args: Any, read_only: bool = False) -> Any:
        return self.call_keys(client, op, [key], *args, read_only=read_only)

    def call_keys(self, client: RedisClient, op: str, keys: list[bytes], *args: Any, read_only: bool = False) -> Any:
        import redis

        try:
            return self.library.call_keys(client, op, keys, *args, read_only=read_only)
        except redis.exceptions.ResponseError as exc:
            raise type(self).translate_error(exc, keys[0]) from None
