"""Server flavour detection: which Bloom filter commands this server offers, and from whom.

One probe per process (COMMAND INFO for the BF.* commands bloomctl uses, INFO server, and
MODULE LIST where allowed); the result says what is missing in words an operator can act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bloomctl.errors import UnsupportedServer
from bloomctl.server.client import RedisClient
from bloomctl.server.topology import default_node, is_cluster

BF_COMMANDS = (
    "bf.reserve",
    "bf.add",
    "bf.madd",
    "bf.insert",
    "bf.exists",
    "bf.mexists",
    "bf.info",
    "bf.card",
    "bf.scandump",
    "bf.loadchunk",
)
CF_COMMANDS = (
    "cf.reserve",
    "cf.insert",
    "cf.mexists",
    "cf.del",
    "cf.count",
    "cf.info",
    "cf.scandump",
    "cf.loadchunk",
)
PROBED = BF_COMMANDS + CF_COMMANDS

NO_CUCKOO_HELP = (
    "load RedisBloom, run Redis 8 (CF.* built in) or Redis Stack, or use the module-free cuckoo filter "
    "(`backend` module-free)"
)
NO_BLOOM_HELP = (
    "load RedisBloom (redis.conf: loadmodule /path/to/redisbloom.so), run Redis 8 (BF.* built in) or "
    "Redis Stack, or use the module-free bitmap backend (`backend` bitmap)"
)


@dataclass(frozen=True)
class ServerInfo:
    product: str  # redis | valkey | dragonfly | kvrocks
    version: str
    flavour: str  # redisbloom | valkey-bloom | dragonfly | kvrocks | none
    module_version: str | None
    commands: frozenset[str]
    cluster: bool

    @property
    def has_bloom(self) -> bool:
        return "bf.reserve" in self.commands

    @property
    def has_cuckoo(self) -> bool:
        return "cf.reserve" in self.commands

    def require_cuckoo(self) -> None:
        if not self.has_cuckoo:
            raise UnsupportedServer("%s has no CF.* commands: " + NO_CUCKOO_HELP, self.description)

    @property
    def line(self) -> str:
        """The planner's server line: ``redisbloom2`` for the RedisBloom 2.x module, ``redis8`` for
        RedisBloom 8 and later (Redis 8 builds it in; a development build reports 99.99.99), else
        ``bitmap`` (no BF.* commands: the module-free backend)."""
        if not self.has_bloom:
            return "bitmap"
        major = self.module_version.split(".")[0] if self.module_version else ""
        return "redisbloom2" if major.isdigit() and int(major) < 8 else "redis8"

    @property
    def description(self) -> str:
        text = f"{self.product} {self.version}"
        if self.flavour == "redisbloom":
            text += f" with RedisBloom {self.module_version}" if self.module_version else " with RedisBloom"
        elif self.flavour == "valkey-bloom":
            text += " with valkey-bloom"
        return text + (" (cluster)" if self.cluster else "")

    def require_bloom(self) -> None:
        if not self.has_bloom:
            raise UnsupportedServer("%s has no BF.* commands: " + NO_BLOOM_HELP, self.description)

    def as_dict(self) -> dict[str, Any]:
        return {
            "product": self.product,
            "version": self.version,
            "flavour": self.flavour,
            "module_version": self.module_version,
            "cluster": self.cluster,
        }


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _format_module_version(ver: int) -> str:
    """RedisBloom reports 20820 for 2.8.20."""
    return f"{ver // 10000}.{ver // 100 % 100}.{ver % 100}"


def detect(client: RedisClient) -> ServerInfo:
    from redis.exceptions import NoPermissionError

    cluster = is_cluster(client)
    # Every node of a cluster runs the same build: ask one (keyless commands need a target there).
    node = default_node(client)
    try:
        info = client.execute_command("INFO", "server", **node)
    except NoPermissionError:  # ACL users are often denied @dangerous commands such as INFO
        info = {}
    product, version = "redis", _text(info.get("redis_version", "?"))
    if "dragonfly_version" in info:
        product, version = "dragonfly", _text(info["dragonfly_version"])
    elif "kvrocks_version" in info:
        product, version = "kvrocks", _text(info["kvrocks_version"])
    elif _text(info.get("server_name", "")).lower() == "valkey" or "valkey_version" in info:
        product, version = "valkey", _text(info.get("valkey_version", version))

    try:
        # "COMMAND INFO" as one word skips redis-py's COMMAND parser, which fails on unknown names (nil)
        replies = client.execute_command("COMMAND INFO", *PROBED, **node)
        commands = frozenset(
            name for name, reply in zip(PROBED, _command_info_list(replies, len(PROBED)), strict=False) if reply
        )
    except NoPermissionError:
        commands = _probe_bloom(client)

    module_version = None
    try:
        modules = client.execute_command("MODULE LIST", **node)
    except Exception:
        modules = []
    for module in modules or []:
        fields = _pairs(module)
        if _text(fields.get("name", "")).lower() in ("bf", "bloom", "redisbloom"):
            ver = fields.get("ver")
            module_version = _format_module_version(int(ver)) if isinstance(ver, int) else _text(ver)

    if not commands & set(BF_COMMANDS):
        flavour = "none"
    elif product in ("dragonfly", "kvrocks"):
        flavour = product
    elif product == "valkey":
        flavour = "valkey-bloom"
    else:
        flavour = "redisbloom"
    return ServerInfo(product, version, flavour, module_version, commands, cluster)


def _probe_bloom(client: RedisClient) -> frozenset[str]:
    """Without COMMAND, ask BF.INFO and CF.INFO about a key that does not exist: 'not found' means
    that family of commands is there."""
    from redis.exceptions import NoPermissionError, ResponseError

    found: set[str] = set()
    for command, family in (("BF.INFO", BF_COMMANDS), ("CF.INFO", CF_COMMANDS)):
        try:
            client.execute_command(command, "bloomctl:probe:missing")
        except NoPermissionError:
            continue  # not allowed for this user: as good as absent
        except ResponseError as exc:
            text = str(exc).lower()
            if "unknown command" in text:
                continue
            if "not found" not in text:
                raise
        found.update(family)
    return frozenset(found)


def _command_info_list(replies: Any, count: int) -> list[Any]:
    """COMMAND INFO comes back as a list (or a dict when redis-py parses it): one entry per name."""
    if isinstance(replies, dict):
        return [replies.get(name) or replies.get(name.encode()) for name in PROBED]
    replies = list(replies or [])
    return replies + [None] * (count - len(replies))


def _pairs(module: Any) -> dict[str, Any]:
    if isinstance(module, dict):
        return {_text(k): v for k, v in module.items()}
    items = list(module)
    return {_text(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)}


@dataclass(frozen=True)
class BloomDefaults:
    """What BF.ADD / BF.MADD / BF.INSERT create when the key does not exist yet."""

    capacity: int = 100
    error_rate: float = 0.01
    expansion: int | None = 2  # None: NONSCALING (Redis 8's bf-expansion-factor 0)
    source: str = "the module's built-in defaults"


def bloom_defaults(client: RedisClient, server: ServerInfo) -> BloomDefaults:
    """The server's defaults for auto-created filters: Redis 8's ``bf-initial-size``,
    ``bf-error-rate`` and ``bf-expansion-factor`` (CONFIG GET), RedisBloom 2.x's ``INITIAL_SIZE``
    and ``ERROR_RATE`` module arguments (MODULE LIST); 100 / 0.01 / 2 where the server does not tell."""
    node = default_node(client)
    found: dict[str, str] = {}
    try:
        if server.line == "redis8":
            reply = client.execute_command("CONFIG GET", "bf-*", **node)
            pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=False)
            found = {_text(k).lower(): _text(v) for k, v in pairs}
            names = ("bf-initial-size", "bf-error-rate", "bf-expansion-factor")
        else:
            names = ("initial_size", "error_rate", "")
            for module in client.execute_command("MODULE LIST", **node) or []:
                fields = _pairs(module)
                if _text(fields.get("name", "")).lower() == "bf":
                    args = [_text(a) for a in fields.get("args") or []]
                    found = {args[i].lower(): args[i + 1] for i in range(0, len(args) - 1, 2)}
    except Exception:  # no permission for CONFIG or MODULE: the built-in defaults
        return BloomDefaults()
    if not found:
        return BloomDefaults()
    base = BloomDefaults()
    try:
        capacity = int(found.get(names[0], base.capacity))
        error_rate = float(found.get(names[1], base.error_rate))
        expansion_text = found.get(names[2]) if names[2] else None
        expansion = base.expansion if expansion_text is None else (int(expansion_text) or None)
    except ValueError:
        return base
    where = "CONFIG bf-*" if server.line == "redis8" else "the module's arguments"
    return BloomDefaults(capacity, error_rate, expansion, where)


def looks_auto_created(
    made_by_plain_add: bool,
    reserved_capacity: int,
    expansion: int | None,
    first_error: float | None,
    metadata: dict[str, str],
    defaults: BloomDefaults,
) -> bool:
    """A RedisBloom filter bloomctl did not create whose capacity, expansion and first error rate are
    the server's defaults: almost surely made by a BF.ADD on a missing key (no BF.RESERVE first).
    ``made_by_plain_add``: whether the filter's backend creates a filter on an add to a missing key."""
    if not made_by_plain_add or metadata.get("created_by", "").startswith("bloomctl "):
        return False
    if reserved_capacity != defaults.capacity or expansion != defaults.expansion:
        return False
    if first_error is None:
        return True
    tightened = defaults.error_rate / 2 if defaults.expansion is not None else defaults.error_rate
    return abs(first_error - tightened) <= 1e-9 * tightened or abs(first_error - defaults.error_rate) <= 1e-9
