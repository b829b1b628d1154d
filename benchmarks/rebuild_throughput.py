"""rebuild throughput against what the server can absorb, in one run on one local redis-server.

    python benchmarks/rebuild_throughput.py [--items 2000000] [--module /path/redisbloom.so]
        [--bitmap-items 500000] [--rss-items 10000000] [--pg-url postgresql://postgres@127.0.0.1/test]

Writes N distinct keys ("user:<i>") to a CSV in a temporary directory, starts its own redis-server
(with RedisBloom from --module or BLOOMCTL_TEST_REDISBLOOM_MODULE) on a free loopback port, and
measures, one after the other against the same server:

  (a) redis-cli --pipe fed pre-encoded BF.MADD commands (the reference: the server's own limit)
  (b) bloomctl rebuild --from-csv, a subprocess (the whole command: read, load, verify, swap)
  (c) a plain redis-py pipeline of BF.MADD over csv.reader
  (d) per-item BF.ADD in a redis-py pipeline (the seed articles' way)

then (b) on the module-free bitmap backend, the peak RSS of a --rss-items rebuild, and a
PostgreSQL source (when --pg-url reaches a server). Items/s and ratios to (a) are printed.
"""

from __future__ import annotations

import argparse
import csv
import json
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

BATCH = 5000  # bloomctl rebuild's default --batch-size, used by every run here
WINDOW = 4


def write_csv(path: Path, n: int) -> None:
    with path.open("w") as f:
        f.write("user_id\n")
        for start in range(0, n, 100_000):
            f.write("".join(f"user:{i}\n" for i in range(start, min(start + 100_000, n))))


def run_bloomctl(args: list[str], url: str, env: dict | None = None) -> tuple[float, int, dict]:
    """Wall seconds, peak RSS in bytes and the JSON summary of one bloomctl subprocess.

    The child is reaped with wait4, whose rusage is that one process's own peak RSS.
    """
    command = [sys.executable, "-m", "bloomctl", "--url", url, *args, "--quiet", "--format", "json"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, env={**os.environ, **(env or {})})
        _pid, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"bloomctl failed ({proc.returncode}): {err.read().decode()}")
        return elapsed, usage.ru_maxrss * 1024, json.loads(out.read())  # ru_maxrss is in KiB on Linux


def reference_pipe(port: int, path: Path, key: bytes, workdir: Path) -> float:
    """(a): pre-encode BF.MADD batches to a file (untimed), then time redis-cli --pipe on it."""
    resp = workdir / "madd.resp"
    with path.open() as f, resp.open("wb") as out:
        next(f)
        batch: list[bytes] = []
        for line in f:
            batch.append(line.rstrip("\n").encode())
            if len(batch) == BATCH:
                out.write(hiredis.pack_command(("BF.MADD", key, *batch)))
                batch = []
        if batch:
            out.write(hiredis.pack_command(("BF.MADD", key, *batch)))
    start = time.perf_counter()
    with resp.open("rb") as f:
        result = subprocess.run(["redis-cli", "-p", str(port), "--pipe"], stdin=f, capture_output=True, check=True)
    elapsed = time.perf_counter() - start
    if b"errors: 0" not in result.stdout:
        raise RuntimeError(result.stdout.decode(errors="replace"))
    resp.unlink()
    return elapsed


def redis_py_pipeline(port: int, path: Path, key: str) -> float:
    """(c): csv.reader and a redis-py pipeline of BF.MADD, WINDOW batches per round trip."""
    client = redis.Redis(port=port)
    start = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    with path.open(newline="") as f:
        reader = csv.reader(f)
        next(reader)
        batch: list[str] = []
        queued = 0
        for row in reader:
            batch.append(row[0])
            if len(batch) == BATCH:
                pipe.execute_command("BF.MADD", key, *batch)
                batch, queued = [], queued + 1
                if queued == WINDOW:
                    pipe.execute()
                    queued = 0
        if batch:
            pipe.execute_command("BF.MADD", key, *batch)
        pipe.execute()
    return time.perf_counter() - start


def per_item_add(port: int, path: Path, key: str) -> float:
    """(d): one BF.ADD per item, BATCH commands per pipeline round trip."""
    client = redis.Redis(port=port)
    start = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    with path.open(newline="") as f:
        reader = csv.reader(f)
        next(reader)
        for i, row in enumerate(reader, 1):
            pipe.execute_command("BF.ADD", key, row[0])
            if i % BATCH == 0:
                pipe.execute()
        pipe.execute()
    return time.perf_counter() - start


def postgres_rows(pg_url: str, n: int) -> str | None:
    """A table of n rows in PostgreSQL, or None when the server is not there."""
    try:
        import sqlalchemy
    except ImportError:
        return None
    table = f"bloomctl_bench_{os.getpid()}"
    engine = sqlalchemy.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, email TEXT)"))
            conn.execute(
                sqlalchemy.text(f"INSERT INTO {table} SELECT g, 'user:' || g FROM generate_series(1, {int(n)}) g")
            )
    except Exception as exc:
        print(f"(PostgreSQL row skipped: {str(exc).splitlines()[0]})", file=sys.stderr)
        return None
    finally:
        engine.dispose()
    return table


