"""What the benchmarks share: a throwaway redis-server on a free loopback port, and its costs."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    module: str | None, workdir: str | os.PathLike[str], binary: str = "redis-server"
) -> tuple[subprocess.Popen, int]:
    """A redis-server (with the RedisBloom module when given) that keeps nothing on disk."""
    port = free_port()
    args = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(workdir),
        "--logfile",
        os.path.join(workdir, "redis.log"),
    ]
    if module:
        args += ["--loadmodule", module]
    proc = subprocess.Popen(args)
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return proc, port
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    proc.terminate()
    raise RuntimeError("redis-server did not start")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def slowest_command(client: redis.Redis) -> tuple[str, int] | None:
    """The slowest command in SLOWLOG (its name, microseconds), or None when none was logged."""
    entries = client.slowlog_get(1_000_000)
    if not entries:
        return None
    worst = max(entries, key=lambda e: e["duration"])
    command = worst["command"]
    name = command.split()[0] if isinstance(command, str) else command.split()[0].decode()
    return name, int(worst["duration"])
