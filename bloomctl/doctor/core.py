"""Doctor: is this server fit to keep Bloom filters, and may this user run bloomctl on it?

``diagnose`` runs every check and returns a ``Report``: a list of ``Finding`` (a check's id, a level
``ok``, ``info``, ``warning`` or ``error``, a message, the numbers behind it and how to fix it), what
the connected user may run, and two ready ``ACL SETUSER`` lines. Each check degrades on its own:
a command the user may not run (NOPERM) makes that check a warning naming the missing
permission, never a failure of the whole report. docs/doctor.md explains every check.

``COMMANDS`` is the one table of the Redis commands each bloomctl command issues, those inside
bloomctl's Lua scripts and functions included (Redis checks their ACL too); a test runs the
lifecycle through MONITOR and fails when bloomctl sends a command the table does not list.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bloomctl.keys import KeyFamily, glob_escape, to_bytes, to_display
from bloomctl.server.capabilities import ServerInfo, _text
from bloomctl.server.client import RedisClient
from bloomctl.server.topology import default_node, is_cluster, node_client, node_name, primaries

OK, INFO, WARNING, ERROR = "ok", "info", "warning", "error"
LEVELS = (OK, INFO, WARNING, ERROR)

SCAN_CALLS = 10  # SCAN calls (COUNT 1000) per primary and key type when no KEY is given
SAMPLE_KEY = "users"  # the filter name the ACL check uses when no KEY is given and none is found
OPERATOR_USER, APP_USER = "bloomctl-operator", "bloomctl-app"
PASSWORD_PLACEHOLDER = "CHANGE_ME"
PASSWORD_NOTE = (
    f"replace {PASSWORD_PLACEHOLDER} with the user's password (or '>{PASSWORD_PLACEHOLDER}' with "
    "'#<sha256 hex of it>') before running a line; give bloomctl the operator's password in "
    "BLOOMCTL_PASSWORD or --password-file, the application its own in its configuration"
)

# --- what each bloomctl command sends ------------------------------------------------------------
# One sample call per Redis command (and per key it touches), as ACL DRYRUN takes it. The words
# {key}, {standby}, {old}, {lock}, {meta}, {standby_meta}, {old_meta}, {build}, {probe}, {restore} and
# {restore_meta} stand for
# the filter's key family (bloomctl/keys.py). A prefix says when the call is made:
#   bf:      the RedisBloom backend (the server has BF.*)
#   cf:      RedisBloom's cuckoo filters (CF.*) are in use
#   bitmap:  a module-free backend (bitmap, or the cuckoo filter), either way it runs its Lua
#   fn:      the module-free backends through Redis Functions (Redis 7+, Valkey)
#   script:  the module-free backends through EVALSHA (servers without Functions)
#   cluster: a Redis Cluster (redis-py's own discovery)
# Calls marked "(lua)" are made by bloomctl's Lua (scripts and the function library).

_SHA = "0" * 40
CONNECT = (
    "INFO server",  # detect (and INFO cluster at connect, INFO memory in the memory guard)
    "COMMAND INFO bf.reserve",  # detect: which BF.* commands exist
    "MODULE LIST",  # detect: the RedisBloom version (it decides the server line)
    "PING",
    "cluster:COMMAND",
    "cluster:CLUSTER SLOTS",
)
FUNCTION_LIBRARY = (
    "fn:FUNCTION LIST LIBRARYNAME bloomctl",
    "fn:FCALL_RO bloomctl_version 0",
    f"script:EVALSHA {_SHA} 1 {{key}} info",
    "script:SCRIPT LOAD return",
)
READ = (
    *CONNECT,
    "TYPE {key}",
    "HGETALL {key}",  # a sharded filter's manifest
    "EXISTS {standby}",
    "PTTL {key}",
    "HGETALL {meta}",
    "HGET {meta} created_by",
    "bf:BF.INFO {key}",
    "bf:BF.SCANDUMP {key} 0",
    "bf:BF.CARD {key}",
    *FUNCTION_LIBRARY,
    "bitmap:GETRANGE {key} 0 63",  # also (lua)
    "bitmap:STRLEN {key}",  # also (lua)
    "fn:FCALL_RO bloomctl_info 1 {key}",
    "bitmap:BITCOUNT {key} 64 -1",  # (lua) info --exact
    "cf:CF.INFO {key}",
    "cf:CF.SCANDUMP {key} 0",  # info --exact
    "fn:FCALL_RO bloomctl_cf_info 1 {key}",
)
LOCK = (
    "SET {lock} v NX PX 30000",
    "GET {lock}",  # also (lua)
    "PTTL {lock}",
    "TYPE {lock}",
    "EXISTS {lock}",  # (lua) the scripting probe
    f"EVALSHA {_SHA} 1 {{lock}} token 30000",  # renew, release, and every script below
    "SCRIPT LOAD return",
    "PEXPIRE {lock} 30000",  # (lua)
    "DEL {lock}",  # (lua)
)
CUTOVER = (
    "TYPE {standby}",  # also (lua)
    "GETRANGE {standby} 0 7",  # (lua) the bitmap standby's magic
    "HGETALL {standby_meta}",
    "HGET {standby_meta} generation",
    "TYPE {standby_meta}",
    "TYPE {old_meta}",
    "EXISTS {old}",  # (lua)
    "RENAME {key} {old}",  # (lua)
    "RENAME {standby} {key}",  # (lua)
    "RENAME {meta} {old_meta}",  # (lua)
    "RENAME {standby_meta} {meta}",  # (lua)
    "PERSIST {key}",  # (lua)
    "PEXPIRE {old} 3600000",  # (lua) --keep-old
    "UNLINK {old} {old_meta}",  # (lua)
    "HMGET {standby_meta} state dual dual_error",  # (lua) the standby's marks, checked by the script itself
    "bf:BF.CARD {standby}",
    "bf:BF.INFO {standby}",
    "bitmap:GETRANGE {standby} 0 63",
    "bitmap:STRLEN {standby}",
    "fn:FCALL_RO bloomctl_info 1 {standby}",
    "fn:FCALL_RO bloomctl_card 1 {standby}",
    "cf:CF.INFO {standby}",
    "fn:FCALL_RO bloomctl_cf_info 1 {standby}",
)
RESERVE = (
    *READ,
    "TYPE {meta}",
    "DEL {meta}",
    "HSET {meta} created_by v",
    "UNLINK {key} {meta}",  # a sharded reserve that failed half-way
    f"EVALSHA {_SHA} 1 {{key}} bloomctl v",  # a sharded filter's manifest, written in one step
    "SCRIPT LOAD return",
    "EXISTS {key}",  # (lua)
    "HSET {key} bloomctl v",  # (lua) the manifest
    "bf:BF.RESERVE {key} 0.01 1000 NONSCALING",
    "fn:FUNCTION LOAD REPLACE x",  # the first bitmap command loads a missing library
    "fn:FCALL bloomctl_reserve 1 {key} 64 1 1 0.01",
    "bitmap:SET {key} v NX",  # also (lua); a large bitmap filter arrives whole
    "bitmap:SETRANGE {key} 0 x",  # (lua)
    "cf:CF.RESERVE {key} 1000 BUCKETSIZE 2 MAXITERATIONS 20 EXPANSION 1",
    "fn:FCALL bloomctl_cf_reserve 1 {key} 512 2 2 20 1000 0.01",
)
WRITE_STANDBY = (
    "UNLINK {standby} {standby_meta}",  # also (lua), a left-over standby
    "HSET {standby_meta} state v",  # also (lua), its marks
    "HDEL {standby_meta} build",  # (lua)
    "TYPE {standby}",
    "bf:BF.RESERVE {standby} 0.01 1000 NONSCALING",
    "bf:BF.INSERT {standby} NOCREATE ITEMS x",
    "bf:BF.MEXISTS {standby} x",
    "bf:BF.CARD {standby}",  # also (lua)
    "bf:BF.SCANDUMP {standby} 0",
    "bf:BF.LOADCHUNK {build} 1 x",  # a client-side build's upload
    "PEXPIRE {build} 3600000",
    "UNLINK {build}",  # also (lua)
    "RENAME {build} {standby}",  # (lua)
    "PERSIST {standby}",  # (lua)
    "fn:FCALL bloomctl_reserve 1 {standby} 64 1 1 0.01",
    "fn:FCALL bloomctl_madd 1 {standby} x",
    "fn:FCALL_RO bloomctl_mexists 1 {standby} x",
    "bitmap:SET {standby} v NX",
    "bitmap:BITFIELD {standby} GET u1 0",  # (lua)
    "bitmap:GETBIT {standby} 0",  # (lua)
    "bitmap:SETRANGE {standby} 0 x",  # (lua)
    "bitmap:SET {build} v",  # (lua) a client-side build merges chunk by chunk
    "bitmap:GET {build}",  # (lua)
    "bitmap:BITOP OR {build} {build} {standby}",  # (lua)
    "bitmap:DEL {build}",  # (lua)
    "bf:BF.RESERVE {probe} 0.01 1000 NONSCALING",  # the compatibility probe, a small expiring filter
    "bf:BF.INSERT {probe} NOCREATE ITEMS x",
    "bf:BF.SCANDUMP {probe} 0",
    "bf:BF.CARD {probe}",
    "fn:FCALL bloomctl_reserve 1 {probe} 64 1 1 0.01",
    "fn:FCALL bloomctl_madd 1 {probe} x",
    "bitmap:GETRANGE {probe} 0 63",
    "PEXPIRE {probe} 600000",
    "UNLINK {probe}",
    # a cuckoo filter's rebuild: its load, then the replay of the application's writes (docs/cuckoo.md)
    "TYPE {standby_log}",
    "UNLINK {standby} {standby_meta} {standby_log}",  # also (lua)
    "cf:CF.RESERVE {standby} 1000 BUCKETSIZE 2 MAXITERATIONS 20 EXPANSION 1",
    "cf:CF.INSERT {standby} NOCREATE ITEMS x",  # also (lua)
    "cf:CF.MEXISTS {standby} x",
    "cf:CF.INFO {standby}",
    "cf:CF.DEL {standby} x",  # (lua)
    "fn:FCALL bloomctl_cf_reserve 1 {standby} 512 2 2 20 1000 0.01",
    "fn:FCALL bloomctl_cf_madd 1 {standby} x",
    "fn:FCALL_RO bloomctl_cf_mexists 1 {standby} x",
    "LRANGE {standby_log} 0 999",
    "fn:FCALL bloomctl_cf_replay 4 {standby} {standby_meta} {standby_log} {lock} v t 0",
    f"script:EVALSHA {_SHA} 4 {{standby}} {{standby_meta}} {{standby_log}} {{lock}} cf_replay v t 0",
    "LTRIM {standby_log} 0 -1",  # (lua)
    "LLEN {standby_log}",  # (lua)
    "HSET {standby_meta} dual direct",  # (lua)
)
# dump reads the filter (and, to see that no swap happened meanwhile, its metadata and old key);
# restore loads a scratch key {restore} with its metadata {restore_meta}, then replaces the standby
# and swaps; copy is both.
DUMP = (
    *READ,
    "HMGET {meta} generation created_at",
    "HMGET {old_meta} generation created_at",
    "EXISTS {old}",
    "bitmap:GETRANGE {key} 0 1048575",
    "cf:CF.SCANDUMP {key} 0",
)
RESTORE = (
    *READ,
    *LOCK,
    *CUTOVER,
    "TYPE {restore}",
    "TYPE {restore_meta}",
    "EXISTS {restore_meta}",
    "UNLINK {restore} {restore_meta}",
    "MULTI",
    "EXEC",
    "HSET {restore_meta} state v",
    "PEXPIRE {restore_meta} 3600000",
    "bf:BF.LOADCHUNK {restore} 1 x",
    "bf:PEXPIRE {restore} 3600000",
    "bf:BF.INFO {restore}",
    "bitmap:SET {restore} v PX 3600000",
    "bitmap:GETRANGE {restore} 0 63",
    "bitmap:STRLEN {restore}",
    "fn:FCALL_RO bloomctl_info 1 {restore}",
    "cf:CF.LOADCHUNK {restore} 1 x",
    "cf:CF.RESERVE {restore} 1000 BUCKETSIZE 2 MAXITERATIONS 20 EXPANSION 1",  # an empty cuckoo filter
    "cf:CF.INFO {restore}",
    "cf:DUMP {restore}",  # RedisBloom 2.x with replicas: the loaded filter written again, whole
    "cf:PTTL {restore}",
    "cf:RESTORE {restore} 3600000 x REPLACE",
    "fn:FCALL_RO bloomctl_cf_info 1 {restore}",
    f"EVALSHA {_SHA} 5 {{restore}} {{restore_meta}} {{standby}} {{standby_meta}} {{lock}} v",
    "HGET {restore_meta} generation",  # (lua)
    "EXISTS {restore}",  # (lua)
    "EXISTS {standby}",  # (lua)
    "UNLINK {standby} {standby_meta}",  # (lua)
    "PERSIST {restore}",  # (lua)
    "RENAME {restore} {standby}",  # (lua)
    "HSET {restore_meta} state v",  # (lua)
    "PERSIST {restore_meta}",  # (lua)
    "RENAME {restore_meta} {standby_meta}",  # (lua)
    "HGET {standby_meta} generation",  # (lua) a failed restore removes only what it wrote
    "EXISTS {key}",  # a sharded restore's new manifest
    "HSET {key} bloomctl v",  # (lua) the manifest
    f"EVALSHA {_SHA} 1 {{key}} bloomctl v",
)

# time-windowed filters: the settings at the window's key, and its buckets ({bucket})
WINDOW = (
    *CONNECT,
    *FUNCTION_LIBRARY,
    "TYPE {key}",
    "HGETALL {key}",
    "HGET {key} bloomctl_window",
    f"EVALSHA {_SHA} 1 {{key}} v",  # the settings, written in one step
    "SCRIPT LOAD return",
    "EXISTS {key}",  # (lua)
    "HSET {key} bloomctl_window v",  # (lua)
    "TIME",
    "TYPE {bucket}",
    "PTTL {bucket}",
    "EXPIREAT {bucket} 0",
    "SCAN 0 MATCH x COUNT 1000",
    "UNLINK {bucket}",  # a bucket left outside the window
    "bf:BF.RESERVE {bucket} 0.01 1000 EXPANSION 2",
    "bf:BF.INFO {bucket}",
    "bf:BF.CARD {bucket}",
    "bf:BF.SCANDUMP {bucket} 0",
    "cf:CF.RESERVE {bucket} 1000 BUCKETSIZE 2 MAXITERATIONS 20 EXPANSION 1",
    "cf:CF.INFO {bucket}",
    "fn:FUNCTION LOAD REPLACE x",
    "fn:FCALL bloomctl_reserve 1 {bucket} 64 1 1 0.01",
    "fn:FCALL bloomctl_cf_reserve 1 {bucket} 512 2 2 20 1000 0.01",
    "fn:FCALL_RO bloomctl_info 1 {bucket}",
    "fn:FCALL_RO bloomctl_card 1 {bucket}",
    "fn:FCALL_RO bloomctl_cf_info 1 {bucket}",
    "bitmap:GETRANGE {bucket} 0 63",  # also (lua)
    "bitmap:STRLEN {bucket}",  # also (lua)
    "bitmap:SET {bucket} v NX",  # also (lua)
    "bitmap:SETRANGE {bucket} 0 x",  # (lua)
)

# check and the exporter read each declared filter (a window's settings and buckets too), the
# standby's metadata (how the last rebuild ended), and the server's own fitness as doctor does
WINDOW_READ = (
    "TYPE {key}",
    "HGETALL {key}",
    "TIME",
    "TYPE {bucket}",
    "PTTL {bucket}",
    "bf:BF.INFO {bucket}",
    "cf:CF.INFO {bucket}",
    "fn:FCALL_RO bloomctl_info 1 {bucket}",
    "fn:FCALL_RO bloomctl_cf_info 1 {bucket}",
    "bitmap:GETRANGE {bucket} 0 63",
    "bitmap:STRLEN {bucket}",
)
DECLARED_READ = (*READ, *WINDOW_READ, "TYPE {standby_meta}", "HGETALL {standby_meta}", "INFO persistence")

COMMANDS: dict[str, tuple[str, ...]] = {
    "plan": (),
    "info": READ,
    "fill-ratio": (*READ, "SCAN 0 MATCH x COUNT 1000 TYPE string", "HGET {key} bloomctl"),
    "reserve": RESERVE,
    "rebuild": (*RESERVE, *LOCK, *CUTOVER, *WRITE_STANDBY),
    "swap": (*READ, *LOCK, *CUTOVER),
    "rollback": (*READ, *LOCK, *CUTOVER),
    "functions": (*CONNECT, *FUNCTION_LIBRARY, "fn:FUNCTION LOAD REPLACE x"),
    "dump": DUMP,
    "restore": RESTORE,
    "copy": (*DUMP, *RESTORE),  # on the source, the dump's; on the target, the restore's
    "window": WINDOW,
    "config": (),  # reads the file only
    "check": DECLARED_READ,
    "apply": (*DECLARED_READ, *RESERVE, *LOCK, *CUTOVER, *WRITE_STANDBY, *WINDOW),  # creates: reserve, rebuild, window
    "exporter": DECLARED_READ,
}
# doctor's own reads: the operator's line includes them, but CONFIG GET (it can read the server's
# passwords) and ACL DRYRUN (it reveals every user's rights): doctor says what it could not read
DOCTOR = (*READ, "SCAN 0 MATCH x COUNT 1000 TYPE string", "ACL WHOAMI", "MULTI", "DISCARD")
DOCTOR_CLUSTER = ("CLUSTER INFO", "CLUSTER NODES")
NOT_FOR_OPERATORS = ("config|get", "acl|dryrun")
BITMAP_ONLY = ("functions",)  # needed only where the bitmap backend is in use

# The application: lookups and dual writes only (docs/python-api.md), through bloomctl's Filter or
# any client. For the bitmap backend, the functions' own commands are checked against the caller's
# ACL too: GETRANGE, GETBIT and BITFIELD.
APPLICATION = (
    "bf:BF.EXISTS {key} x",
    "bf:BF.MEXISTS {key} x",
    "bf:BF.ADD {key} x",
    "bf:BF.MADD {key} x",
    "bf:BF.INSERT {standby} NOCREATE ITEMS x",  # bloomctl's Filter.madd: never creates a filter
    "TYPE {key}",  # bloomctl's Filter recognises the backend
    "HGETALL {key}",  # ... and a sharded filter's manifest
    "bitmap:GETRANGE {key} 0 63",
    "bitmap:STRLEN {key}",
    "fn:FCALL bloomctl_add 1 {key} x",
    "fn:FCALL bloomctl_madd 1 {standby} x",
    "fn:FCALL_RO bloomctl_exists 1 {key} x",
    "fn:FCALL_RO bloomctl_mexists 1 {key} x",
    "fn:FCALL_RO bloomctl_version 0",
    "fn:FUNCTION LIST LIBRARYNAME bloomctl",
    f"script:EVALSHA {_SHA} 1 {{key}} madd x",
    "script:SCRIPT LOAD return",
    "bitmap:GETBIT {key} 0",
    "bitmap:BITFIELD {standby} GET u1 0",
    # cuckoo filters: lookups, adds, deletes, and the dual writes of a rebuild (bloomctl_cf_dual)
    "cf:CF.EXISTS {key} x",
    "cf:CF.MEXISTS {key} x",
    "cf:CF.ADD {key} x",
    "cf:CF.INSERT {key} NOCREATE ITEMS x",  # also (lua)
    "cf:CF.DEL {key} x",  # also (lua)
    "cf:CF.COUNT {key} x",
    "fn:FCALL bloomctl_cf_madd 1 {key} x",
    "fn:FCALL bloomctl_cf_mdel 1 {key} x",
    "fn:FCALL_RO bloomctl_cf_mexists 1 {key} x",
    "fn:FCALL_RO bloomctl_cf_count 1 {key} x",
    "fn:FCALL bloomctl_cf_dual 5 {key} {standby} {standby_meta} {standby_log} {lock} add x",
    f"script:EVALSHA {_SHA} 5 {{key}} {{standby}} {{standby_meta}} {{standby_log}} {{lock}} cf_dual add x",
    "EXISTS {lock}",  # (lua)
    "EXISTS {standby}",  # (lua)
    "HMGET {standby_meta} state dual",  # (lua)
    "RPUSH {standby_log} x",  # (lua)
    "PEXPIRE {standby_log} 86400000",  # (lua)
    "HSET {standby_meta} dual_error v",  # (lua)
    "bitmap:SETRANGE {key} 0 x",  # (lua) the module-free cuckoo filter's slots
    # time-windowed filters: adds to the current bucket, lookups over the window (docs/windows.md)
    "fn:FCALL bloomctl_window_add 1 {key} x",
    "fn:FCALL_RO bloomctl_window_exists 1 {key} x",
    f"script:EVALSHA {_SHA} 1 {{key}} window_add x",
    "HMGET {key} bloomctl_window period",  # (lua)
    "TIME",  # (lua) the current bucket is the server's
    "EXISTS {bucket}",  # (lua)
    "bf:BF.INSERT {bucket} NOCREATE ITEMS x",  # (lua)
    "bf:BF.MEXISTS {bucket} x",  # (lua)
    "cf:CF.INSERTNX {bucket} NOCREATE ITEMS x",  # (lua)
    "cf:CF.MEXISTS {bucket} x",  # (lua)
    "bitmap:GETRANGE {bucket} 0 63",  # (lua)
    "bitmap:BITFIELD {bucket} GET u1 0",  # (lua)
    "bitmap:GETBIT {bucket} 0",  # (lua)
    "bitmap:SETRANGE {bucket} 0 x",  # (lua)
)

CONTAINERS = frozenset({"acl", "client", "cluster", "command", "config", "function", "memory", "module", "script"})
CONDITIONS = ("bf", "cf", "bitmap", "fn", "script", "cluster")


def acl_name(call: str) -> str:
    """The ACL name of a call: ``rename``, or ``script|load`` for a container's subcommand."""
    words = call.split(":", 1)[1].split() if call.split(":", 1)[0] in CONDITIONS else call.split()
    name = words[0].lower()
    return f"{name}|{words[1].lower()}" if name in CONTAINERS and len(words) > 1 else name


