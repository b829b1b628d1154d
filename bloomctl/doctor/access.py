"""What a user may run, per bloomctl command, and the least-privilege ``ACL SETUSER`` lines.

Each sample call of ``COMMANDS`` is checked with ACL DRYRUN, or, for the connected user without it,
queued in a MULTI that is then discarded; nothing runs either way.

The lines are built from the same table and the names of the filters and windows they are for:
the operator gets every command of the table on each filter's key and companions, each by its name,
and on each window's settings and buckets; the application what its backend's lookups, adds and
dual writes send (a window's adds and lookups too), the functions' own commands included (Redis
checks those against the caller's ACL); and the functions admin what ``bloomctl functions install``
sends. Each line comes with notes that say what it still allows.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bloomctl.doctor.commands import (
    APPLICATION_BY_BACKEND,
    APPLICATION_CLUSTER,
    BITMAP_ONLY,
    DOCTOR,
    DOCTOR_CLUSTER,
    FUNCTION_WRITES,
    INSTALLS_LIBRARY,
    LISTS_KEYS,
    NOT_FOR_OPERATORS,
    WINDOW_APPLICATION_BY_BACKEND,
    acl_name,
    calls,
    shown,
)
from bloomctl.doctor.findings import INFO, OK, WARNING, Finding, is_denied, is_response_error
from bloomctl.keys import KeyFamily, glob_escape, to_display
from bloomctl.server.capabilities import _text
from bloomctl.server.client import RedisClient
from bloomctl.server.topology import default_node, is_cluster, node_client, primaries


def conditions_in_use(
    backends_in_use: set[str], bitmap_mode: str | None, cluster: bool, windows: bool = False
) -> set[str]:
    """The prefixes of COMMANDS that apply to this server: the backends in use, how their Lua runs, a
    Cluster. ``windows``: a time-windowed filter is in use, whose adds and lookups are functions of
    the library whatever its buckets' backend."""
    from bloomctl import backends
    from bloomctl.backends.bitmap import FUNCTIONS

    found = set()
    library = "fn" if bitmap_mode in (None, FUNCTIONS) else "script"
    if windows:
        found.add(library)
    for backend in map(backends.get, sorted(backends_in_use)):
        found.add(backend.command_group)
        # A backend that calls the function library, itself or for the application's writes during
        # a rebuild, needs FCALL where the server has Functions and EVALSHA where it does not.
        if backend.needs_library:
            found.add(library)
    if cluster:
        found.add("cluster")
    return found


# --- what the user may run -------------------------------------------------------------------------

