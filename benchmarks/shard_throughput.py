"""Sharded rebuild throughput: 1, 2 and 3 shards on a 3-master cluster against a single node, in one run.

    python benchmarks/shard_throughput.py [--items 2000000] [--module /path/redisbloom.so]

Starts a standalone redis-server and a 3-master Redis Cluster on loopback (with RedisBloom when a
module is given, else the bitmap backend and fewer items), writes N distinct keys to a CSV, and times
`bloomctl rebuild --from-csv ... --swap` on each (the whole command, and the load phase alone from
its JSON summary). All servers and the client share this machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks._common import start_server
from tests.servers import RedisCluster


def rebuild(url: str, key: str, csv_path: Path, n: int, backend: str, shards: int | None) -> tuple[float, dict]:
    args = [
        sys.executable,
        "-m",
        "bloomctl",
        "--url",
        url,
        "rebuild",
        key,
        "--from-csv",
        str(csv_path),
        "-c",
        str(2 * n),
        "-e",
        "1%",
        "--swap",
        "--quiet",
        "--format",
        "json",
        "--backend",
        backend,
    ]
    if backend == "bitmap":
        args.append("--nonscaling")
    if shards:
        args += ["--shards", str(shards)]
    start = time.perf_counter()
    out = subprocess.run(args, capture_output=True, check=True)
    return time.perf_counter() - start, json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--items", type=int, default=None, help="default 2M with RedisBloom, 300k on the bitmap backend"
    )
    parser.add_argument("--module", default=os.environ.get("BLOOMCTL_TEST_REDISBLOOM_MODULE"))
    args = parser.parse_args()
    backend = "redisbloom" if args.module else "bitmap"
    n = args.items or (2_000_000 if args.module else 300_000)
    workdir = Path(tempfile.mkdtemp(prefix="bloomctl-shards-"))
    csv_path = workdir / "keys.csv"
    csv_path.write_text("id\n" + "".join(f"user:{i}\n" for i in range(n)))
    single, port = start_server(args.module, workdir)
    cluster = RedisCluster(workdir, masters=3, module=args.module)
    rows = []
    try:
        seconds, summary = rebuild(f"redis://127.0.0.1:{port}/0", "single", csv_path, n, backend, None)
        rows.append(("single node, one filter", seconds, summary))
        for shards in (1, 2, 3):
            seconds, summary = rebuild(cluster.url, f"sharded{shards}", csv_path, n, backend, shards)
            rows.append((f"3-master cluster, {shards} shard{'s' if shards > 1 else ''}", seconds, summary))
    finally:
        single.terminate()
        single.wait()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    base = n / rows[0][1]
    print(f"{n:,} items, {backend} backend, {os.cpu_count()} cores shared by the client and every server\n")
    print(f"{'run':<34} {'whole items/s':>14} {'x single':>9} {'load items/s':>13}")
    for label, seconds, summary in rows:
        print(f"{label:<34} {n / seconds:>14,.0f} {n / seconds / base:>9.2f} {summary['items_per_second']:>13,}")


if __name__ == "__main__":
    main()