def _condition(call: str) -> tuple[str, str]:
    head, sep, rest = call.partition(":")
    return (head, rest) if sep and head in CONDITIONS else ("", call)


def calls(group: str | Sequence[str], conditions: Iterable[str] | None = None) -> list[str]:
    """The sample calls of a command (or of a table's rows), the prefix removed: those whose
    condition is in ``conditions`` (all of them when None), each once."""
    rows = COMMANDS[group] if isinstance(group, str) else group
    wanted = None if conditions is None else set(conditions) | {""}
    out: dict[str, None] = {}
    for row in rows:
        condition, call = _condition(row)
        if wanted is None or condition in wanted:
            out[call] = None
    return list(out)


def command_names(group: str | Sequence[str], conditions: Iterable[str] | None = None) -> list[str]:
    """The ACL names of what a command sends (``rename``, ``script|load``), sorted."""
    return sorted({acl_name(call) for call in calls(group, conditions)})


def command_table(groups: Iterable[str] | None = None) -> list[tuple[str, list[str]]]:
    return [(group, command_names(group)) for group in (groups or COMMANDS)]


def command_table_markdown() -> str:
    """The table of docs/doctor.md (a test keeps the two equal)."""
    lines = ["| bloomctl command | Redis commands it sends |", "| --- | --- |"]
    for group, names in command_table():
        lines.append(f"| `{group}` | {', '.join(f'`{shown(n)}`' for n in names) or 'none: it needs no server'} |")
    return "\n".join(lines) + "\n"


