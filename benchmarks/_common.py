"""What both benchmarks need: a throwaway redis-server on a free loopback port."""

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


def start_server(module: str | None, workdir: str | os.PathLike[str]) -> tuple[subprocess.Popen, int]:
    """A redis-server (with the RedisBloom module when given) that keeps nothing on disk."""
    port = free_port()
    args = [
        "redis-server",
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
