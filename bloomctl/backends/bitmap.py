"""The bitmap backend: a Bloom filter in one plain Redis string, hashed by server-side Lua.

For servers without RedisBloom (Redis OSS, managed services that refuse modules). The filter
is a 64-byte header followed by the bit array (layout in ``bitmap.lua`` and the README), so one
RENAME moves everything. Hashing runs on the server, in a Redis Functions library (Redis 7+)
or, on older servers, the same Lua code through EVALSHA: any client in any language that can
send FCALL gets the same answers.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct
import weakref
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import replace
from importlib import resources
from typing import Any

from bloomctl.backends.base import Backend, FilterState, SubFilterState
from bloomctl.client import RedisClient
from bloomctl.defaults import BITMAP_BATCH_SIZE
from bloomctl.errors import KeyMissing, StateConflict, UnsupportedServer, UsageError, WrongType
from bloomctl.keys import to_display
from bloomctl.planner import Plan
from bloomctl.topology import node_name, primaries

LIBRARY_NAME = "bloomctl"
_INSTALLS_NOTHING: ContextVar[bool] = ContextVar("bloomctl_installs_nothing", default=False)


@contextlib.contextmanager
def installs_nothing() -> Iterator[None]:
    """Within: a missing function library is not loaded (FUNCTION LOAD writes to the server and
    its replicas); the same code runs from the script cache instead. For dry runs."""
    token = _INSTALLS_NOTHING.set(True)
    try:
        yield
    finally:
        _INSTALLS_NOTHING.reset(token)


LIBRARY_VERSION = 2  # 2: bloomctl_add/exists pass errors on instead of answering nil
FORMAT_VERSION = 1
MAGIC = b"bloomctl"
HEADER_BYTES = 64
HEADER = struct.Struct(">8sBBHIQQdq")  # magic, format, scheme, 0, k, m, capacity, error rate, items
MAX_STRING_BYTES = 512 * 1024 * 1024
LARGE_RESERVE = 16 << 20  # a filter above this is sent whole rather than zeroed by the server
MAX_BITS = (MAX_STRING_BYTES - HEADER_BYTES) * 8

FUNCTIONS, SCRIPT = "functions", "script"
HANDLERS = {  # the operations of bitmap.lua, and whether each only reads
    "reserve": False,
    "add": False,
    "madd": False,
    "exists": True,
    "mexists": True,
    "info": True,
    "card": True,
    "bitcount": True,
    "version": True,
}


def library_source() -> str:
    return resources.files("bloomctl.backends").joinpath("bitmap.lua").read_text(encoding="utf-8")


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


def positions(item: bytes | str, bits: int, hashes: int) -> list[int]:
    """The bit positions of ``item``: the reference for the Lua code and for other languages."""
    data = item.encode() if isinstance(item, str) else item
    digest = hashlib.sha1(data).hexdigest()
    h1, h2 = int(digest[:12], 16), int(digest[12:24], 16)
    pos, step = h1 % bits, h2 % bits or 1
    out = []
    for _ in range(hashes):
        out.append(pos)
        pos = (pos + step) % bits
    return out


def parse_header(blob: bytes) -> dict[str, Any] | None:
    if len(blob) < HEADER_BYTES or not blob.startswith(MAGIC):
        return None
    _magic, fmt, scheme, _pad, k, m, capacity, error_rate, items = HEADER.unpack_from(blob)
    return {
        "format": fmt,
        "scheme": scheme,
        "hashes": k,
        "bits": m,
        "capacity": capacity,
        "error_rate": error_rate,
        "items": items,
    }


def recognise(head: bytes, length: int) -> bool:
    """Whether a string's first 64 bytes and length are those of a bitmap filter (of any format)."""
    header = parse_header(head)
    return (
        header is not None
        and header["hashes"] > 0
        and header["bits"] > 0
        and header["bits"] % 64 == 0
        and length == HEADER_BYTES + header["bits"] // 8
    )


def _library_state(version: int | None) -> str:
    if version is None:
        return "missing"
    return "current" if version == LIBRARY_VERSION else "outdated" if version < LIBRARY_VERSION else "newer"


def _error(exc: Exception, key: bytes) -> Exception:
    text = str(exc)
    name = to_display(key)
    if "not found" in text and "unction" not in text:
        return KeyMissing("no filter at key %r", name)
    if text.startswith("WRONGTYPE") or "WRONGTYPE" in text:
        return WrongType("key %r is not a bloomctl bitmap filter", name)
    if "item exists" in text:
        return StateConflict("key %r already exists", name)
    if "exceeds the 512 MB" in text:
        return UsageError(text.removeprefix("ERR "))
    if "filter format" in text:
        return UnsupportedServer("key %r: %s (a newer bloomctl wrote it)", name, text.removeprefix("ERR "))
    return exc