# --- the report ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    check: str  # server, bloom, functions, persistence, eviction, memory, replication, cluster, keys, acl
    level: str  # ok | info | warning | error
    message: str
    detail: dict[str, Any] = field(default_factory=dict)
    fix: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "level": self.level,
            "message": self.message,
            "detail": self.detail,
            "fix": self.fix,
        }


@dataclass
class Report:
    server: dict[str, Any]
    findings: list[Finding]
    acl: dict[str, Any]
    filters: list[dict[str, Any]]

    @property
    def errors(self) -> int:
        return sum(f.level == ERROR for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.level == WARNING for f in self.findings)

    @property
    def ok(self) -> bool:
        return self.errors == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "findings": [f.as_dict() for f in self.findings],
            "filters": self.filters,
            "acl": self.acl,
            "summary": {"errors": self.errors, "warnings": self.warnings, "ok": self.ok},
        }


def _denied(exc: Exception) -> bool:
    from redis.exceptions import NoPermissionError

    return isinstance(exc, NoPermissionError) or "NOPERM" in str(exc)[:10]


def shown(name: str) -> str:
    """An ACL name as a person reads it: ``SCRIPT LOAD`` for ``script|load``."""
    return name.upper().replace("|", " ")


_REFUSED = re.compile(r"run the '([^']+)' command")


def _not_allowed(check: str, what: str, command: str, exc: Exception) -> Finding:
    """The warning of a check the user may not run: which permission is missing (the command the
    server names, which may be another than the check's first: a library call made on the way)."""
    refused = _REFUSED.search(_text(exc))
    if refused and refused.group(1).lower() != acl_name(command):
        command = shown(refused.group(1))
    return Finding(
        check,
        WARNING,
        f"not allowed to read {what} ({command}): this check was skipped",
        {"command": command, "reason": _text(exc)},
        f"grant +{acl_name(command)} to check it, or run doctor as a user who may",
    )


