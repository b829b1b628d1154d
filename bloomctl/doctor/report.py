"""The whole doctor report: every check run in order, and the entry points the CLI and ``bloomctl check`` call.

``diagnose`` runs every check and returns a ``Report``: a list of ``Finding`` (a check's id, a level
``ok``, ``info``, ``warning`` or ``error``, a message, the numbers behind it and how to fix it), what
the connected user may run, and ready ``ACL SETUSER`` lines with notes. Each check degrades on its own:
a command the user may not run (NOPERM) makes that check a warning naming the missing
permission, never a failure of the whole report. docs/doctor.md explains every check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bloomctl.doctor.access import PASSWORD_NOTE, Target, check_access, conditions_in_use, setuser_lines, whoami
from bloomctl.doctor.commands import COMMANDS
from bloomctl.doctor.findings import ERROR, INFO, WARNING, Finding, is_denied, is_response_error, not_allowed
from bloomctl.doctor.fitness import Doctor
from bloomctl.doctor.inventory import describe, find_filters
from bloomctl.keys import to_bytes
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.server.topology import is_cluster

SAMPLE_KEY = "users"  # the filter name the ACL check uses when no KEY is given and none is found


@dataclass
class Report:
    """What doctor found: the server, every finding, the filters checked, and what the user may run."""

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


def fitness(client: RedisClient, server: ServerInfo, keys: Sequence[bytes]) -> list[Finding]:
    """doctor's checks of the server itself, for ``bloomctl check``: persistence, the eviction policy,
    and room to rebuild the largest of the filters ``keys`` (each read as doctor reads a filter)."""
    from bloomctl.backends.library import installs_nothing

    doctor = Doctor(client, server)
    with installs_nothing():  # reads only, as doctor's own
        doctor.guarded("persistence", doctor.check_persistence)
        doctor.guarded("eviction", doctor.check_eviction)
        entries = [entry for key in keys if (entry := doctor.guarded("keys", describe, doctor, key, False)) is not None]
        doctor.guarded("memory", doctor.check_memory, rebuilt(entries))
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
            if not (is_response_error(exc) and is_denied(exc)):
                raise
            server, refused = ServerInfo("redis", "?", "none", None, frozenset(), is_cluster(client)), exc
    from bloomctl.backends.bitmap import installs_nothing

    with installs_nothing():  # sizing a bitmap filter must not load the function library (a write)
        return _diagnose(client, server, refused, keys, acl_user, groups)


def rebuilt(filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The filters a rebuild makes a second copy of: not a window, whose buckets are made new by rotation."""
    return [f for f in filters if not f["window"]]


def targets(keys: Sequence[str | bytes], filters: list[dict[str, Any]]) -> list[Target]:
    """The filters and windows the ACL lines are for: the KEYs given (those that are nothing yet
    too), else those found; each with its backend and, when sharded, its members, a window with its period."""
    found = {to_bytes(f["key"]): f for f in filters}
    names = [to_bytes(k) for k in keys] or list(found)
    out = []
    for name in names:
        entry = found.get(name)
        if entry is None:
            out.append(Target(name))
        else:
            members = tuple(member for member, _size in entry["members"]) if entry["sharded"] else ()
            out.append(Target(name, entry["backend"], members, entry.get("period")))
    return out


def acl_v2(server: ServerInfo) -> bool:
    """Whether the server has ACL selectors and read-only key patterns: Redis 7+ and Valkey (an
    unknown version counts as a recent one)."""
    major = server.version.split(".", 1)[0]
    return server.product == "valkey" or not major.isdigit() or int(major) >= 7


def _diagnose(
    client: RedisClient,
    server: ServerInfo,
    refused: Exception | None,
    keys: Sequence[str | bytes],
    acl_user: str | None,
    groups: Sequence[str] | None,
) -> Report:
    from bloomctl import backends
    from bloomctl.backends.bitmap import SCRIPT

    doctor = Doctor(client, server)
    if refused is not None:
        doctor.add(not_allowed("bloom", "which BF.* commands exist", "COMMAND INFO", refused))
    server_data = doctor.check_server()
    doctor.check_bloom()
    doctor.guarded("cluster", doctor.check_cluster)  # first: a master that does not answer is said here
    filters, scan = doctor.guarded("keys", find_filters, doctor, keys) or ([], {})
    # The backend a new Bloom filter would get here counts as in use: doctor checks for what comes next.
    in_use = {f["backend"] for f in filters} | {backends.choose(server).name}
    # A KEY that is nothing yet may become a filter of either type or a window: the lines let the
    # operator create any of them (doctor run again once it exists gives lines for what it is alone).
    if {to_bytes(k) for k in keys} - {to_bytes(f["key"]) for f in filters}:
        in_use.add(backends.choose(server, kind=backends.CUCKOO).name)
    # A missing library is an error where a module-free Bloom filter depends on it, or a window (its
    # adds and lookups are functions of the library, whatever its buckets' backend). The cuckoo
    # filters' use of it (their dual writes, the module-free ones) is judged as a warning, as before.
    library_filters = any(b.needs_library and b.kind == backends.BLOOM for b in map(backends.get, in_use))
    doctor.guarded("functions", doctor.check_functions, library_filters or any(f["window"] for f in filters))
    doctor.guarded("persistence", doctor.check_persistence)
    doctor.guarded("eviction", doctor.check_eviction)
    doctor.guarded("memory", doctor.check_memory, rebuilt(filters))
    doctor.guarded("replication", doctor.check_replication)

    known = targets(keys, filters)
    conditions = conditions_in_use(in_use, doctor.bitmap_mode, doctor.cluster, any(t.may_be_window for t in known))
    server_data["backends"] = {
        "redisbloom": server.has_bloom,
        "bitmap": "script" if doctor.bitmap_mode == SCRIPT else "functions",
        "in_use": sorted(in_use),
    }
    chosen = list(groups) if groups is not None else [g for g in COMMANDS if g != "plan"]
    sample = known[0] if known else Target(SAMPLE_KEY.encode())
    user = acl_user or whoami(client)
    checked = doctor.guarded("acl", check_access, client, chosen, sample, conditions, user, acl_user is not None)
    unanswered: dict[str, Any] = {"user": user, "method": None, "groups": [], "reason": "a node did not answer"}
    acl, acl_findings = checked or (unanswered, [])
    doctor.findings += acl_findings
    acl["setuser"], acl["notes"] = setuser_lines(known, conditions, chosen, in_use, acl_v2(server))
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
        {k: v for k, v in f.items() if k not in ("members", "period")}
        | ({"members": len(f["members"])} if f["sharded"] else {})
        for f in filters
    ]
    server_data["scan"] = scan
    return Report(server_data, doctor.findings, acl, shown_filters)
