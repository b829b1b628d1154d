"""The one table of the Redis commands each bloomctl command sends, and the ACL names it yields.

``COMMANDS`` lists, per bloomctl command, one sample call per Redis command it issues, those inside
bloomctl's Lua scripts and functions included (Redis checks their ACL too); a test runs the
lifecycle through MONITOR and fails when bloomctl sends a command the table does not list. doctor
checks a user's rights against these calls and builds its ACL lines from them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# --- what each bloomctl command sends ------------------------------------------------------------
# One sample call per Redis command (and per key it touches), as ACL DRYRUN takes it. The words
# {key}, {standby}, {old}, {lock}, {meta}, {standby_meta}, {old_meta}, {standby_log}, {build}, {probe},
# {restore} and {restore_meta} stand for the filter's key family (bloomctl/keys.py); {bucket} for a
# time-windowed filter's bucket, {alias} for the other name whose buckets would be the window's
# (bloomctl.window.creation.aliases). A prefix says when the call is made:
#   bf:      the RedisBloom backend (the server has BF.*)
#   cf:      RedisBloom's cuckoo filters (CF.*) are in use
#   bitmap:  a module-free backend (bitmap, or the cuckoo filter), either way it runs its Lua
#   fn:      the module-free backends through Redis Functions (Redis 7+, Valkey)
#   script:  the module-free backends through EVALSHA (servers without Functions)
#   cluster: a Redis Cluster (redis-py's own discovery)
# Calls marked "(lua)" are made by bloomctl's Lua (scripts and the function library).

_SHA = "0" * 40
CONNECT = (
    "INFO server",  # detect
    "INFO cluster",  # connect: a Cluster node or not
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
    "INFO memory",  # the memory guard: room for the new filter
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
    "bf:BF.SCANDUMP {restore} 0",  # the loaded filter's layout, for the check of its bits
    "bitmap:SET {restore} v PX 3600000",
    "bitmap:GETRANGE {restore} 0 63",
    "bitmap:STRLEN {restore}",
    "fn:FCALL_RO bloomctl_info 1 {restore}",
    "cf:CF.LOADCHUNK {restore} 1 x",
    "cf:CF.RESERVE {restore} 1000 BUCKETSIZE 2 MAXITERATIONS 20 EXPANSION 1",  # an empty cuckoo filter
    "cf:CF.INFO {restore}",
    "cf:INFO replication",  # RedisBloom 2.x: whether replicas get the loaded filter
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
    "TYPE {alias}",  # create: no window at the other name whose buckets would be this one's
    "HGET {alias} bloomctl_window",
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
DOCTOR = (
    *READ,
    *WINDOW_READ,
    "INFO persistence",
    "INFO memory",
    "INFO replication",
    "SCAN 0 MATCH x COUNT 1000 TYPE string",
    "ACL WHOAMI",
    "MULTI",
    "DISCARD",
)
DOCTOR_CLUSTER = ("CLUSTER INFO", "CLUSTER NODES")
NOT_FOR_OPERATORS = ("config|get", "acl|dryrun")
BITMAP_ONLY = ("functions",)  # needed only where the bitmap backend is in use
# Left out of an operator's line, and not held against a command when doctor checks what a user may
# run: SCAN lists every key name of the database, whatever the user's key patterns (only a glob
# PATTERN of fill-ratio and doctor without KEY need it; a "did you mean" hint is skipped without
# it), and FUNCTION LOAD can replace any library of the server, another application's too (a
# bloomctl command sends it only where the library is missing; `functions install` has its own line).
LISTS_KEYS = ("scan",)
INSTALLS_LIBRARY = ("function|load",)
# The plain writes an application's line holds only because bloomctl's functions send them (a
# function runs with its caller's rights): doctor names them under the line.
FUNCTION_WRITES = ("bitfield", "setrange", "hset", "rpush", "pexpire")

# The application: lookups, adds, a cuckoo filter's deletes and counts, and the dual writes of a
# rebuild (docs/python-api.md, docs/cuckoo.md), through bloomctl's Filter or any client, per backend.
# A function's own commands (lua) are checked against the caller's ACL too, so they are the
# application's: on the module-free backends that is what writes the filter's string.
APPLICATION_OPEN = ("TYPE {key}",)  # open_filter recognises the backend
MANIFEST_READ = ("HGETALL {key}",)  # ... and a sharded filter's manifest (Bloom filters only)
LIBRARY_CHECK = (  # the library is there, and of the version this bloomctl calls
    "fn:FUNCTION LIST LIBRARYNAME bloomctl",
    "fn:FCALL_RO bloomctl_version 0",
    "script:SCRIPT LOAD return",
)
CUCKOO_DUAL = (  # a cuckoo filter's adds and deletes during a rebuild: one call, its log and marks
    "fn:FCALL bloomctl_cf_dual 5 {key} {standby} {standby_meta} {standby_log} {lock} add x",
    f"script:EVALSHA {_SHA} 5 {{key}} {{standby}} {{standby_meta}} {{standby_log}} {{lock}} cf_dual add x",
    "TYPE {standby}",  # (lua)
    "EXISTS {standby}",  # (lua)
    "HMGET {standby_meta} state dual",  # (lua)
    "HSET {standby_meta} dual_error v",  # (lua)
    "RPUSH {standby_log} x",  # (lua)
    "PEXPIRE {standby_log} 86400000",  # (lua)
    "EXISTS {lock}",  # (lua)
)
APPLICATION_BY_BACKEND: dict[str, tuple[str, ...]] = {
    "redisbloom": (
        *APPLICATION_OPEN,
        *MANIFEST_READ,
        "BF.EXISTS {key} x",
        "BF.MEXISTS {key} x",
        "BF.ADD {key} x",
        "BF.MADD {key} x",
        "BF.INSERT {key} NOCREATE ITEMS x",  # bloomctl's Filter.madd: never creates a filter
        "BF.INSERT {standby} NOCREATE ITEMS x",  # ... and its dual writes
    ),
    "bitmap": (
        *APPLICATION_OPEN,
        *MANIFEST_READ,
        *LIBRARY_CHECK,
        "GETRANGE {key} 0 63",  # also (lua): open_filter reads the header
        "STRLEN {key}",
        "fn:FCALL bloomctl_add 1 {key} x",
        "fn:FCALL bloomctl_madd 1 {key} x",
        "fn:FCALL bloomctl_madd 1 {standby} x",
        "fn:FCALL_RO bloomctl_exists 1 {key} x",
        "fn:FCALL_RO bloomctl_mexists 1 {key} x",
        f"script:EVALSHA {_SHA} 1 {{key}} madd x",
        f"script:EVALSHA {_SHA} 1 {{standby}} madd x",
        "GETRANGE {standby} 0 63",  # (lua)
        "BITFIELD {key} SET u1 0 1",  # (lua) the item's bits, and the count of items
        "BITFIELD {standby} SET u1 0 1",  # (lua)
        "GETBIT {key} 0",  # (lua)
    ),
    "redisbloom-cuckoo": (
        *APPLICATION_OPEN,
        *LIBRARY_CHECK,
        "CF.EXISTS {key} x",
        "CF.MEXISTS {key} x",
        "CF.ADD {key} x",
        "CF.INSERT {key} NOCREATE ITEMS x",  # also (lua)
        "CF.DEL {key} x",  # also (lua)
        "CF.COUNT {key} x",
        *CUCKOO_DUAL,
        "CF.INSERT {standby} NOCREATE ITEMS x",  # (lua)
        "CF.DEL {standby} x",  # (lua)
    ),
    "lua-cuckoo": (
        *APPLICATION_OPEN,
        *LIBRARY_CHECK,
        "GETRANGE {key} 0 63",  # also (lua)
        "STRLEN {key}",
        "fn:FCALL bloomctl_cf_madd 1 {key} x",
        "fn:FCALL bloomctl_cf_mdel 1 {key} x",
        "fn:FCALL_RO bloomctl_cf_mexists 1 {key} x",
        "fn:FCALL_RO bloomctl_cf_count 1 {key} x",
        f"script:EVALSHA {_SHA} 1 {{key}} cf_madd x",
        *CUCKOO_DUAL,
        "GETRANGE {standby} 0 63",  # (lua)
        "SETRANGE {key} 64 x",  # (lua) the fingerprints' slots
        "SETRANGE {standby} 64 x",  # (lua)
        "BITFIELD {key} INCRBY i64 256 1",  # (lua) the counts of items and deletes
        "BITFIELD {standby} INCRBY i64 256 1",  # (lua)
    ),
}
APPLICATION_CLUSTER = ("PING", "cluster:COMMAND", "cluster:CLUSTER SLOTS")  # redis-py's own discovery
# A time-windowed filter's application (docs/windows.md): WindowedFilter's add, lookup and current
# bucket, each one call of bloomctl's library (on RedisBloom too), whose own commands read the
# settings at the window's name ({key}) and go to its buckets ({bucket}), per the buckets' backend.
WINDOW_CALLS = (
    *LIBRARY_CHECK,
    "fn:FCALL bloomctl_window_add 1 {key} x",
    "fn:FCALL_RO bloomctl_window_exists 1 {key} x",
    "fn:FCALL_RO bloomctl_window_bucket 1 {key}",
    f"script:EVALSHA {_SHA} 1 {{key}} window_add x",
    "TYPE {key}",  # (lua)
    "HMGET {key} bloomctl_window period",  # (lua)
    "TIME",  # (lua) the current bucket is the server's
    "TYPE {bucket}",  # (lua)
    "EXISTS {bucket}",  # (lua)
)
WINDOW_APPLICATION_BY_BACKEND: dict[str, tuple[str, ...]] = {
    "redisbloom": (*WINDOW_CALLS, "BF.INSERT {bucket} NOCREATE ITEMS x", "BF.MEXISTS {bucket} x"),  # (lua)
    "redisbloom-cuckoo": (*WINDOW_CALLS, "CF.INSERTNX {bucket} NOCREATE ITEMS x", "CF.MEXISTS {bucket} x"),  # (lua)
    "bitmap": (  # (lua) the bitmap filter's own
        *WINDOW_CALLS,
        "GETRANGE {bucket} 0 63",
        "BITFIELD {bucket} SET u1 0 1",
        "GETBIT {bucket} 0",
    ),
    "lua-cuckoo": (  # (lua) the module-free cuckoo filter's own
        *WINDOW_CALLS,
        "GETRANGE {bucket} 0 63",
        "SETRANGE {bucket} 64 x",
        "BITFIELD {bucket} INCRBY i64 256 1",
    ),
}
APPLICATION = tuple(
    row for table in (APPLICATION_BY_BACKEND, WINDOW_APPLICATION_BY_BACKEND) for rows in table.values() for row in rows
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
    """The table of docs/doctor.md: scripts/docs.py writes it there, and a test checks it is there."""
    lines = ["| bloomctl command | Redis commands it sends |", "| --- | --- |"]
    for group, names in command_table():
        lines.append(f"| `{group}` | {', '.join(f'`{shown(n)}`' for n in names) or 'none: it needs no server'} |")
    return "\n".join(lines) + "\n"


def shown(name: str) -> str:
    """An ACL name as a person reads it: ``SCRIPT LOAD`` for ``script|load``."""
    return name.upper().replace("|", " ")