def _could_not(check: str, what: str, exc: Exception) -> Finding:
    return Finding(check, WARNING, f"could not read {what}: {_text(exc)}", {"reason": _text(exc)})


# --- the checks ----------------------------------------------------------------------------------


def _answers(node: Any) -> bool:
    """Whether a node answers at all (PING; a NOPERM reply is an answer)."""
    import redis

    try:
        node.ping()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return False
    except redis.exceptions.ResponseError:
        return True
    return True


def _readable(select: Any, node: Any, page: list[bytes], scan: dict[str, Any]) -> list[bytes]:
    """``select`` over a SCAN page; a user whose key patterns leave some keys out (SCAN shows every
    key) gets the page key by key, those keys skipped and counted."""
    try:
        return list(select(node, page))
    except Exception as exc:
        if not (_response_error(exc) and _denied(exc)):
            raise
    kept: list[bytes] = []
    for key in page:
        try:
            kept += select(node, [key])
        except Exception as exc:
            if not (_response_error(exc) and _denied(exc)):
                raise
            scan["not_readable"] = scan.get("not_readable", 0) + 1
    return kept


class _Doctor:
    def __init__(self, client: RedisClient, server: ServerInfo) -> None:
        self.client = client
        self.server = server
        self.findings: list[Finding] = []
        self.cluster = is_cluster(client)
        self.nodes = [node for node in primaries(client) if _answers(node)]  # a dead master: check_cluster says so
        self.bitmap_mode: str | None = None

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)

    def guarded(self, check: str, run: Any, *args: Any) -> Any:
        """One check; a node that stops answering (a dead Cluster master) makes it an error finding,
        and the other checks still run. Returns what the check returns, or None."""
        import redis

        try:
            return run(*args)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            self.add(
                Finding(
                    check,
                    ERROR,
                    f"a node did not answer, so this check is incomplete: {_text(exc)}",
                    {"reason": _text(exc)},
                    "bring the node back, or fail it over (redis-cli --cluster check HOST:PORT)",
                )
            )
            return None

    def per_node(self, check: str, found: dict[str, Finding]) -> None:
        """One finding per distinct verdict, naming its nodes on a cluster."""
        merged: dict[tuple[str, str], tuple[Finding, list[str]]] = {}
        for node, finding in found.items():
            key = (finding.level, finding.message)
            merged.setdefault(key, (finding, []))[1].append(node)
        for finding, nodes in merged.values():
            detail = {**finding.detail, "nodes": nodes} if self.cluster else finding.detail
            message = f"{finding.message} (on {', '.join(nodes)})" if self.cluster else finding.message
            self.add(Finding(check, finding.level, message, detail, finding.fix))

    def node_info(self, node: Any, section: str) -> dict[str, Any]:
        return node.info(section)

    # server line, modules, capabilities ------------------------------------------------------

    def check_server(self) -> dict[str, Any]:
        server = self.server
        data = {**server.as_dict(), "line": server.line, "description": server.description}
        try:
            modules = self.client.execute_command("MODULE LIST", **default_node(self.client))
            data["modules"] = [_module(m) for m in modules or []]
        except Exception as exc:
            if not _response_error(exc):
                raise
            data["modules"] = None
            self.add(
                _not_allowed("server", "the loaded modules", "MODULE LIST", exc)
                if _denied(exc)
                else _could_not("server", "the loaded modules", exc)
            )
        modules_text = ", ".join(f"{m['name']} {m['version']}" for m in data["modules"] or []) or "none"
        if data["modules"] is None:
            modules_text = "unknown"
        self.add(
            Finding(
                "server",
                OK if server.product in ("redis", "valkey") else WARNING,
                f"{server.description}; server line {server.line}; modules: {modules_text}",
                data,
                None if server.product in ("redis", "valkey") else "bloomctl is tested on Redis and Valkey only",
            )
        )
        if server.version == "?":
            self.add(
                Finding(
                    "server",
                    WARNING,
                    "not allowed to read the server's version (INFO server): the server line is a guess",
                    {"command": "INFO server"},
                    "grant +info",
                )
            )
        return data

    def check_bloom(self) -> None:
        from bloomctl.server.capabilities import NO_BLOOM_HELP

        server = self.server
        if not server.has_bloom:
            self.add(
                Finding(
                    "bloom",
                    INFO,
                    "no BF.* commands: new filters use the module-free bitmap backend",
                    {"commands": sorted(server.commands)},
                    NO_BLOOM_HELP.replace("(`backend` bitmap)", "(what bloomctl picks here)"),
                )
            )
            return
        missing = sorted({"bf.scandump", "bf.loadchunk", "bf.card", "bf.insert"} - server.commands)
        if missing:
            self.add(
                Finding(
                    "bloom",
                    WARNING,
                    f"BF.* commands, but not {', '.join(m.upper() for m in missing)}: info --exact and client-side "
                    "rebuilds are unavailable (rebuild builds on the server)",
                    {"missing": missing},
                    "upgrade RedisBloom (2.4 or later), or run Redis 8",
                )
            )
        else:
            self.add(
                Finding(
                    "bloom",
                    OK,
                    "BF.* commands with BF.SCANDUMP and BF.LOADCHUNK: every backend and build path is available",
                    {"commands": sorted(server.commands)},
                )
            )

    def check_functions(self, bitmap_in_use: bool) -> None:
        from bloomctl.backends.bitmap import FUNCTIONS, LIBRARY_NAME, LIBRARY_VERSION, Bitmap

        bitmap = Bitmap()
        try:
            self.bitmap_mode = bitmap.detect_mode(self.client)
            status = bitmap.library_status(self.client) if self.bitmap_mode == FUNCTIONS else None
        except Exception as exc:
            if not _response_error(exc):
                raise
            what = "the Functions library"
            self.add(
                _not_allowed("functions", what, "FUNCTION LIST", exc)
                if _denied(exc)
                else _could_not("functions", what, exc)
            )
            return
        if status is None:
            self.add(
                Finding(
                    "functions",
                    INFO,
                    "no Redis Functions (Redis < 7): the bitmap backend runs its Lua through EVALSHA",
                    {"mode": self.bitmap_mode},
                )
            )
            return
        level_if_used = ERROR if bitmap_in_use else WARNING
        states = {node["node"]: node["state"] for node in status["nodes"]}
        detail = {
            "mode": self.bitmap_mode,
            "library": LIBRARY_NAME,
            "expected_version": LIBRARY_VERSION,
            "nodes": status["nodes"],
        }
        if all(state == "current" for state in states.values()):
            self.add(
                Finding("functions", OK, f"Functions library {LIBRARY_NAME} version {LIBRARY_VERSION} loaded", detail)
            )
        elif any(state == "newer" for state in states.values()):
            self.add(
                Finding(
                    "functions",
                    level_if_used,
                    f"the Functions library {LIBRARY_NAME} is newer than this bloomctl's (version {LIBRARY_VERSION}): "
                    "this bloomctl refuses bitmap filters here",
                    detail,
                    "upgrade bloomctl",
                )
            )
        elif any(state == "outdated" for state in states.values()):
            self.add(
                Finding(
                    "functions",
                    level_if_used,
                    f"the Functions library {LIBRARY_NAME} is outdated (this bloomctl needs version {LIBRARY_VERSION}): "
                    "bitmap filters fail until it is replaced",
                    detail,
                    "bloomctl functions install",
                )
            )
        else:
            self.add(
                Finding(
                    "functions",
                    INFO,
                    f"the Functions library {LIBRARY_NAME} is not loaded: the first bitmap command loads it "
                    "(that user needs FUNCTION LOAD)",
                    detail,
                    "bloomctl functions install (once, as a user allowed FUNCTION LOAD)",
                )
            )

    # persistence and eviction ------------------------------------------------------------------

    def check_persistence(self) -> None:
        self.per_node("persistence", {node_name(node): self._persistence(node) for node in self.nodes})

    def _section(self, node: Any, check: str, section: str, what: str) -> dict[str, Any] | Finding:
        """``INFO section`` of a node, or the finding that says why it cannot be read."""
        try:
            return self.node_info(node, section)
        except Exception as exc:
            if not _response_error(exc):
                raise
            return _not_allowed(check, what, f"INFO {section}", exc) if _denied(exc) else _could_not(check, what, exc)

    def _persistence(self, node: Any) -> Finding:
        info = self._section(node, "persistence", "persistence", "the persistence settings")
        if isinstance(info, Finding):
            return info
        aof = bool(int(info.get("aof_enabled", 0)))
        failed = [
            name
            for name, field_name in (
                ("the last RDB save", "rdb_last_bgsave_status"),
                ("the last AOF write", "aof_last_write_status"),
            )
            if _text(info.get(field_name, "ok")) != "ok"
        ]
        if failed:
            return Finding(
                "persistence",
                ERROR,
                f"{' and '.join(failed)} failed: the server may refuse every write (stop-writes-on-bgsave-error)",
                {
                    "aof_enabled": aof,
                    "rdb_last_bgsave_status": _text(info.get("rdb_last_bgsave_status", "")),
                    "aof_last_write_status": _text(info.get("aof_last_write_status", "")),
                },
                "read the server's log (disk full? permissions of dir?)",
            )
        try:
            save = _text(_config(node, "save"))
        except Exception as exc:
            if not _response_error(exc):
                raise
            if aof:
                return Finding(
                    "persistence",
                    OK,
                    "AOF on (RDB save points not read: CONFIG GET denied)",
                    {"aof_enabled": True, "save": None},
                )
            return _not_allowed("persistence", "the RDB save points", "CONFIG GET save", exc)
        rdb = bool(save.strip())
        detail = {"aof_enabled": aof, "save": save}
        if not rdb and not aof:
            return Finding(
                "persistence",
                WARNING,
                "no RDB snapshots and no AOF: every filter is lost when the server restarts",
                detail,
                "CONFIG SET appendonly yes (or CONFIG SET save '3600 1 300 100 60 10000'), then CONFIG REWRITE",
            )
        parts = ([f"RDB (save {save})"] if rdb else []) + (["AOF"] if aof else [])
        return Finding("persistence", OK, " and ".join(parts) + ": filters survive a restart", detail)

    def check_eviction(self) -> None:
        self.per_node("eviction", {node_name(node): self._eviction(node) for node in self.nodes})

    def _eviction(self, node: Any) -> Finding:
        memory = self._section(node, "eviction", "memory", "maxmemory-policy")
        if isinstance(memory, Finding):
            return memory
        policy = _text(memory.get("maxmemory_policy", "?"))
        limit = int(memory.get("maxmemory", 0) or 0)
        detail = {"maxmemory_policy": policy, "maxmemory": limit}
        fix = "CONFIG SET maxmemory-policy noeviction (and maxmemory-policy noeviction in the server's configuration)"
        if policy.startswith(("allkeys-", "volatile-")):
            if policy.startswith("allkeys-"):
                harm = (
                    f"maxmemory-policy {policy} lets the server evict any key under memory pressure, filters and "
                    "their standbys among them: an evicted filter answers 'absent' for every item (BF.EXISTS on a "
                    "missing key), or fails (bitmap)"
                )
            else:
                harm = (
                    f"maxmemory-policy {policy} evicts keys that have a TTL under memory pressure: the old filter a "
                    "swap keeps for rollback (--keep-old gives it one), and any filter or standby given an expiry, "
                    "can vanish (rollback then fails; an evicted filter answers 'absent' for every item)"
                )
            if not limit:
                return Finding(
                    "eviction", WARNING, harm + "; no maxmemory is set, so nothing is evicted yet", detail, fix
                )
            return Finding("eviction", ERROR, harm, detail, fix)
        if not limit:
            system = int(memory.get("total_system_memory", 0) or 0)
            return Finding(
                "eviction",
                INFO,
                f"maxmemory-policy {policy}, maxmemory 0 (no limit): the machine's memory is the limit, and the "
                "kernel's OOM killer, not Redis, acts when it runs out",
                {**detail, "total_system_memory": system},
                "set maxmemory below the machine's memory, with noeviction",
            )
        return Finding(
            "eviction", OK, f"maxmemory-policy {policy}: filters are never evicted (writes fail instead)", detail
        )

    # filters and memory -------------------------------------------------------------------------

    def find_filters(self, keys: Sequence[str | bytes]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The filters to check: the KEYs given, or what a bounded SCAN finds."""
        scan: dict[str, Any] = {"keys_given": bool(keys), "looked_at": 0, "cut_short": False}
        names = [to_bytes(k) for k in keys]
        if not names:
            try:
                names = self._scan(scan)
            except Exception as exc:
                if not _response_error(exc):
                    raise
                what = "the keyspace (to find the filters)"
                self.add(_not_allowed("keys", what, "SCAN 0", exc) if _denied(exc) else _could_not("keys", what, exc))
                return [], scan
        filters = []
        for name in names:
            entry = self._describe(name, given=bool(keys))
            if entry is not None:
                filters.append(entry)
        if not keys:
            cut = " (the look stopped there: pass KEY names to check others)" if scan["cut_short"] else ""
            if scan.get("not_readable"):
                cut += f"; {scan['not_readable']:,} keys this user may not read (its key patterns) were skipped"
            self.add(
                Finding(
                    "keys",
                    INFO,
                    f"found {len(filters)} filter(s) in {scan['looked_at']:,} keys looked at{cut}",
                    {**scan, "filters": [f["key"] for f in filters]},
                )
            )
        return filters, scan

    def _scan(self, scan: dict[str, Any]) -> list[bytes]:
        from bloomctl import backends
        from bloomctl.lifecycle.fill import is_companion
        from bloomctl.lifecycle.manifest import select_manifests

        # Valkey refuses SCAN TYPE with a type no loaded module defines: RedisBloom's only where it is
        usable = [name for name in backends.names() if name != "redisbloom" or self.server.has_bloom]
        selectors = [(b.redis_type, b.select) for b in map(backends.get, usable)]
        selectors.append((b"hash", select_manifests))
        found: list[bytes] = []
        for node in self.nodes:
            for redis_type, select in selectors:
                cursor = 0
                for _ in range(SCAN_CALLS):
                    try:
                        cursor, page = node.scan(cursor=cursor, count=1000, _type=redis_type)
                    except Exception as exc:  # a type the server does not know (Valkey): no keys of it
                        if not (_response_error(exc) and "unknown type name" in _text(exc).lower()):
                            raise
                        cursor = 0
                        break
                    scan["looked_at"] += len(page)
                    found += [k for k in _readable(select, node, list(page), scan) if not is_companion(k)]
                    if not cursor:
                        break
                if cursor:
                    scan["cut_short"] = True
        return sorted(set(found))

    def _describe(self, key: bytes, given: bool) -> dict[str, Any] | None:
        from bloomctl import backends
        from bloomctl.errors import BloomctlError, KeyMissing
        from bloomctl.lifecycle.manifest import read_manifest
        from bloomctl.server.topology import node_address

        name = to_display(key)
        try:
            manifest = read_manifest(self.client, key)
            if manifest is not None:
                backend = backends.get(manifest.backend)
                members = [(m, backend.info(self.client, m, with_header=False).size_bytes) for m in manifest.members]
                return {
                    "key": name,
                    "backend": manifest.backend,
                    "sharded": True,
                    "size_bytes": sum(size for _m, size in members),
                    "members": [(m, size) for m, size in members],
                    "node": None,
                }
            backend = backends.for_key(self.client, key)
            size = backend.info(self.client, key, with_header=False).size_bytes
        except KeyMissing as exc:
            hint = ""
            if given:
                from bloomctl.lifecycle.suggest import did_you_mean

                hint = did_you_mean(self.client, key)
            self.add(
                Finding(
                    "keys",
                    ERROR,
                    f"filter {name!r} does not exist{hint}",
                    {"key": name, "reason": str(exc)},
                    "check the name (bloomctl fill-ratio 'PATTERN*' lists filters)",
                )
            )
            return None
        except BloomctlError as exc:
            self.add(Finding("keys", ERROR, f"{name!r}: {exc}", {"key": name, "reason": str(exc)}))
            return None
        except Exception as exc:
            import redis

            what = f"filter {name!r}"
            if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
                self.add(Finding("keys", ERROR, f"{what}: its node does not answer ({_text(exc)})", {"key": name}))
                return None
            if not _response_error(exc):
                raise
            self.add(_not_allowed("keys", what, "TYPE", exc) if _denied(exc) else _could_not("keys", what, exc))
            return None
        if given:
            self.add(
                Finding(
                    "keys",
                    OK,
                    f"{name!r}: a {backend.name} filter of {size:,} bytes",
                    {"key": name, "backend": backend.name, "size_bytes": size},
                )
            )
        return {
            "key": name,
            "backend": backend.name,
            "sharded": False,
            "size_bytes": size,
            "members": [(key, size)],
            "node": node_address(self.client, key),
        }

    def check_memory(self, filters: list[dict[str, Any]]) -> None:
        """A rebuild holds a second copy of the filter (its standby) until the swap; a client-side
        RedisBloom build a third, while it uploads. The largest filter of each node must fit."""
        from bloomctl.errors import StateConflict
        from bloomctl.server.memory import check_memory

        if not filters:
            self.add(Finding("memory", INFO, "no filter to size a rebuild against", {}))
            return
        largest: dict[int, dict[str, Any]] = {}
        for entry in filters:
            node = node_client(self.client, entry["members"][0][0])
            if id(node) not in largest or entry["size_bytes"] > largest[id(node)]["size_bytes"]:
                largest[id(node)] = entry
        for entry in sorted(largest.values(), key=lambda e: -e["size_bytes"]):
            name, size = entry["key"], entry["size_bytes"]
            standbys = [(KeyFamily.of(m).standby, s) for m, s in entry["members"]]
            builds = [(KeyFamily.of(m).companion("build"), s) for m, s in entry["members"]]
            memory = self._section(
                node_client(self.client, entry["members"][0][0]), "memory", "memory", "the memory in use"
            )
            if isinstance(memory, Finding):
                self.add(memory)
                return
            used = int(memory.get("used_memory", 0))
            limit = int(memory.get("maxmemory", 0)) or int(memory.get("total_system_memory", 0))
            detail = {
                "key": name,
                "size_bytes": size,
                "used_memory": used,
                "limit": limit,
                "left": max(limit - used, 0) if limit else None,
            }
            try:
                check_memory(self.client, standbys)
            except StateConflict as exc:
                self.add(
                    Finding(
                        "memory",
                        ERROR,
                        f"no room to rebuild {name!r}: its standby needs {size:,} bytes, {exc}",
                        detail,
                        "raise maxmemory (or free memory: UNLINK an old filter kept for rollback) before the next rebuild",
                    )
                )
                continue
            try:
                check_memory(self.client, standbys + builds)
                both = True
            except StateConflict:
                both = False
            left = f"{max(limit - used, 0):,} bytes left" if limit else "no limit known"
            if both:
                self.add(
                    Finding(
                        "memory", OK, f"room to rebuild the largest filter {name!r} ({size:,} bytes; {left})", detail
                    )
                )
            else:
                self.add(
                    Finding(
                        "memory",
                        WARNING,
                        f"room for the standby of {name!r} ({size:,} bytes; {left}) but not for a client-side "
                        "build's upload copy too: rebuild builds it on the server",
                        detail,
                        "raise maxmemory, or rebuild with --build server",
                    )
                )

    # replication and cluster --------------------------------------------------------------------

    def check_replication(self) -> None:
        self.per_node("replication", {node_name(node): self._replication(node) for node in self.nodes})

    def _replication(self, node: Any) -> Finding:
        info = self._section(node, "replication", "replication", "the replication state")
        if isinstance(info, Finding):
            return info
        role = _text(info.get("role", "?"))
        if role in ("slave", "replica"):
            link = _text(info.get("master_link_status", "?"))
            master = f"{_text(info.get('master_host', '?'))}:{_text(info.get('master_port', '?'))}"
            detail: dict[str, Any] = {"role": "replica", "master": master, "master_link_status": link}
            if link != "up":
                down = info.get("master_link_down_since_seconds")
                since = f" for {int(down):,}s" if isinstance(down, int) and down >= 0 else ""
                return Finding(
                    "replication",
                    ERROR,
                    f"a replica whose link to its master {master} is {link}{since}: it serves stale filters",
                    detail,
                    "check the master and the replica's log (masterauth, network)",
                )
            return Finding(
                "replication",
                WARNING,
                f"connected to a replica of {master} (link up): reads work, bloomctl's writes fail with READONLY",
                detail,
                "point bloomctl at the master",
            )
        replicas = int(info.get("connected_slaves", 0) or 0)
        states = [
            _text(value.get("state", "?"))
            for name, value in info.items()
            if str(name).startswith("slave") and isinstance(value, dict)
        ]
        detail = {"role": "master", "connected_replicas": replicas, "replica_states": states}
        lagging = [state for state in states if state != "online"]
        if lagging:
            return Finding(
                "replication",
                WARNING,
                f"a master with {replicas} replica(s), {len(lagging)} not online ({', '.join(lagging)})",
                detail,
                "a replica still syncing serves old filters until it is online",
            )
        return Finding(
            "replication",
            OK if replicas else INFO,
            f"a master with {replicas} replica(s)"
            + ("" if replicas else ": a failed server loses the writes since its last save"),
            detail,
        )

    def check_cluster(self) -> None:
        if not self.cluster:
            return
        cluster: Any = self.client
        default = cluster.get_default_node()
        self._cluster_state(cluster, default)
        self._cluster_masters(cluster)
        self._cluster_nodes(cluster, default)

    def _cluster_state(self, cluster: Any, default: Any) -> None:
        from bloomctl.keys import SLOTS

        try:
            info = cluster.get_redis_connection(default).execute_command("CLUSTER INFO")
            if isinstance(info, bytes | str):
                info = dict(line.split(":", 1) for line in _text(info).splitlines() if ":" in line)
        except Exception as exc:
            if not _response_error(exc):
                raise
            self.add(
                _not_allowed("cluster", "the cluster state", "CLUSTER INFO", exc)
                if _denied(exc)
                else _could_not("cluster", "the cluster state", exc)
            )
            info = None
        if info is not None:
            state = _text(info.get("cluster_state", "?"))
            assigned = int(info.get("cluster_slots_assigned", 0) or 0)
            failing = int(info.get("cluster_slots_fail", 0) or 0)
            pfail = int(info.get("cluster_slots_pfail", 0) or 0)
            detail = {
                "cluster_state": state,
                "slots_assigned": assigned,
                "slots_fail": failing,
                "slots_pfail": pfail,
                "masters": int(info.get("cluster_size", 0) or 0),
            }
            if state != "ok" or assigned < SLOTS or failing:
                problems = []
                if state != "ok":
                    problems.append(f"cluster_state {state}")
                if assigned < SLOTS:
                    problems.append(f"{SLOTS - assigned:,} of {SLOTS:,} slots not covered")
                if failing:
                    problems.append(f"{failing:,} slots on failed masters")
                self.add(
                    Finding(
                        "cluster",
                        ERROR,
                        f"the cluster is not healthy: {', '.join(problems)}: commands on those slots fail (CLUSTERDOWN)",
                        detail,
                        "redis-cli --cluster check HOST:PORT, then fix (redis-cli --cluster fix)",
                    )
                )
            else:
                self.add(
                    Finding(
                        "cluster",
                        OK if not pfail else WARNING,
                        f"cluster_state ok, all {SLOTS:,} slots covered by {detail['masters']} masters"
                        + (f"; {pfail} slots on masters suspected failing" if pfail else ""),
                        detail,
                    )
                )

    def _cluster_masters(self, cluster: Any) -> None:
        unreachable = []
        for node in cluster.get_primaries():
            try:
                cluster.get_redis_connection(node).ping()
            except Exception as exc:
                if _response_error(exc) and _denied(exc):
                    continue  # no PING: reachable all the same (it answered)
                unreachable.append((f"{node.host}:{node.port}", f"{type(exc).__name__}: {exc}"))
        for address, reason in unreachable:
            self.add(
                Finding(
                    "cluster",
                    ERROR,
                    f"master {address} does not answer ({reason})",
                    {"node": address, "reason": reason},
                    "check that node; its slots fail until it is back or failed over",
                )
            )
        if not unreachable:
            self.add(Finding("cluster", OK, f"every master answers ({len(cluster.get_primaries())})", {}))

    def _cluster_nodes(self, cluster: Any, default: Any) -> None:
        try:
            nodes = cluster.get_redis_connection(default).execute_command("CLUSTER NODES")
        except Exception as exc:
            if not _response_error(exc):
                raise
            return
        for address, flags in _failing_nodes(nodes):
            level = ERROR if "fail" in flags else WARNING
            self.add(
                Finding(
                    "cluster",
                    level,
                    f"node {address} is flagged {','.join(flags)} by the cluster",
                    {"node": address, "flags": flags},
                    "check that node (CLUSTER NODES)",
                )
            )

    # access ---------------------------------------------------------------------------------------

    def conditions(self, backends_in_use: set[str]) -> set[str]:
        from bloomctl.backends.bitmap import FUNCTIONS

        found = set()
        if "redisbloom" in backends_in_use:
            found.add("bf")
        if "redisbloom-cuckoo" in backends_in_use:
            found |= {"cf", "fn" if self.bitmap_mode in (None, FUNCTIONS) else "script"}  # its dual writes
        if {"bitmap", "lua-cuckoo"} & backends_in_use:
            found |= {"bitmap", "fn" if self.bitmap_mode in (None, FUNCTIONS) else "script"}
        if self.cluster:
            found.add("cluster")
        return found


def _config(node: Any, name: str) -> Any:
    value = node.config_get(name)
    return value.get(name, value.get(name.encode(), "")) if isinstance(value, dict) else value


def _response_error(exc: Exception) -> bool:
    from redis.exceptions import ResponseError

    return isinstance(exc, ResponseError)


def _module(raw: Any) -> dict[str, Any]:
    from bloomctl.server.capabilities import _pairs

    fields = _pairs(raw)
    version = fields.get("ver")
    return {"name": _text(fields.get("name", "?")), "version": version if isinstance(version, int) else _text(version)}


def _failing_nodes(nodes: Any) -> list[tuple[str, list[str]]]:
    """(address, flags) of the nodes CLUSTER NODES flags fail, fail? (pfail) or noaddr."""
    rows: list[tuple[str, list[str]]] = []
    if isinstance(nodes, dict):
        items = [(addr, _text(data.get("flags", ""))) for addr, data in nodes.items()]
    else:
        items = []
        for line in _text(nodes).splitlines():
            parts = line.split()
            if len(parts) > 2:
                items.append((parts[1].split("@")[0], parts[2]))
    for address, flags in items:
        bad = [flag for flag in flags.split(",") if flag in ("fail", "fail?", "noaddr", "handshake")]
        if bad:
            rows.append((_text(address), bad))
    return rows


# --- what the user may run -------------------------------------------------------------------------

_ROLE = re.compile(
    r"\{(key|standby|old|lock|meta|standby_meta|old_meta|build|probe|restore|restore_meta|standby_log|bucket)\}"
)


def _sample_args(call: str, family: KeyFamily) -> list[bytes]:
    keys = {
        **{role: name for role, name in family.all_keys().items() if role != "active"},
        "key": family.active,
        "build": family.companion("build"),
        "probe": family.companion("probe:0"),
        "restore": family.companion("restore"),
        "restore_meta": family.companion("restore:meta"),
        "standby_log": family.standby_log,
        "bucket": family.companion("2026-01-01"),  # a time-windowed filter's bucket (docs/windows.md)
    }
    args: list[bytes] = []
    for word in call.split():
        match = _ROLE.fullmatch(word)
        args.append(keys[match.group(1)] if match else word.encode())
    return args


def whoami(client: RedisClient) -> str | None:
    """The connected user's name: ACL WHOAMI, else the name the connection was opened with."""
    try:
        return _text(client.execute_command("ACL WHOAMI", **default_node(client)))
    except Exception as exc:
        if not _response_error(exc):
            raise
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None) or {}
    if not kwargs and is_cluster(client):
        node = primaries(client)[0]
        kwargs = node.connection_pool.connection_kwargs
    user = kwargs.get("username")
    return _text(user) if user else None


