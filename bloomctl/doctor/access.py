"""What a user may run, per bloomctl command, and the least-privilege ``ACL SETUSER`` lines.

Each sample call of ``COMMANDS`` is checked with ACL DRYRUN, or, for the connected user without it,
queued in a MULTI that is then discarded; nothing runs either way.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import Any

from bloomctl.doctor.commands import (
    APPLICATION,
    BITMAP_ONLY,
    CONNECT,
    DOCTOR,
    DOCTOR_CLUSTER,
    NOT_FOR_OPERATORS,
    acl_name,
    calls,
    command_names,
    shown,
)
from bloomctl.doctor.findings import INFO, OK, WARNING, Finding, is_denied, is_response_error
from bloomctl.keys import KeyFamily, glob_escape, to_display
from bloomctl.server.capabilities import _text
from bloomctl.server.client import RedisClient
from bloomctl.server.topology import default_node, is_cluster, node_client, primaries

OPERATOR_USER, APP_USER = "bloomctl-operator", "bloomctl-app"
PASSWORD_PLACEHOLDER = "CHANGE_ME"
PASSWORD_NOTE = (
    f"replace {PASSWORD_PLACEHOLDER} with the user's password (or '>{PASSWORD_PLACEHOLDER}' with "
    "'#<sha256 hex of it>') before running a line; give bloomctl the operator's password in "
    "BLOOMCTL_PASSWORD or --password-file, the application its own in its configuration"
)


def conditions_in_use(backends_in_use: set[str], bitmap_mode: str | None, cluster: bool) -> set[str]:
    """The prefixes of COMMANDS that apply to this server: the backends in use, how their Lua runs, a Cluster."""
    from bloomctl import backends
    from bloomctl.backends.bitmap import FUNCTIONS

    found = set()
    for backend in map(backends.get, sorted(backends_in_use)):
        found.add(backend.command_group)
        # A backend that calls the function library, itself or for the application's writes during
        # a rebuild, needs FCALL where the server has Functions and EVALSHA where it does not.
        if backend.needs_library:
            found.add("fn" if bitmap_mode in (None, FUNCTIONS) else "script")
    if cluster:
        found.add("cluster")
    return found


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


def check_access(
    client: RedisClient,
    groups: Sequence[str],
    family: KeyFamily,
    conditions: set[str],
    user: str | None,
    other_user: bool,
) -> tuple[dict[str, Any], list[Finding]]:
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