def drop_postgres(pg_url: str, table: str) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(f"DROP TABLE IF EXISTS {table}"))
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=2_000_000)
    parser.add_argument("--bitmap-items", type=int, default=500_000)
    parser.add_argument("--rss-items", type=int, default=10_000_000, help="0 skips the RSS run")
    parser.add_argument("--module", default=os.environ.get("BLOOMCTL_TEST_REDISBLOOM_MODULE"))
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test", help="'' skips the SQL row")
    args = parser.parse_args()
    if not args.module:
        sys.exit("needs RedisBloom: --module /path/to/redisbloom.so (or BLOOMCTL_TEST_REDISBLOOM_MODULE)")
    for tool in ("redis-server", "redis-cli"):
        if not shutil.which(tool):
            sys.exit(f"needs {tool} on PATH")

    workdir = Path(tempfile.mkdtemp(prefix="bloomctl-bench-"))
    n = args.items
    csv_path = workdir / "keys.csv"
    write_csv(csv_path, n)
    proc, port = start_server(args.module, workdir)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis(port=port)
    rows: list[tuple[str, int, float, str]] = []
    try:

        def fresh(key: str) -> None:
            client.delete(key)
            client.execute_command("BF.RESERVE", key, "0.01", 2 * n)

        fresh("ref")
        reference = n / reference_pipe(port, csv_path, b"ref", workdir)
        client.delete("ref")
        rows.append(("(a) redis-cli --pipe, pre-encoded BF.MADD", n, reference, ""))

        seconds, rss, summary = run_bloomctl(
            ["rebuild", "users", "--from-csv", str(csv_path), "-c", str(2 * n), "-e", "1%", "--swap"], url
        )
        rows.append(
            (
                "(b) bloomctl rebuild --from-csv (whole command)",
                n,
                n / seconds,
                f"peak RSS {rss / 2**20:.0f} MiB; load alone {summary['items_per_second']:,}/s",
            )
        )
        client.delete("users")

        fresh("pipe")
        rows.append(
            ("(c) redis-py pipeline of BF.MADD, csv.reader", n, n / redis_py_pipeline(port, csv_path, "pipe"), "")
        )
        client.delete("pipe")
        fresh("adds")
        rows.append(("(d) per-item BF.ADD, pipelined", n, n / per_item_add(port, csv_path, "adds"), ""))
        client.delete("adds")

        if args.bitmap_items:
            bitmap_csv = workdir / "bitmap.csv"
            write_csv(bitmap_csv, args.bitmap_items)
            seconds, rss, summary = run_bloomctl(
                [
                    "rebuild",
                    "bm",
                    "--from-csv",
                    str(bitmap_csv),
                    "-c",
                    str(2 * args.bitmap_items),
                    "-e",
                    "1%",
                    "--backend",
                    "bitmap",
                    "--swap",
                ],
                url,
            )
            rows.append(
                (
                    "(b) on the bitmap backend (module-free)",
                    args.bitmap_items,
                    args.bitmap_items / seconds,
                    f"peak RSS {rss / 2**20:.0f} MiB; load alone {summary['items_per_second']:,}/s",
                )
            )
            client.delete("bm")
            bitmap_csv.unlink()

        if args.rss_items:
            big_csv = workdir / "big.csv"
            write_csv(big_csv, args.rss_items)
            seconds, rss, summary = run_bloomctl(
                ["rebuild", "big", "--from-csv", str(big_csv), "-c", str(2 * args.rss_items), "-e", "1%", "--swap"], url
            )
            rows.append(
                (
                    f"(b) {args.rss_items:,}-row rebuild",
                    args.rss_items,
                    args.rss_items / seconds,
                    f"peak RSS {rss / 2**20:.0f} MiB",
                )
            )
            client.delete("big")
            big_csv.unlink()

        if args.pg_url and (table := postgres_rows(args.pg_url, n)):
            try:
                seconds, rss, summary = run_bloomctl(
                    [
                        "rebuild",
                        "pg",
                        "--from-sql",
                        f"SELECT email FROM {table}",
                        "-c",
                        str(2 * n),
                        "-e",
                        "1%",
                        "--swap",
                    ],
                    url,
                    env={"BLOOMCTL_DB_URL": args.pg_url},
                )
                rows.append(
                    (
                        "(b) bloomctl rebuild --from-sql (PostgreSQL)",
                        n,
                        n / seconds,
                        f"peak RSS {rss / 2**20:.0f} MiB; rows/s of the whole command",
                    )
                )
            finally:
                drop_postgres(args.pg_url, table)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"one redis-server with RedisBloom on loopback, batches of {BATCH}, {os.cpu_count()} cores\n")
    print(f"{'run':<50} {'items':>11} {'items/s':>11} {'x (a)':>7}  notes")
    for label, count, rate, note in rows:
        print(f"{label:<50} {count:>11,} {rate:>11,.0f} {rate / reference:>7.2f}  {note}")


if __name__ == "__main__":
    main()