# Commands that act at once inside a MULTI instead of being queued: checking them by queueing would run
# the transaction (EXEC) or end it so that later checks run for real (RESET, QUIT, DISCARD).
NEVER_QUEUE = frozenset({"exec", "discard", "multi", "watch", "unwatch", "reset", "quit", "hello", "auth"})


def _never_queue(call: str) -> bool:
    return acl_name(call).split("|")[0] in NEVER_QUEUE


class _Checker:
    """Whether a user may run a call: ACL DRYRUN (Redis 7+), or, for the connected user without it,
    the call queued in a MULTI that is then discarded (Redis checks the ACL as it queues: nothing runs)."""

    def __init__(self, client: RedisClient, user: str | None, other_user: bool) -> None:
        self.client = client
        self.user = user
        self.method: str | None = None
        self.reason: str | None = None
        self.multi_refused = "refused"
        if user is not None and self._dryrun_works():
            self.method = "dryrun"
        elif other_user:
            self.reason = self.reason or "ACL DRYRUN is needed to check another user"
        elif self._queue_works():
            self.method = "queued"

    def _dryrun_works(self) -> bool:
        try:
            self.client.execute_command("ACL DRYRUN", self.user, "PING", **default_node(self.client))
            return True
        except Exception as exc:
            if not _response_error(exc):
                raise
            self.reason = f"ACL DRYRUN: {_text(exc)}"
            return False

    def _queue_works(self) -> bool:
        node = primaries(self.client)[0]
        result = self._queue(node, [[b"PING"]])
        if result is None or result[0] is not None:
            refused = f"MULTI: {result[0] if result else self.multi_refused}"
            self.reason = f"{self.reason}; {refused}" if self.reason else refused
            return False
        return True

    def _queue(self, node: Any, commands: list[list[bytes]]) -> list[str | None] | None:
        """Queue each command in one MULTI, then DISCARD: the reason each was refused (None: queued)."""
        from redis.exceptions import ResponseError

        unsafe = [args[0] for args in commands if _never_queue(b" ".join(args).decode("utf-8", "replace"))]
        if unsafe:  # a guard, not a path: check() leaves them out
            raise ValueError(f"doctor must never queue {unsafe!r} in its MULTI")

        pool = node.connection_pool
        try:
            connection = pool.get_connection()
        except TypeError:  # redis-py 5: the command name is a required argument
            connection = pool.get_connection("MULTI")
        try:
            connection.send_command("MULTI")
            try:
                connection.read_response()
            except ResponseError as exc:
                self.multi_refused = _text(exc)
                return None
            reasons: list[str | None] = []
            try:
                for args in commands:
                    connection.send_command(*args)
                    try:
                        connection.read_response()
                        reasons.append(None)
                    except ResponseError as exc:
                        reasons.append(_text(exc) if _denied(exc) else None)
            finally:
                connection.send_command("DISCARD")
                with contextlib.suppress(ResponseError):
                    connection.read_response()
            return reasons
        finally:
            # never given back as it is: a DISCARD the user may not run leaves it inside the MULTI,
            # where the next command of the application would only be queued
            connection.disconnect()
            pool.release(connection)

    def check(self, family: KeyFamily, sample_calls: list[str]) -> dict[str, str]:
        """The calls refused, each with the server's reason."""
        node = node_client(self.client, family.active)
        argv = [_sample_args(call, family) for call in sample_calls]
        refused: dict[str, str] = {}
        if self.method == "dryrun":
            for call, args in zip(sample_calls, argv, strict=True):
                try:
                    reply = node.execute_command("ACL DRYRUN", self.user, *args)
                except Exception as exc:
                    if not _response_error(exc):
                        raise
                    reply = exc
                if _text(reply) != "OK":
                    refused[call] = _text(reply)
        elif self.method == "queued":
            # never queued: EXEC would run what was queued before it, RESET/QUIT end the MULTI so that
            # what follows runs. The transaction commands go with MULTI, which this user just ran.
            queued = [(call, args) for call, args in zip(sample_calls, argv, strict=True) if not _never_queue(call)]
            reasons = self._queue(node, [args for _call, args in queued])
            if reasons is None:  # MULTI refused now: nothing could be checked, nothing is taken as allowed
                return {call: f"not checked: MULTI: {self.multi_refused}" for call, _args in queued}
            for (call, _args), reason in zip(queued, reasons, strict=True):
                if reason is not None:
                    refused[call] = reason
        return refused