_ROLE = re.compile(
    r"\{(key|standby|old|lock|meta|standby_meta|old_meta|build|probe|restore|restore_meta|standby_log|bucket|alias)\}"
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
        "alias": family.prefix,  # the other name whose window would have the same buckets
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
        if not is_response_error(exc):
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
            if not is_response_error(exc):
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
                        reasons.append(_text(exc) if is_denied(exc) else None)
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
                    if not is_response_error(exc):
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


def waived(group: str, call: str) -> bool:
    """Calls not held against a command: SCAN (only a glob PATTERN and doctor without KEY need it, and
    it lists every key name), and FUNCTION LOAD but for `functions` (the others send it only where
    the library is missing, which doctor's functions check reports)."""
    name = acl_name(call)
    return name in LISTS_KEYS or (name in INSTALLS_LIBRARY and group != "functions")


WINDOW_ROLES = frozenset({"bucket", "alias"})  # the role words of a window's own keys


def applies(call: str, target: Target) -> bool:
    """Whether a sample call is one for ``target``: a filter's companions are no window's, a
    window's buckets no filter's; a name that is nothing yet may become either."""
    roles = set(_ROLE.findall(call))
    if roles & WINDOW_ROLES and not target.may_be_window:
        return False
    return target.may_be_filter or not roles - WINDOW_ROLES - {"key"}


def check_access(
    client: RedisClient,
    groups: Sequence[str],
    target: Target,
    conditions: set[str],
    user: str | None,
    other_user: bool,
) -> tuple[dict[str, Any], list[Finding]]:
    """What ``user`` may run of each bloomctl command in ``groups``, on the keys of ``target``."""
    family = KeyFamily.of(target.name)
    checker = _Checker(client, user, other_user)
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
        sample = [call for call in calls(group, conditions) if not waived(group, call) and applies(call, target)]
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
                "use the functions admin line below"
                if entry["command"] == "functions"
                else "grant what is missing, or use the operator line below",
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


# --- the ACL SETUSER lines ---------------------------------------------------------------------------

FCALLS = ("fcall", "fcall_ro")
OPERATOR_USER, APP_USER, FUNCTIONS_USER = "bloomctl-operator", "bloomctl-app", "bloomctl-functions"
PASSWORD_PLACEHOLDER = "CHANGE_ME"
PASSWORD_NOTE = (
    f"replace {PASSWORD_PLACEHOLDER} with the user's password (or '>{PASSWORD_PLACEHOLDER}' with "
    "'#<sha256 hex of it>') before running a line; give bloomctl the operator's password in "
    "BLOOMCTL_PASSWORD or --password-file, the application its own in its configuration"
)
# The filters themselves and a window's buckets: the application's root permissions. Other roles
# are companions, each set in a selector of its own.
FILTER_ROLES = frozenset({"key", "standby", "bucket"})
# A filter's companions by the names bloomctl gives them, each one exactly (a pattern such as
# {users}:* reaches another filter or another application's keys in the same hash tag: {users}:eu,
# {users}:session:42): its family (bloomctl/keys.py), and the scratch keys of a restore and of a
# client-side build. A build's own key and the compatibility probe end in a random id: their fixed
# prefix makes their pattern.
FAMILY_COMPANIONS = ("standby", "old", "lock", "meta", "standby:meta", "old:meta", "standby:log")
SCRATCH_COMPANIONS = ("restore", "restore:meta", "build")
RANDOM_COMPANIONS = ("build:", "probe:")
# A window's bucket labels (bloomctl.window.periods): YYYY-MM-DD for periods of whole days, else YYYY-MM-DDTHH.
DATE_LABEL = b"[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]"
HOUR_LABEL = DATE_LABEL + b"T[0-9][0-9]"


@dataclass(frozen=True)
class Target:
    """A filter or window the lines are for: its name, its backend (None: nothing there yet, so it
    may become a filter or a window), the members of a sharded filter (their names are picked when
    it is reserved: doctor reads them from its manifest), and a window's period (None: no window)."""

    name: bytes
    backend: str | None = None
    members: tuple[bytes, ...] = ()
    period: int | None = None

    @property
    def may_be_filter(self) -> bool:
        return self.backend is None or self.period is None

    @property
    def may_be_window(self) -> bool:
        return self.backend is None or self.period is not None


@dataclass
class Grant:
    """Commands on key patterns, and patterns it may only read (``%R~``, Redis 7+): a user's root
    permissions, or one selector of it."""

    keys: list[bytes] = field(default_factory=list)
    commands: set[str] = field(default_factory=set)
    read_keys: list[bytes] = field(default_factory=list)

    def add(self, keys: Iterable[bytes], command: str) -> None:
        self.keys += [k for k in keys if k not in self.keys]
        self.commands.add(command)

    def rules(self) -> list[bytes]:
        """The ACL rules, each one word, not yet quoted for redis-cli."""
        read = [b"%R~" + k for k in self.read_keys if k not in self.keys]
        return [b"~" + k for k in self.keys] + read + [f"+{name}".encode() for name in sorted(self.commands)]


def pattern(raw: bytes) -> bytes:
    """A key as an ACL key pattern: glob characters escaped; whitespace, which no ACL rule may hold,
    as ``?`` (any one character: a pattern a little wider than the key)."""
    return re.sub(rb"\s", b"?", glob_escape(raw))


def _quote(word: bytes) -> str:
    """A word as redis-cli reads it: bare when it can be, else double-quoted with escapes, each byte
    of what is not printable UTF-8 (a key name need not be UTF-8) as ``\\xHH``."""
    text = word.decode("utf-8", "surrogateescape")
    if text and text.isprintable() and not re.search(r"[\s\"'\\]", text):
        return text
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif "\udc80" <= char <= "\udcff":  # a byte that is no UTF-8 (surrogateescape)
            out.append(f"\\x{ord(char) - 0xDC00:02x}")
        elif char != " " and not char.isprintable():
            out += [f"\\x{byte:02x}" for byte in char.encode()]
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _granted(call: str, by_function: bool) -> str:
    """The ACL rule name of a call: INFO by its section (``info|memory``: INFO is not limited by key
    patterns, its keyspace section lists the databases' key counts), and with ``by_function`` each
    FCALL by the function's name (``fcall|bloomctl_add``)."""
    name, words = acl_name(call), call.split()
    if name == "info" and len(words) > 1:
        return f"info|{words[1].lower()}"
    if by_function and name in ("fcall", "fcall_ro"):
        return f"{name}|{words[1]}"
    return name


def filter_keys(name: bytes) -> list[bytes]:
    """A filter's key and each of its companions, as key patterns."""
    family = KeyFamily.of(name)
    exact = [family.active, *(family.companion(role) for role in (*FAMILY_COMPANIONS, *SCRATCH_COMPANIONS))]
    return [pattern(k) for k in exact] + [pattern(family.companion(role)) + b"*" for role in RANDOM_COMPANIONS]


def bucket_keys(name: bytes, period: int | None) -> list[bytes]:
    """A window's buckets, ``{NAME}:LABEL``: the labels of its period, or, for a window not made
    yet, of either kind of period."""
    from bloomctl.window.periods import DAY

    prefix = pattern(KeyFamily.of(name).prefix) + b":"
    labels = [DATE_LABEL, HOUR_LABEL] if period is None else [DATE_LABEL if period % DAY == 0 else HOUR_LABEL]
    return [prefix + label for label in labels]


def window_aliases(targets: Sequence[Target]) -> list[bytes]:
    """The other names whose window would have a new window's buckets (``X`` and ``{X}``): `window
    create` reads them to refuse a window that would share its buckets."""
    from bloomctl.window.creation import aliases

    return list(dict.fromkeys(alias for t in targets if t.may_be_window for alias in aliases(t.name)))


def not_utf8(targets: Sequence[Target]) -> list[str]:
    """The names of the targets that are not UTF-8: their lines carry ``\\xHH`` escapes."""
    names = [name for t in targets for name in (t.name, *t.members)]
    return [to_display(name) for name in names if to_display(name).encode() != name]


# --- the operator -------------------------------------------------------------------------------------


def operator_keys(targets: Sequence[Target]) -> tuple[list[bytes], list[bytes]]:
    """The operator's key patterns, and those it only reads: each filter's key and its companions
    (and each member of a sharded filter with its own), each window's settings key and buckets, and
    the other names a new window's buckets would be those of (read only). Never a pattern that
    reaches another key of the hash tag, nor another hash tag."""
    keys: list[bytes] = []
    for target in targets:
        if target.may_be_filter:
            for name in (target.name, *target.members):
                keys += filter_keys(name)
        if target.may_be_window:
            keys += [pattern(target.name), *bucket_keys(target.name, target.period)]
    keys = list(dict.fromkeys(keys))
    return keys, [k for k in map(pattern, window_aliases(targets)) if k not in keys]


def library_functions() -> set[str]:
    """Every function of bloomctl's library by name, as bloomctl calls it: FCALL_RO for those that
    only read, FCALL for the others."""
    from bloomctl.backends.library import HANDLERS

    return {f"{'fcall_ro' if read_only else 'fcall'}|bloomctl_{op}" for op, read_only in HANDLERS.items()}


def operator_commands(conditions: set[str], groups: Sequence[str], listing: bool) -> set[str]:
    """What every bloomctl command in ``groups`` sends, and doctor's own reads, but CONFIG GET (it
    can read the server's passwords), ACL DRYRUN (every user's rights), FUNCTION LOAD (the functions
    admin's) and, unless ``listing``, SCAN. FCALL and FCALL_RO name bloomctl's functions, each one:
    another library's are refused. The operator may call every bloomctl function, as Redis checks
    a function's own commands against the caller's key patterns, and every command they send is
    the operator's anyway."""
    sample = [call for group in groups for call in calls(group, conditions)] + calls(DOCTOR, conditions)
    if "cluster" in conditions:
        sample += DOCTOR_CLUSTER
    left_out = {*NOT_FOR_OPERATORS, *INSTALLS_LIBRARY, *([] if listing else LISTS_KEYS), *FCALLS}
    granted = {_granted(call, False) for call in sample if acl_name(call) not in left_out}
    if any(acl_name(call) in FCALLS for call in sample):
        granted |= library_functions()
    return granted


def functions_commands(conditions: set[str]) -> set[str]:
    """What `bloomctl functions install` and `status` send: no key at all."""
    return {_granted(call, True) for call in calls("functions", conditions)}


# --- the application ----------------------------------------------------------------------------------


def _role_keys(target: Target) -> dict[str, list[bytes]]:
    """The key patterns each role word of the application's calls stands for, for one filter or
    window: a sharded filter's manifest and members are its keys, their standbys its standbys; a
    window's settings are its key, and it has buckets."""
    family = KeyFamily.of(target.name)
    if target.members:
        members = [KeyFamily.of(member) for member in target.members]
        roles = {"key": [family.active, *target.members], "standby": [m.standby for m in members]}
    else:
        roles = {
            "key": [family.active],
            "standby": [family.standby],
            "standby_meta": [family.standby_meta],
            "standby_log": [family.standby_log],
            "lock": [family.lock],
        }
    patterns = {role: [pattern(k) for k in keys] for role, keys in roles.items()}
    if target.may_be_window:
        patterns["bucket"] = bucket_keys(target.name, target.period)
    return patterns


def _application_rows(target: Target, in_use: Iterable[str]) -> list[str]:
    """The application's calls for one target: its backend's (each backend in use for a name that
    is nothing yet), a filter's, a window's or, for a name not made yet, both."""
    tables = [APPLICATION_BY_BACKEND] if target.may_be_filter else []
    tables += [WINDOW_APPLICATION_BY_BACKEND] if target.may_be_window else []
    names = [target.backend] if target.backend else sorted(in_use)
    return [row for table in tables for name in names for row in table.get(name, ())]


def application_grants(
    targets: Sequence[Target], conditions: set[str], in_use: Iterable[str]
) -> tuple[Grant, dict[frozenset[str], Grant]]:
    """The application's root permissions (its filters' keys and windows' buckets, with what is sent
    there) and one selector per set of companion keys a call touches (a cuckoo filter's dual write:
    the standby's metadata, the log, the lock) with what is sent there alone. Without filter names,
    every key."""
    root = Grant()
    extra: dict[frozenset[str], Grant] = {}
    for target in targets or [Target(b"*")]:
        roles = _role_keys(target) if targets else None
        for row_call in calls(_application_rows(target, in_use), conditions):
            words = set(_ROLE.findall(row_call))
            keys = [b"*"] if roles is None else [k for role in sorted(words) for k in roles.get(role, [])]
            grant = root if words <= FILTER_ROLES else extra.setdefault(frozenset(words), Grant())
            grant.add(keys, _granted(row_call, True))
    for call in calls(APPLICATION_CLUSTER, conditions):
        root.add([], _granted(call, True))
    return root, extra


def merged(root: Grant, extra: Iterable[Grant]) -> Grant:
    """One grant of every command on every key: for a server without ACL selectors."""
    whole = Grant(list(root.keys), set(root.commands))
    for grant in extra:
        whole.keys += [k for k in grant.keys if k not in whole.keys]
        whole.commands |= grant.commands
    return whole


def application_notes(root: Grant, extra: dict[frozenset[str], Grant], selectors: bool) -> list[str]:
    """What the application's line allows beyond bloomctl's calls: the plain writes that the
    functions send with the caller's rights, and FUNCTION LIST."""
    notes = []
    on_filters = sorted(root.commands & set(FUNCTION_WRITES))
    if on_filters:
        notes.append(
            "Redis runs a function's commands with the caller's rights, so bloomctl's functions need "
            f"{', '.join(map(shown, on_filters))} on the filters' keys (the module-free filters are plain "
            "strings those commands write): the application may run them directly too, and a wrong write "
            "corrupts a filter"
        )
    companions = sorted({name for grant in extra.values() for name in grant.commands} & set(FUNCTION_WRITES))
    if companions:
        where = "each on those keys alone (a selector)" if selectors else "on every key of the line"
        notes.append(
            "a cuckoo filter's dual write (bloomctl_cf_dual) also marks the standby's metadata and appends to "
            f"the rebuild's write log: the application may run {', '.join(map(shown, companions))} there "
            f"directly, {where}"
        )
    if "function|list" in root.commands:
        notes.append(FUNCTION_LIST_NOTE.format(why="open_filter checks the version of bloomctl's library"))
    return notes


# --- the lines ----------------------------------------------------------------------------------------

FUNCTION_LIST_NOTE = (
    "FUNCTION LIST ({why}) lists every library of the server, and with WITHCODE shows their code, "
    "another application's too; FCALL names bloomctl's functions one by one, so none of another library's runs"
)


def operator_notes(operator: Grant, listing: bool, aliases: Sequence[bytes], read_only: bool) -> list[str]:
    """What the operator's line says of INFO, SCAN and FUNCTION LIST, which no key pattern limits,
    and of the names a new window's buckets would clash with."""
    sections = sorted(name.split("|", 1)[1] for name in operator.commands if name.startswith("info|"))
    notes = [
        f"INFO is not limited by key patterns: the line allows it with one of the sections {', '.join(sections)} "
        "first (bloomctl reads the server's version, memory before a reserve or rebuild, persistence and "
        "replication); a bare INFO or INFO keyspace is refused, but Redis checks the first section name "
        "alone, so INFO server keyspace (or INFO server everything) still shows the keyspace section: "
        "each database's key count, never a key name"
    ]
    if not listing:
        notes.append(
            "no SCAN (it lists every key name of the database): give fill-ratio and doctor filter names, "
            "not glob patterns"
        )
    if "function|list" in operator.commands:
        notes.append(FUNCTION_LIST_NOTE.format(why="bloomctl checks its library's version"))
    if aliases:
        names = ", ".join(repr(to_display(alias)) for alias in aliases)
        how = "read only (%R~)" if read_only else "whole: this server has no read-only key patterns (Redis 7+)"
        notes.append(
            f"`window create` reads {names} (a window there would have the same buckets) to refuse the clash: {how}"
        )
    return notes


def target_notes(targets: Sequence[Target]) -> list[str]:
    """What the lines mean for the names that are nothing yet, and for those that are not UTF-8."""
    notes = []
    new = [repr(to_display(t.name)) for t in targets if t.backend is None]
    if new:
        notes.append(
            f"{', '.join(new)}: nothing there yet, so the lines let the operator make a Bloom or cuckoo "
            "filter or a window of it (run doctor again once it exists for lines exact to what it is); "
            "not a sharded filter (reserve --shards N): its members' names are picked as it is reserved, "
            "so an admin reserves it, then doctor prints lines that name them"
        )
    strange = not_utf8(targets)
    if strange:
        notes.append(
            f"{', '.join(map(repr, strange))} is not UTF-8: the lines write its bytes as \\xHH in double "
            "quotes, as redis-cli reads them: run the lines in redis-cli, not through a shell"
        )
    return notes


def _line(user: str, root: Grant, extra: Iterable[Grant] = ()) -> str:
    words = ["ACL", "SETUSER", user, "reset", "on", f">{PASSWORD_PLACEHOLDER}", *map(_quote, root.rules())]
    # Redis splits a selector's rules as redis-cli splits a line: each rule quoted, then the selector
    words += [_quote(("(" + " ".join(map(_quote, grant.rules())) + ")").encode()) for grant in extra]
    return " ".join(words)


def setuser_lines(
    targets: Sequence[Target],
    conditions: set[str],
    groups: Sequence[str],
    in_use: Iterable[str],
    acl_v2: bool = True,
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """``ACL SETUSER`` lines, each defining its user from scratch (reset), and notes on what each
    allows: ``operator`` (every bloomctl command in ``groups`` on the filters' and windows' keys),
    ``application`` (lookups, adds, deletes and dual writes) and, where the function library is in
    use, ``functions`` (installing it). Without ``targets`` the lines allow every key (~*).
    ``acl_v2``: the server has ACL selectors and read-only key patterns (Redis 7+)."""
    listing = not targets  # with every key allowed, listing their names shows nothing more
    keys, read = operator_keys(targets)
    # Servers without Functions (before Redis 7) have no ACL selectors or read-only patterns either.
    modern = acl_v2 and "script" not in conditions
    operator = Grant(keys or [b"*"], operator_commands(conditions, groups, listing))
    if modern:
        operator.read_keys = read
    else:
        operator.keys += read
    root, extra = application_grants(targets, conditions, in_use)
    ordered = [extra[roles] for roles in sorted(extra, key=sorted)]
    # one root where there are no selectors, and for a line of every key too, where a selector adds nothing
    selectors = bool(targets) and modern
    application = _line(APP_USER, root, ordered) if selectors else _line(APP_USER, merged(root, ordered))
    lines = {"operator": _line(OPERATOR_USER, operator), "application": application}
    general = target_notes(targets)
    notes = {
        "operator": [*operator_notes(operator, listing, window_aliases(targets), modern), *general],
        "application": [*application_notes(root, extra, selectors), *general],
    }
    if "fn" in conditions:
        lines["functions"] = _line(FUNCTIONS_USER, Grant([], functions_commands(conditions)))
        notes["functions"] = [
            "FUNCTION LOAD REPLACE replaces any library of the server, another application's too: keep this "
            "user apart from the operator, for installing and upgrading bloomctl's library"
        ]
    return lines, notes
