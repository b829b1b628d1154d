"""Batched adds through the backend seam, for both backends, against a raw pre-encoded pipe.

    python benchmarks/backend_throughput.py [--items 1000000] [--batch 1000] [--module /path/redisbloom.so]

Starts its own redis-server on a free loopback port (with RedisBloom when a module is given, via
--module or BLOOMCTL_TEST_REDISBLOOM_MODULE) and stops it at the end. In one run it measures:

  reference   redis-cli --pipe fed pre-encoded commands (BF.MADD on RedisBloom, FCALL bloomctl_madd
              for the bitmap backend): what the server absorbs when the client costs nothing
  seam        backend.madd(), one batch per round trip (what an application calling the library does)
  seam+pipe   backend.madd_command() batches sent 8 at a time in a redis-py pipeline
  ceiling     (bitmap only) redis-cli --pipe of pre-encoded BITFIELD SET u1 commands whose positions were
              hashed on the client: how fast Redis itself sets the bits, without the Lua function

and prints items/s and each row as a ratio of its backend's reference run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hiredis
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks._common import start_server
from bloomctl import backends
from bloomctl.sizing.bloom import plan

PIPELINE_DEPTH = 8


def items(n: int) -> list[bytes]:
    return [b"user:%d" % i for i in range(n)]


def batches(data: list[bytes], size: int):
    for start in range(0, len(data), size):
        yield data[start : start + size]


def run_pipe(port: int, commands: list[list], workdir: str) -> float:
    """Seconds for redis-cli --pipe to send pre-encoded commands and read every reply."""
    path = Path(workdir) / "commands.resp"
    with path.open("wb") as f:
        for command in commands:
            f.write(hiredis.pack_command(tuple(command)))
    start = time.perf_counter()
    with path.open("rb") as f:
        out = subprocess.run(["redis-cli", "-p", str(port), "--pipe"], stdin=f, capture_output=True, check=True)
    elapsed = time.perf_counter() - start
    if b"errors: 0" not in out.stdout:
        raise RuntimeError(out.stdout.decode(errors="replace"))
    return elapsed


def bitfield_commands(data: list[bytes], the_plan, batch: int) -> list[list]:
    from bloomctl.backends.bitmap import HEADER_BYTES, positions

    m, k = the_plan.first.bits, the_plan.first.hashes
    commands = []
    for chunk in batches(data, batch):
        command: list = ["BITFIELD", b"ceil"]
        for item in chunk:
            for pos in positions(item, m, k):
                command += ["SET", "u1", HEADER_BYTES * 8 + pos, 1]
        commands.append(command)
    return commands


def run_seam(client, backend, key: bytes, data: list[bytes], batch: int) -> tuple[float, int]:
    start = time.perf_counter()
    added = 0
    for chunk in batches(data, batch):
        added += sum(backend.madd(client, key, chunk))
    return time.perf_counter() - start, added


def run_seam_pipelined(client, backend, key: bytes, data: list[bytes], batch: int) -> tuple[float, int]:
    start = time.perf_counter()
    added = 0
    pipe = client.pipeline(transaction=False)
    queued = 0
    for chunk in batches(data, batch):
        pipe.execute_command(*backend.madd_command(client, key, chunk))
        queued += 1
        if queued == PIPELINE_DEPTH:
            added += sum(sum(backend.parse_flags(reply)) for reply in pipe.execute())
            queued = 0
    if queued:
        added += sum(sum(backend.parse_flags(reply)) for reply in pipe.execute())
    return time.perf_counter() - start, added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--module", default=os.environ.get("BLOOMCTL_TEST_REDISBLOOM_MODULE"))
    args = parser.parse_args()
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        sys.exit("needs redis-server and redis-cli on PATH")

    data = items(args.items)
    workdir = tempfile.mkdtemp(prefix="bloomctl-bench-")
    proc, port = start_server(args.module, workdir)
    rows: list[tuple[str, str, float, float]] = []
    try:
        client = redis.Redis(port=port)
        the_plan = plan(args.items * 2, 0.01, None)
        names = ["bitmap"] + (["redisbloom"] if args.module else [])
        for name in names:
            backend = backends.get(name)
            backend.reserve(client, b"ref", the_plan)  # also loads the bitmap library
            ref_cmds = [backend.madd_command(client, b"ref", chunk) for chunk in batches(data, args.batch)]
            reference = run_pipe(port, ref_cmds, workdir)
            assert backend.card(client, b"ref") > 0.99 * args.items
            client.delete(b"ref")
            ref_label = "redis-cli --pipe, pre-encoded " + (
                "BF.MADD" if name == "redisbloom" else "FCALL bloomctl_madd"
            )
            rows.append((name, ref_label, args.items / reference, 1.0))
            if name == "bitmap":
                ceiling = run_pipe(port, bitfield_commands(data, the_plan, args.batch), workdir)
                rows.append(
                    (
                        name,
                        "ceiling: pre-encoded BITFIELD SET u1, client hashing",
                        args.items / ceiling,
                        reference / ceiling,
                    )
                )
                client.delete(b"ceil")
            for label, runner in (
                ("seam: madd per round trip", run_seam),
                (f"seam: madd_command, pipeline depth {PIPELINE_DEPTH}", run_seam_pipelined),
            ):
                backend.reserve(client, b"seam", the_plan)
                elapsed, added = runner(client, backend, b"seam", data, args.batch)
                assert added > 0.99 * args.items, added
                client.delete(b"seam")
                rows.append((name, label, args.items / elapsed, reference / elapsed))
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)

    print(
        f"{args.items:,} distinct items, batches of {args.batch}, one redis-server "
        f"({'with RedisBloom' if args.module else 'no modules'}), loopback\n"
    )
    print(f"{'backend':<11} {'run':<54} {'items/s':>12} {'x reference':>12}")
    for name, label, rate, ratio in rows:
        print(f"{name:<11} {label:<54} {rate:>12,.0f} {ratio:>12.2f}")


if __name__ == "__main__":
    main()