def check_access(
    doctor: _Doctor,
    groups: Sequence[str],
    family: KeyFamily,
    conditions: set[str],
    user: str | None,
    other_user: bool,
) -> tuple[dict[str, Any], list[Finding]]:
    checker = _Checker(doctor.client, user, other_user)
    who = user or "the connected user"
    acl: dict[str, Any] = {
        "user": user,
        "method": checker.method,
        "sample_key": to_display(family.active),
        "groups": [],
    }
    findings: list[Finding] = []
    if checker.method is None:
        acl["reason"] = checker.reason
        findings.append(
            Finding(
                "acl",
                WARNING,
                f"could not check what {who} may run ({checker.reason})",
                {"reason": checker.reason},
                "run doctor as an admin with --acl-user NAME (ACL DRYRUN, Redis 7+)",
            )
        )
        for group in groups:
            acl["groups"].append({"command": group, "allowed": None, "needed": True, "denied": []})
        return acl, findings
    for group in groups:
        if group in BITMAP_ONLY and "bitmap" not in conditions:
            acl["groups"].append({"command": group, "allowed": None, "needed": False, "denied": []})
            continue
        sample = calls(group, conditions)
        refused = checker.check(family, sample) if sample else {}
        denied = [{"command": acl_name(call), "call": call, "reason": reason} for call, reason in refused.items()]
        acl["groups"].append({"command": group, "allowed": not denied, "needed": True, "denied": denied})
    how = "ACL DRYRUN" if checker.method == "dryrun" else "each command queued in a discarded MULTI"
    refused_groups = [g for g in acl["groups"] if g["allowed"] is False]
    for entry in refused_groups:
        names = sorted({shown(d["command"]) for d in entry["denied"]})
        findings.append(
            Finding(
                "acl",
                WARNING,
                f"{who} cannot run `bloomctl {entry['command']}`: no permission for {', '.join(names)}",
                {"command": entry["command"], "denied": entry["denied"]},
                "grant what is missing, or use the operator line below",
            )
        )
    if not refused_groups:
        findings.append(
            Finding(
                "acl",
                OK,
                f"{who} may run every bloomctl command on {to_display(family.active)!r} (checked with {how})",
                {"method": checker.method},
            )
        )
    else:
        findings.append(
            Finding(
                "acl",
                INFO,
                f"{who} may run: {', '.join(g['command'] for g in acl['groups'] if g['allowed']) or 'none of these'} "
                f"(on {to_display(family.active)!r}, checked with {how})",
                {"method": checker.method},
            )
        )
    return acl, findings


