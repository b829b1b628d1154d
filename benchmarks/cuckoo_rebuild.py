"""What a cuckoo filter's rebuild costs, and what it costs the server, against the server's own limit.

    python benchmarks/cuckoo_rebuild.py --module /path/redisbloom.so [--redis-server PATH]
        [--items 2000000] [--module-free-items 300000] [--rounds 3]

Writes N distinct items as a one-column CSV with every second item repeated (1.5 N rows: the
rebuild inserts each distinct item once), starts its own redis-server with RedisBloom, and
measures, interleaved over the rounds:

  (a) redis-cli --pipe fed pre-encoded CF.INSERT x1000 of the N distinct items (the reference:
      the server's own limit, with no de-duplication and no verification)
  (b) bloomctl rebuild --type cuckoo --swap from the CSV (RedisBloom's CF.*)
  (c) the same into the module-free cuckoo filter, on --module-free-items distinct items
  (d) a Bloom filter's rebuild on the server path (--build server) from the same CSV

For each: seconds, items/s over distinct items, the ratio to (a) in the same round, the
redis-server's CPU seconds during the run (/proc/<pid>/stat), the slowest command in SLOWLOG
(everything over 1 ms is logged) and the client's peak RSS.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import hiredis
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks._common import cpu_seconds, slowest_command, start_server
from benchmarks.rebuild_throughput import run_child

SLOWLOG_MICROS = 1000


def write_sources(workdir: Path, n: int, tag: str) -> tuple[Path, Path]:
    csv, resp = workdir / f"{tag}.csv", workdir / f"{tag}.resp"
    with csv.open("w") as out:
        out.write("id\n")
        for i in range(n):
            out.write(f"item:{i}\n")
            if i % 2:
                out.write(f"item:{i}\n")
    with resp.open("wb") as out:
        for start in range(0, n, 1000):
            out.write(
                hiredis.pack_command(
                    ("CF.INSERT", "ref", "ITEMS", *[f"item:{i}" for i in range(start, min(n, start + 1000))])
                )
            )
    return csv, resp


def measure(client: redis.Redis, pid: int, command: list[str], stdin: Path | None = None) -> dict:
    client.flushall()
    client.slowlog_reset()
    before = cpu_seconds(pid)
    seconds, rss, _out = run_child(command, stdin=stdin)
    return {"seconds": seconds, "cpu": cpu_seconds(pid) - before, "slowest": slowest_command(client), "rss": rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=2_000_000)
    parser.add_argument("--module-free-items", type=int, default=300_000)
    parser.add_argument("--module", default=os.environ.get("BLOOMCTL_TEST_REDISBLOOM_MODULE"))
    parser.add_argument("--redis-server", default=os.environ.get("BLOOMCTL_TEST_REDIS_SERVER", "redis-server"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not args.module:
        parser.error("needs --module (or BLOOMCTL_TEST_REDISBLOOM_MODULE): the reference runs on CF.*")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        csv, resp = write_sources(workdir, args.items, "big")
        small_csv, _ = write_sources(workdir, args.module_free_items, "small")
        proc, port = start_server(args.module, workdir, args.redis_server)
        client = redis.Redis(port=port)
        client.config_set("slowlog-log-slower-than", SLOWLOG_MICROS)
        client.config_set("slowlog-max-len", 100_000)
        url = f"redis://127.0.0.1:{port}/0"
        bloomctl = [sys.executable, "-m", "bloomctl", "--url", url, "-q", "rebuild", "k", "--swap", "--format", "json"]
        runs = {
            "(a) redis-cli --pipe, CF.INSERT x1000": (args.items, None),
            "(b) rebuild --type cuckoo (CF.*)": (args.items, [*bloomctl, "--type", "cuckoo", "--from-csv", str(csv)]),
            "(c) rebuild --type cuckoo, module-free": (
                args.module_free_items,
                [*bloomctl, "--type", "cuckoo", "--backend", "module-free", "--from-csv", str(small_csv)],
            ),
            "(d) rebuild, Bloom filter, server path": (
                args.items,
                [*bloomctl, "--from-csv", str(csv), "-e", "1%", "--build", "server"],
            ),
        }
        results: dict[str, list[dict]] = {label: [] for label in runs}
        try:
            for round_ in range(args.rounds):
                for label, (items, command) in runs.items():
                    if command is None:
                        client.flushall()
                        client.execute_command("CF.RESERVE", "ref", 4 * items, "BUCKETSIZE", 2)
                        row = measure_pipe(client, proc.pid, port, resp, items)
                    else:
                        row = measure(client, proc.pid, command)
                    row["items"] = items
                    results[label].append(row)
                    print(f"  round {round_ + 1}: {label}: {row['seconds']:.2f} s", file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait()
    print_table(results)


def measure_pipe(client: redis.Redis, pid: int, port: int, resp: Path, items: int) -> dict:
    client.slowlog_reset()
    before = cpu_seconds(pid)
    seconds, rss, out = run_child(["redis-cli", "-p", str(port), "--pipe"], stdin=resp)
    if b"errors: 0" not in out:
        raise RuntimeError(out.decode(errors="replace"))
    return {"seconds": seconds, "cpu": cpu_seconds(pid) - before, "slowest": slowest_command(client), "rss": rss}


def print_table(results: dict[str, list[dict]]) -> None:
    reference = [row["items"] / row["seconds"] for row in next(iter(results.values()))]
    print(
        "| run | distinct items | seconds | items/s | ratio to (a) | server CPU s | slowest command | client RSS MiB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, rows in results.items():
        ratios = [row["items"] / row["seconds"] / ref for row, ref in zip(rows, reference, strict=True)]
        seconds = statistics.median(row["seconds"] for row in rows)
        slows = [row["slowest"] for row in rows if row["slowest"]]
        slow = (
            f"{max(slows, key=lambda s: s[1])[0]} {max(s[1] for s in slows) / 1000:.1f} ms" if slows else "none > 1 ms"
        )
        rss = max((row["rss"] or 0) for row in rows) / 2**20
        print(
            f"| {label} | {rows[0]['items']:,} | {seconds:.2f} | {rows[0]['items'] / seconds:,.0f} | "
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | "
            f"{statistics.median(row['cpu'] for row in rows):.2f} | {slow} | {rss:.0f} |"
        )


if __name__ == "__main__":
    main()
