"""How far below its sub-filter's fill an honest filter's emptiest 4 KiB stretch of bits lies.

    python benchmarks/honest_stretches.py [--backend redisbloom|bitmap] [--module /path/redisbloom.so]
        [--redis-server PATH] [--seeds 2]

A restore refuses a stretch more than 8 standard deviations (plus 16 bits) emptier than its
sub-filter's fill (bloomctl/transfer/scratch.py): a region zeroed with the count lowered to match
would otherwise pass. This script starts its own redis-server on a free loopback port, fills
filters of 10,000 to 1,000,000 items at 1% and 0.1% to 0.5, 1 and 3 times their capacity (the
RedisBloom ones may grow), dumps each, and prints the sub-filters and stretches seen and the
five worst (sd below the fill). The figures in docs/dump-format.md come from a run of it.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks._common import start_server
from bloomctl import backends
from bloomctl.backends.chunks import chunk_start
from bloomctl.lifecycle.front import reserve
from bloomctl.server.capabilities import detect
from bloomctl.sizing.bloom import plan
from bloomctl.transfer.dump import read_filter
from bloomctl.transfer.scratch import WINDOW_BYTES, popcount, sparsest_window


def sub_filter_bits(client: redis.Redis, key: str, backend: str) -> list[bytes]:
    """Each sub-filter's bits, as a dump carries them."""
    chunks = list(read_filter(client, detect(client), key).chunks)
    if backend == "bitmap":
        return [b"".join(chunk.data for chunk in chunks)[64:]]
    state = backends.get(backend).info(client, key.encode())
    ends = [sum(sub.bytes for sub in state.subfilters[: i + 1]) for i in range(len(state.subfilters))]
    parts: list[list[bytes]] = [[] for _ in ends]
    for chunk in chunks[1:]:
        start = chunk_start(chunk.cursor, len(chunk.data))
        parts[next(i for i, end in enumerate(ends) if start < end)].append(chunk.data)
    return [b"".join(part) for part in parts]


def sds_below(data: bytes) -> float | None:
    """How many standard deviations the emptiest whole stretch lies below the fill of ``data``."""
    sparsest = sparsest_window(data)
    fill = popcount(data) / (len(data) * 8)
    width = WINDOW_BYTES * 8
    spread = math.sqrt(width * fill * (1 - fill))
    return None if sparsest is None or not spread else (width * fill - sparsest[0]) / spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["redisbloom", "bitmap"], default="redisbloom")
    parser.add_argument("--module", help="redisbloom.so (for --backend redisbloom)")
    parser.add_argument("--redis-server", default="redis-server")
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        proc, port = start_server(args.module if args.backend == "redisbloom" else None, workdir, args.redis_server)
        try:
            rows = measure(redis.Redis(port=port), args.backend, args.seeds)
        finally:
            proc.terminate()
            proc.wait()
    rows.sort(reverse=True)
    print(f"{args.backend}: {len(rows)} sub-filters, {sum(row[2] for row in rows):,} stretches of {WINDOW_BYTES} bytes")
    for below, fill, stretches, key in rows[:5]:
        print(f"  {below:.2f} sd below its fill ({fill:.3f}, {stretches} stretches): {key}")


def measure(client: redis.Redis, backend: str, seeds: int) -> list[tuple[float, float, int, str]]:
    rows = []
    server = detect(client)
    for capacity in (10_000, 100_000, 1_000_000):
        for rate in (0.01, 0.001):
            for load in (0.5, 1.0, 3.0):
                for seed in range(seeds):
                    key = f"m:{capacity}:{rate}:{load}:{seed}"
                    reserve(
                        client,
                        server,
                        key,
                        plan(capacity, rate, 2 if backend == "redisbloom" else None),
                        backend=backend,
                    )
                    rng = random.Random(f"{key}")
                    items = [f"{rng.random()}:{i}" for i in range(int(capacity * load))]
                    for start in range(0, len(items), 5000):
                        backends.get(backend).madd(client, key.encode(), items[start : start + 5000])
                    for data in sub_filter_bits(client, key, backend):
                        below = sds_below(data)
                        if below is not None:
                            rows.append((below, popcount(data) / (len(data) * 8), len(data) // WINDOW_BYTES, key))
                    client.delete(key)
    return rows


if __name__ == "__main__":
    main()