# --- the ACL SETUSER lines -------------------------------------------------------------------------


def _glob_escape(raw: bytes) -> bytes:
    """A key as an ACL key pattern: glob characters escaped; whitespace, which no ACL rule may hold,
    as ``?`` (any one character: a pattern a little wider than the key)."""
    return re.sub(rb"\s", b"?", glob_escape(raw))


def key_patterns(names: Sequence[bytes], application: bool = False) -> list[bytes]:
    """ACL key patterns for these filters: the key and its companions (standby, old, lock, metadata,
    build and probe keys), and the members of a sharded filter with theirs; for the application,
    the key and its standby only (lookups and dual writes)."""
    patterns: list[bytes] = []
    for name in names:
        family = KeyFamily.of(name)
        patterns.append(_glob_escape(family.active))
        shards = b"{*}:" + _glob_escape(family.active) + b":shard:*"
        if application:
            patterns += [_glob_escape(family.standby), shards + b"[0-9]", shards + b"[0-9]:standby"]
        else:
            patterns += [_glob_escape(family.prefix) + b":*", shards]
    return list(dict.fromkeys(patterns))


def _quote(word: bytes) -> str:
    """A word as redis-cli reads it: bare when it can be, else double-quoted with escapes."""
    text = word.decode("utf-8", "backslashreplace")
    if text and not re.search(r"[\s\"'\\]", text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def setuser_lines(names: Sequence[bytes], conditions: set[str], groups: Sequence[str]) -> dict[str, str]:
    """``ACL SETUSER`` for an operator (what every bloomctl command in ``groups`` sends, on those keys)
    and for an application (lookups and dual writes), each defining the user from scratch (reset)."""
    operator_names = {n for group in groups for n in command_names(group, conditions)}
    operator_names |= {acl_name(call) for call in calls(DOCTOR, conditions)}
    if "cluster" in conditions:
        operator_names |= {acl_name(call) for call in DOCTOR_CLUSTER}
    operator_names -= set(NOT_FOR_OPERATORS)
    app_names: set[str] = set()
    app_calls = calls(APPLICATION, conditions) + calls(CONNECT, conditions)
    for call in app_calls:
        name = acl_name(call)
        if name in ("fcall", "fcall_ro"):
            name = f"{name}|{call.split()[1]}"
        if name not in ("info", "module|list", "command|info"):  # the application's client needs no detection
            app_names.add(name)
    patterns = [b"*"] if not names else key_patterns(names)
    app_patterns = [b"*"] if not names else key_patterns(names, application=True)

    def line(user: str, keys: list[bytes], commands: set[str]) -> str:
        words = ["ACL", "SETUSER", user, "reset", "on", f">{PASSWORD_PLACEHOLDER}"]
        words += [_quote(b"~" + k) for k in keys]
        words += [f"+{name}" for name in sorted(commands)]
        return " ".join(words)

    return {
        "operator": line(OPERATOR_USER, patterns, operator_names),
        "application": line(APP_USER, app_patterns, app_names),
    }


# --- the whole diagnosis ---------------------------------------------------------------------------


def fitness(client: RedisClient, server: ServerInfo, keys: Sequence[bytes]) -> list[Finding]:
    """doctor's checks of the server itself, for ``bloomctl check``: persistence, the eviction policy,
    and room to rebuild the largest of the filters ``keys`` (each read as doctor reads a filter)."""
    from bloomctl.backends.library import installs_nothing

    doctor = _Doctor(client, server)
    with installs_nothing():  # reads only, as doctor's own
        doctor.guarded("persistence", doctor.check_persistence)
        doctor.guarded("eviction", doctor.check_eviction)
        entries = [entry for key in keys if (entry := doctor.guarded("keys", doctor._describe, key, False)) is not None]
        doctor.guarded("memory", doctor.check_memory, entries)
    return [finding for finding in doctor.findings if finding.check != "keys"]


def diagnose(
    client: RedisClient,
    keys: Sequence[str | bytes] = (),
    *,
    server: ServerInfo | None = None,
    acl_user: str | None = None,
    groups: Sequence[str] | None = None,
) -> Report:
    """Every check on the server ``client`` talks to. ``keys``: the filters to check (else a bounded
    SCAN finds them); ``acl_user``: check another user's rights (needs ACL DRYRUN); ``groups``: the
    bloomctl commands to check access for (default: every command of the table)."""
    from bloomctl.server.capabilities import detect

    refused: Exception | None = None
    if server is None:
        try:
            server = detect(client)
        except Exception as exc:  # a user denied COMMAND INFO and BF.INFO: what is known, and a warning
            if not (_response_error(exc) and _denied(exc)):
                raise
            server, refused = ServerInfo("redis", "?", "none", None, frozenset(), is_cluster(client)), exc
    from bloomctl.backends.bitmap import installs_nothing

    with installs_nothing():  # sizing a bitmap filter must not load the function library (a write)
        return _diagnose(client, server, refused, keys, acl_user, groups)


def _diagnose(
    client: RedisClient,
    server: ServerInfo,
    refused: Exception | None,
    keys: Sequence[str | bytes],
    acl_user: str | None,
    groups: Sequence[str] | None,
) -> Report:
    from bloomctl.backends.bitmap import SCRIPT

    doctor = _Doctor(client, server)
    if refused is not None:
        doctor.add(_not_allowed("bloom", "which BF.* commands exist", "COMMAND INFO", refused))
    server_data = doctor.check_server()
    doctor.check_bloom()
    doctor.guarded("cluster", doctor.check_cluster)  # first: a master that does not answer is said here
    filters, scan = doctor.guarded("keys", doctor.find_filters, keys) or ([], {})
    in_use = {f["backend"] for f in filters} | {"redisbloom" if server.has_bloom else "bitmap"}
    doctor.guarded("functions", doctor.check_functions, "bitmap" in in_use)
    doctor.guarded("persistence", doctor.check_persistence)
    doctor.guarded("eviction", doctor.check_eviction)
    doctor.guarded("memory", doctor.check_memory, filters)
    doctor.guarded("replication", doctor.check_replication)

    conditions = doctor.conditions(in_use)
    server_data["backends"] = {
        "redisbloom": server.has_bloom,
        "bitmap": "script" if doctor.bitmap_mode == SCRIPT else "functions",
        "in_use": sorted(in_use),
    }
    chosen = list(groups) if groups is not None else [g for g in COMMANDS if g != "plan"]
    names = [to_bytes(k) for k in keys] or [to_bytes(f["key"]) for f in filters]
    sample = KeyFamily.of(names[0] if names else SAMPLE_KEY)
    user = acl_user or whoami(client)
    checked = doctor.guarded("acl", check_access, doctor, chosen, sample, conditions, user, acl_user is not None)
    unanswered: dict[str, Any] = {"user": user, "method": None, "groups": [], "reason": "a node did not answer"}
    acl, acl_findings = checked or (unanswered, [])
    doctor.findings += acl_findings
    known = [to_bytes(f["key"]) for f in filters] or [to_bytes(k) for k in keys]
    acl["setuser"] = setuser_lines(known, conditions, chosen)
    acl["password_note"] = PASSWORD_NOTE
    if not known:
        doctor.add(
            Finding(
                "acl",
                INFO,
                "no filter names known: the ACL lines below allow every key (~*)",
                {},
                "run `bloomctl doctor KEY...` with your filters' names for lines limited to their keys",
            )
        )
    shown_filters = [
        {k: v for k, v in f.items() if k != "members"} | {"members": len(f["members"])}
        if f["sharded"]
        else {k: v for k, v in f.items() if k != "members"}
        for f in filters
    ]
    server_data["scan"] = scan
    return Report(server_data, doctor.findings, acl, shown_filters)
