"""bloomctl in a process of its own, for the tests that signal it, stop it or take its lock
while it runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bloomctl.keys import KeyFamily
from bloomctl.lifecycle.metadata import read_metadata


def start_rebuild(target, tmp_path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """A slow rebuild (server path, 20,000 items/s; ``extra`` options added) in its own process;
    returns once it loads."""
    csv = tmp_path / "big.csv"
    csv.write_text("id\n" + "".join(f"user:{i}\n" for i in range(400_000)))
    args = ["--from-csv", str(csv), "-c", "1M", "-e", "1%", "--build", "server", "--max-rate", "20000", "--swap"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bloomctl", "--url", target.url, "rebuild", "users", *args, *extra, "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    family = KeyFamily.of("users")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if (
            target.client.exists(family.standby)
            and read_metadata(target.client, family.standby_meta).get("state") == "loading"
        ):
            time.sleep(0.3)
            return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(proc.communicate())


def read_terminal(leader: int) -> bytes:
    """Everything a child wrote to the pseudo-terminal whose ``leader`` end this is, until it closed."""
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)