class Bitmap(Backend):
    name = "bitmap"
    redis_type = b"string"
    magic = MAGIC
    grows = False
    batch_size = BITMAP_BATCH_SIZE

    def __init__(self, mode: str | None = None) -> None:
        """``mode`` forces ``functions`` or ``script``; by default the server decides."""
        self.forced_mode = mode
        self._modes: weakref.WeakKeyDictionary[Any, tuple[str, str | None]] = weakref.WeakKeyDictionary()

    # --- the library on the server ---------------------------------------------------------

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

    def command(self, client: RedisClient, op: str, key: bytes, *args: Any, read_only: bool = False) -> tuple[Any, ...]:
        """The command (ready for execute_command, a pipeline or hiredis.pack_command) that runs ``op`` on ``key``."""
        mode, sha = self.ensure(client)
        if mode == FUNCTIONS:
            return ("FCALL_RO" if read_only else "FCALL", f"bloomctl_{op}", 1, key, *args)
        return ("EVALSHA", sha, 1, key, op, *args)

    def call(self, client: RedisClient, op: str, key: bytes, *args: Any, read_only: bool = False) -> Any:
        import redis

        try:
            return client.execute_command(*self.command(client, op, key, *args, read_only=read_only))
        except redis.exceptions.NoScriptError:
            self._modes.pop(client, None)  # the script cache was flushed: load again, once
            return client.execute_command(*self.command(client, op, key, *args, read_only=read_only))
        except redis.exceptions.ResponseError as exc:
            raise _error(exc, key) from None

    # --- the Backend interface -------------------------------------------------------------

    def check_plan(self, plan: Plan, line: str | None = None) -> Plan:
        if plan.scaling:
            raise UsageError("bitmap filters do not grow: use `nonscaling` (or leave `expansion` out)")
        if plan.first.bits > MAX_BITS:
            raise UsageError(
                "%s bytes of bits exceed Redis's 512 MB string limit: lower `capacity` or raise `error_rate`, or split the set over several filters (shards)",
                f"{plan.first.bytes:,}",
            )
        return plan

    def reserve(self, client: RedisClient, key: bytes, plan: Plan) -> None:
        """Create the empty filter. A large one arrives whole from the client (SET ... NX): the
        server reads a big value in the background and stores it without copying, where zeroing
        it would block (91 ms for 228 MB, measured); the function library makes small ones."""
        self.check_plan(plan)
        if HEADER_BYTES + plan.first.bytes <= LARGE_RESERVE:
            self.call(client, "reserve", key, plan.first.bits, plan.first.hashes, plan.capacity, repr(plan.error_rate))
            return
        head = HEADER.pack(
            MAGIC, FORMAT_VERSION, 1, 0, plan.first.hashes, plan.first.bits, plan.capacity, plan.error_rate, 0
        )
        value = head.ljust(HEADER_BYTES, b"\0") + bytes(plan.first.bytes)
        if not client.set(key, value, nx=True):
            raise StateConflict("key %r already exists", to_display(key))

    def size_bytes(self, plan: Plan) -> int:
        return HEADER_BYTES + plan.first.bytes

    def owns(self, client: RedisClient, key: bytes, kind: bytes) -> bool:
        return kind == self.redis_type and bool(self.select(client, [key]))

    def select(self, node: Any, keys: list[bytes]) -> list[bytes]:
        """Strings whose header is bloomctl's and whose length matches the bit count it declares:
        a note that merely starts with the word "bloomctl" is not taken for a filter."""
        if not keys:
            return []
        pipe = node.pipeline(transaction=False)
        for key in keys:
            pipe.getrange(key, 0, HEADER_BYTES - 1)
            pipe.strlen(key)
        replies = pipe.execute()
        return [
            key for key, head, length in zip(keys, replies[::2], replies[1::2], strict=True) if recognise(head, length)
        ]

    def info(self, client: RedisClient, key: bytes, *, with_header: bool = True) -> FilterState:
        raw = self.call(client, "info", key, read_only=True)
        fields = {(raw[i].decode() if isinstance(raw[i], bytes) else raw[i]): raw[i + 1] for i in range(0, len(raw), 2)}
        capacity, items = int(fields["Capacity"]), int(fields["Number of items inserted"])
        bits = int(fields["Bits"])
        error_rate = float(fields["Error rate"])
        sub = SubFilterState(0, capacity, items, error_rate, int(fields["Hashes"]), bits, bits // 8)
        return FilterState(self.name, capacity, int(fields["Size"]), 1, items, None, (sub,))

    def bit_fill(self, client: RedisClient, key: bytes) -> FilterState:
        state = self.info(client, key)
        bits_set = int(self.call(client, "bitcount", key, read_only=True))
        return replace(state, subfilters=(replace(state.subfilters[0], bits_set=bits_set),))

    def card(self, client: RedisClient, key: bytes) -> int:
        return int(self.call(client, "card", key, read_only=True))

    def madd_command(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> tuple[Any, ...]:
        return self.command(client, "madd", key, *items)

    def mexists_command(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> tuple[Any, ...]:
        return self.command(client, "mexists", key, *items, read_only=True)

    def madd(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        if not items:
            return []
        return self.parse_flags(self.call(client, "madd", key, *items))

    def mexists(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        if not items:
            return []
        return self.parse_flags(self.call(client, "mexists", key, *items, read_only=True))
