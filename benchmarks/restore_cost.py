"""What `bloomctl restore` costs the server, against the naive way in the same process.

    python benchmarks/restore_cost.py [--capacity 50M] [--module /path/to/redisbloom.so] [--redis-server PATH]

Starts a throwaway redis-server, makes a filter, dumps it to a file, then loads that file back two
ways, each into a fresh key, and prints for each the server's CPU seconds (/proc/<pid>/stat), its
slowest command (SLOWLOG, every command logged) and the wall time:

- bitmap backend: bloomctl's streamed SET (one command, the value read in the background) against
  writing the 1 MiB slices with SETRANGE (the string grows, and is reallocated, as it goes);
- RedisBloom (with --module): bloomctl's 1 MiB BF.LOADCHUNK pieces against loading SCANDUMP's own
  chunks (up to 16 MiB each) as they come.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time

import redis

from benchmarks._common import cpu_seconds, slowest_command, start_server
from bloomctl.lifecycle.front import reserve
from bloomctl.server.capabilities import detect
from bloomctl.server.connection import connect, settings_from
from bloomctl.sizing.bloom import parse_count, plan
from bloomctl.transfer import dumpfile
from bloomctl.transfer.dump import read_filter
from bloomctl.transfer.restore import restore


def measure(client: redis.Redis, pid: int, run) -> tuple[float, float, tuple[str, int] | None]:
    client.slowlog_reset()
    cpu, started = cpu_seconds(pid), time.perf_counter()
    run()
    return time.perf_counter() - started, cpu_seconds(pid) - cpu, slowest_command(client)


def naive_bitmap(client: redis.Redis, key: str, dump: bytes) -> None:
    reader = dumpfile.Reader(io.BytesIO(dump))
    for chunk in reader.chunks():
        client.setrange(key, chunk.cursor, chunk.data)


def naive_redisbloom(client: redis.Redis, key: str, dump: bytes) -> None:
    reader = dumpfile.Reader(io.BytesIO(dump))
    for chunk in reader.chunks():
        client.execute_command("BF.LOADCHUNK", key, chunk.cursor, chunk.data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", default="50M", help="the filter's capacity at 1%% (default 50M: about 60 MB)")
    parser.add_argument("--module", help="a RedisBloom module: measure the RedisBloom backend too")
    parser.add_argument("--redis-server", default="redis-server")
    args = parser.parse_args()
    capacity = parse_count(args.capacity)
    backends = ["bitmap"] + (["redisbloom"] if args.module else [])
    with tempfile.TemporaryDirectory() as workdir:
        proc, port = start_server(args.module, workdir, args.redis_server)
        try:
            client = connect(settings_from(f"redis://127.0.0.1:{port}/0"))
            client.config_set("slowlog-log-slower-than", 0)
            client.config_set("slowlog-max-len", 100_000)
            server = detect(client)
            print(f"{server.description}, capacity {capacity:,} at 1%")
            print(f"{'backend':<11} {'way':<34} {'wall s':>7} {'server CPU s':>13} {'slowest command':>28}")
            for backend in backends:
                key = f"bench-{backend}"
                expansion = None if backend == "bitmap" else 2
                reserve(client, server, key, plan(capacity, 0.01, expansion), backend=backend)
                out = io.BytesIO()
                dump = read_filter(client, server, key)
                dumpfile.write(out, dump.header, dump.chunks)
                data = out.getvalue()
                reader = dumpfile.Reader(io.BytesIO(data))
                ours = measure(
                    client,
                    proc.pid,
                    lambda reader=reader, backend=backend: restore(
                        client, server, f"ours-{backend}", reader.header, reader.chunks(), swap=True
                    ),
                )
                naive = naive_bitmap if backend == "bitmap" else naive_redisbloom
                way = "SETRANGE per 1 MiB slice" if backend == "bitmap" else "BF.LOADCHUNK per SCANDUMP chunk"
                reference = measure(client, proc.pid, lambda naive=naive, data=data: naive(client, "naive", data))
                client.unlink("naive", f"ours-{backend}")
                for name, (wall, cpu, slowest) in (("bloomctl restore", ours), (way, reference)):
                    worst = f"{slowest[0]} {slowest[1]:,} us" if slowest else "-"
                    print(f"{backend:<11} {name:<34} {wall:>7.2f} {cpu:>13.2f} {worst:>28}")
                ratio = (reference[2][1] / ours[2][1]) if ours[2] and reference[2] and ours[2][1] else float("nan")
                print(f"{backend:<11} slowest command, reference / bloomctl: {ratio:,.1f}x")
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
