"""The server's fitness for filters: modules, persistence, eviction, memory, replication, Cluster.

``Doctor`` holds one run of the checks on a server: each check adds its findings, a node that
stops answering makes that one check an error, and a check the user may not run a warning.
"""

from __future__ import annotations

from typing import Any

from bloomctl.doctor.findings import (
    ERROR,
    INFO,
    OK,
    WARNING,
    Finding,
    could_not,
    is_denied,
    is_response_error,
    not_allowed,
)
from bloomctl.keys import KeyFamily
from bloomctl.server.capabilities import ServerInfo, _text
from bloomctl.server.client import RedisClient
from bloomctl.server.topology import default_node, is_cluster, node_client, node_name, primaries


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


class Doctor:
    """One run of the checks on a server: the findings so far, and the primaries that answered."""

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
            if not is_response_error(exc):
                raise
            data["modules"] = None
            self.add(
                not_allowed("server", "the loaded modules", "MODULE LIST", exc)
                if is_denied(exc)
                else could_not("server", "the loaded modules", exc)
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
            if not is_response_error(exc):
                raise
            what = "the Functions library"
            self.add(
                not_allowed("functions", what, "FUNCTION LIST", exc)
                if is_denied(exc)
                else could_not("functions", what, exc)
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
            if not is_response_error(exc):
                raise
            return not_allowed(check, what, f"INFO {section}", exc) if is_denied(exc) else could_not(check, what, exc)

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
            if not is_response_error(exc):
                raise
            if aof:
                return Finding(
                    "persistence",
                    OK,
                    "AOF on (RDB save points not read: CONFIG GET denied)",
                    {"aof_enabled": True, "save": None},
                )
            return not_allowed("persistence", "the RDB save points", "CONFIG GET save", exc)
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
            if not is_response_error(exc):
                raise
            self.add(
                not_allowed("cluster", "the cluster state", "CLUSTER INFO", exc)
                if is_denied(exc)
                else could_not("cluster", "the cluster state", exc)
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
                if is_response_error(exc) and is_denied(exc):
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
            if not is_response_error(exc):
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


def _config(node: Any, name: str) -> Any:
    value = node.config_get(name)
    return value.get(name, value.get(name.encode(), "")) if isinstance(value, dict) else value


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
