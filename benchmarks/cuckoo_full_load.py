"""Where a cuckoo filter's inserts start to fail, and its false-positive rate there, on a real server.

    python benchmarks/cuckoo_full_load.py [--engine redisbloom|lua] [--module /path/redisbloom.so]
        [--redis-server PATH] [--slots 65536,1048576] [--bucket-sizes 2,4] [--iterations 20,500]
        [--fingerprint-bits 8,16] [--seeds 3] [--lookups 100000]

Starts its own redis-server on a free loopback port, then for every combination reserves a
never-growing filter (RedisBloom's CF.RESERVE ... EXPANSION 0, or bloomctl's module-free one),
inserts distinct items until the first insert fails, and looks up absent ones. Prints, per row,
the load at the first failure (lowest-highest over the seeds), the planner's full load (the lower
bound bloomctl plans and judges with; it must not be above the lowest measured), the
false-positive rate measured, and the one the planner's formula gives at that load. The figures
in docs/cuckoo.md come from runs of this script (and of its first version, in that page's note).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks._common import start_server
from bloomctl.backends.library import Library, functions_source
from bloomctl.sizing.cuckoo import full_load, lookup_fpr, next_power_of_two

BATCH = 1000


def numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def reserve(client: redis.Redis, engine: str, slots: int, bucket_size: int, iterations: int, bits: int) -> int:
    """A never-growing filter of about ``slots`` slots; returns its real slots."""
    buckets = max(next_power_of_two(slots // bucket_size), 1)
    client.delete("c")
    if engine == "redisbloom":
        client.execute_command(
            "CF.RESERVE", "c", buckets * bucket_size, "BUCKETSIZE", bucket_size, "MAXITERATIONS", iterations,
            "EXPANSION", 0,
        )  # fmt: skip
    else:
        client.execute_command(
            "FCALL",
            "bloomctl_cf_reserve",
            1,
            "c",
            buckets,
            bucket_size,
            bits // 8,
            iterations,
            buckets * bucket_size,
            0.01,
        )
    return buckets * bucket_size


def insert(client: redis.Redis, engine: str, items: list[bytes]) -> list[int]:
    if engine == "redisbloom":
        return client.execute_command("CF.INSERT", "c", "NOCREATE", "ITEMS", *items)
    return client.execute_command("FCALL", "bloomctl_cf_madd", 1, "c", *items)


def lookup(client: redis.Redis, engine: str, items: list[bytes]) -> int:
    if engine == "redisbloom":
        return sum(client.execute_command("CF.MEXISTS", "c", *items))
    return sum(client.execute_command("FCALL_RO", "bloomctl_cf_mexists", 1, "c", *items))


def first_failure(client: redis.Redis, engine: str, seed: int) -> int:
    inserted = 0
    while True:
        reply = insert(client, engine, [b"in:%d:%d" % (seed, inserted + j) for j in range(BATCH)])
        failed = [j for j, flag in enumerate(reply) if flag != 1]
        if failed:
            return inserted + failed[0]
        inserted += BATCH


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["redisbloom", "lua"], default="lua")
    parser.add_argument("--module", default=os.environ.get("BLOOMCTL_TEST_REDISBLOOM_MODULE"))
    parser.add_argument("--redis-server", default=os.environ.get("BLOOMCTL_TEST_REDIS_SERVER", "redis-server"))
    parser.add_argument("--slots", default="65536,1048576")
    parser.add_argument("--bucket-sizes", default="2,4")
    parser.add_argument("--iterations", default="20,500")
    parser.add_argument("--fingerprint-bits", default="8,16", help="the module-free engine's (RedisBloom's are 8)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--lookups", type=int, default=100_000)
    args = parser.parse_args()
    if args.engine == "redisbloom" and not args.module:
        parser.error("--engine redisbloom needs --module (or BLOOMCTL_TEST_REDISBLOOM_MODULE)")
    bits_choices = numbers(args.fingerprint_bits) if args.engine == "lua" else [8]
    with tempfile.TemporaryDirectory() as workdir:
        proc, port = start_server(args.module if args.engine == "redisbloom" else None, workdir, args.redis_server)
        try:
            client = redis.Redis(port=port, protocol=2)
            if args.engine == "lua":
                client.execute_command("FUNCTION LOAD", "REPLACE", functions_source())
                Library().ensure(client)
            print(f"server: {client.info('server')['redis_version']} ({args.redis_server}), engine {args.engine}")
            print(
                "| slots | bucket size | max iterations | fingerprint bits | load at the first failure | planner's full load | FPR measured | FPR the formula gives |"
            )
            print("| --- | --- | --- | --- | --- | --- | --- | --- |")
            combos = itertools.product(
                numbers(args.slots), numbers(args.bucket_sizes), numbers(args.iterations), bits_choices
            )
            for slots, bucket_size, iterations, bits in combos:
                loads, fprs, predicted = [], [], []
                for seed in range(args.seeds):
                    real = reserve(client, args.engine, slots, bucket_size, iterations, bits)
                    loads.append(first_failure(client, args.engine, seed) / real)
                    absent = [b"out:%d:%d" % (seed, i) for i in range(args.lookups)]
                    hits = sum(lookup(client, args.engine, absent[i : i + BATCH]) for i in range(0, len(absent), BATCH))
                    fprs.append(hits / args.lookups)
                    predicted.append(lookup_fpr(loads[-1], bucket_size, bits))
                planned = full_load(bucket_size, iterations, args.engine)
                flag = "" if planned <= min(loads) else " (above the lowest measured!)"
                print(
                    f"| {real:,} | {bucket_size} | {iterations} | {bits} | {min(loads):.3f}-{max(loads):.3f} | "
                    f"{planned:.2f}{flag} | {min(fprs):.4%}-{max(fprs):.4%} | {min(predicted):.4%}-{max(predicted):.4%} |",
                    flush=True,
                )
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
