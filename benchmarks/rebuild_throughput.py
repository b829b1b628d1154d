"""What a rebuild costs, and what it costs the server, in one run on one local redis-server.

    python benchmarks/rebuild_throughput.py --module /path/redisbloom.so [--redis-server PATH]
        [--items 5000000] [--bitmap-items 1000000] [--pg-url postgresql://postgres@127.0.0.1/test]

Writes N distinct emails as a realistic 3-column export (id, email, a quoted note with commas and
escaped quotes), as a one-column CSV and as Parquet, loads them into a PostgreSQL table when
--pg-url reaches one, starts its own redis-server (RedisBloom from --module) on a free loopback
port, and measures one after the other against that server, a filter of capacity 2N at 1%:

  (a) redis-cli --pipe fed pre-encoded BF.MADD x1000 (the reference: the server's own limit)
  (b) bloomctl rebuild --swap, the whole command: the 3-column CSV (--column email, the middle
      one) built in the client and on the server, the one-column CSV, Parquet, PostgreSQL (with
      psql's \\copy of the same query to /dev/null as that source's ceiling)
  (c) the module-free bitmap backend on --bitmap-items items: server path, then client path
  (d) --jobs 2 on the 3-column CSV and on Parquet (each job its own row groups)
  (e) the fixed cost: a 1k-item rebuild against `bloomctl --help`

For each run: seconds, items/s, the ratio to (a), the redis-server's CPU seconds during the run
(/proc/<pid>/stat), the slowest command in SLOWLOG (everything over 1 ms is logged; none means
every command ran under 1 ms) and the client's peak RSS (wait4).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hiredis
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks._common import cpu_seconds, slowest_command, start_server

MADD = 1000  # items per pre-encoded BF.MADD of the reference
SLOWLOG_MICROS = 1000


@dataclass
class Row:
    label: str
    items: int
    seconds: float
    server_cpu: float | None = None
    slowest: tuple[str, int] | None = None
    rss: int | None = None
    note: str = ""
    ratio: float = 0.0  # items/s over (a)'s, in the same round
    versus: float | None = None  # over the row it is compared with (psql, the bitmap server path)
    versus_label: str = ""


def email(i: int) -> str:
    return f"user{i}@example.com"


def write_sources(workdir: Path, n: int) -> tuple[Path, Path, Path | None]:
    """The 3-column export, the one-column CSV and (with pyarrow) a Parquet file of the same emails."""
    export, single = workdir / "export.csv", workdir / "emails.csv"
    with export.open("w") as three, single.open("w") as one:
        three.write("id,email,notes\n")
        one.write("email\n")
        for start in range(0, n, 100_000):
            rows = range(start, min(start + 100_000, n))
            three.write("".join(f'{i},{email(i)},"order {i}, said ""hi"", paid"\n' for i in rows))
            one.write("".join(f"{email(i)}\n" for i in rows))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return export, single, None
    parquet = workdir / "emails.parquet"
    with pq.ParquetWriter(parquet, pa.schema([("email", pa.string())])) as writer:
        for start in range(0, n, 1_000_000):
            column = pa.array([email(i) for i in range(start, min(start + 1_000_000, n))])
            writer.write_table(pa.table({"email": column}))
    return export, single, parquet


def encode_reference(workdir: Path, n: int, key: bytes) -> Path:
    resp = workdir / "madd.resp"
    with resp.open("wb") as out:
        for start in range(0, n, MADD):
            command: tuple[Any, ...] = (
                "BF.MADD",
                key,
                *(email(i).encode() for i in range(start, min(start + MADD, n))),
            )
            out.write(hiredis.pack_command(command))
    return resp


def run_child(
    command: list[str], env: dict | None = None, stdin: Path | None = None
) -> tuple[float, int | None, bytes]:
    """Wall seconds, peak RSS in bytes (None without GNU time) and stdout of one subprocess.

    GNU time measures the peak: a child's own wait4 rusage would start from this (large) process's
    RSS, which the kernel counts at the child's exec.
    """
    timer = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        peak = Path(tmp, "peak")
        wrapped = [timer, "-f", "%M", "-o", str(peak), *command] if timer else command
        with stdin.open("rb") if stdin else open(os.devnull, "rb") as source:
            start = time.perf_counter()
            code = subprocess.call(wrapped, stdin=source, stdout=out, stderr=err, env={**os.environ, **(env or {})})
            elapsed = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        if code != 0:
            raise RuntimeError(f"{command[0]} failed: {err.read().decode(errors='replace')}")
        rss = int(peak.read_text().split()[-1]) * 1024 if timer else None  # %M is in KiB
        return elapsed, rss, out.read()


class Bench:
    def __init__(self, proc: subprocess.Popen, port: int, n: int) -> None:
        self.proc, self.port, self.n = proc, port, n
        self.url = f"redis://127.0.0.1:{port}/0"
        self.client = redis.Redis(port=port)
        self.client.config_set("slowlog-log-slower-than", SLOWLOG_MICROS)
        self.client.config_set("slowlog-max-len", 100_000)
        self.rows: dict[str, list[Row]] = {}

    def measure(self, label: str, items: int, run: Callable[[], tuple[float, int | None, str]]) -> Row:
        self.client.flushall()
        self.client.slowlog_reset()
        before = cpu_seconds(self.proc.pid)
        seconds, rss, note = run()
        row = Row(label, items, seconds, cpu_seconds(self.proc.pid) - before, slowest_command(self.client), rss, note)
        self.rows.setdefault(label, []).append(row)
        print(f"  {label}: {seconds:.2f} s", file=sys.stderr)
        return row

    def bloomctl(self, args: list[str], env: dict | None = None) -> tuple[float, int | None, str]:
        command = [sys.executable, "-m", "bloomctl", "--url", self.url, "rebuild", "users", *args]
        command += ["-c", str(2 * self.n), "-e", "1%", "--swap", "--quiet", "--format", "json"]
        seconds, rss, out = run_child(command, env)
        summary = json.loads(out)
        note = f"built in the {summary.get('build', '?')}"
        if summary.get("build_note"):
            note += f" ({summary['build_note']})"
        return seconds, rss, note

    def pipe(self, resp: Path) -> tuple[float, int | None, str]:
        self.client.execute_command("BF.RESERVE", "ref", "0.01", 2 * self.n)
        seconds, rss, out = run_child(["redis-cli", "-p", str(self.port), "--pipe"], stdin=resp)
        if b"errors: 0" not in out:
            raise RuntimeError(out.decode(errors="replace"))
        return seconds, rss, "redis-cli's RSS"


def postgres_table(pg_url: str, export: Path) -> str | None:
    """The 3-column export as a PostgreSQL table (loaded with psql \\copy), or None without a server."""
    table = f"bloomctl_bench_{os.getpid()}"
    load = f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, email TEXT, notes TEXT);"
    load += f"\\copy {table} FROM '{export}' CSV HEADER"
    result = subprocess.run(["psql", pg_url, "-q", "-v", "ON_ERROR_STOP=1"], input=load, text=True, capture_output=True)
    if result.returncode != 0:
        print(f"(PostgreSQL rows skipped: {result.stderr.strip().splitlines()[-1:]})", file=sys.stderr)
        return None
    return table


def drop_table(pg_url: str, table: str) -> None:
    subprocess.run(["psql", pg_url, "-q", "-c", f"DROP TABLE IF EXISTS {table}"], check=False, capture_output=True)


def psql_ceiling(pg_url: str, query: str) -> tuple[float, int | None, str]:
    seconds, rss, _ = run_child(["psql", pg_url, "-q", "-c", f"\\copy ({query}) TO '/dev/null'"])
    return seconds, rss, "the source alone: psql's RSS"


def fmt_rows(rows: list[Row]) -> str:
    """One table row: medians over the rounds (the ratios' range too), the worst command, the
    largest RSS."""
    first = rows[0]
    seconds = statistics.median(row.seconds for row in rows)
    ratios = [row.ratio for row in rows]
    ratio = f"{statistics.median(ratios):.2f}" + (f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(rows) > 1 else "")
    cpus = [row.server_cpu for row in rows if row.server_cpu is not None]
    cpu = f"{statistics.median(cpus):.2f}" if cpus else "-"
    slows = [row.slowest for row in rows if row.slowest is not None]
    if slows:
        name, micros = max(slows, key=lambda slow: slow[1])
        slow = f"{name} {micros / 1000:.1f} ms"
    else:
        slow = f"none > {SLOWLOG_MICROS // 1000} ms" if cpus else "-"
    rsses = [row.rss for row in rows if row.rss is not None]
    rss = f"{max(rsses) / 2**20:.0f}" if rsses else "-"
    note = first.note
    versus = [row.versus for row in rows if row.versus is not None]
    if versus:
        label = first.versus_label or ("psql" if "PostgreSQL" in first.label else "the server path")
        note += f"; {statistics.median(versus):.2f}x {label}"
    cells = [first.label, f"{first.items:,}", f"{seconds:.2f}", f"{first.items / seconds:,.0f}", ratio]
    return "| " + " | ".join([*cells, cpu, slow, rss, note]) + " |"


def one_round(
    bench: Bench, args: argparse.Namespace, sources: tuple[Path, Path, Path | None], resp: Path, table: str | None
) -> None:
    n = bench.n
    export, single, parquet = sources
    reference = bench.measure("(a) `redis-cli --pipe`, pre-encoded `BF.MADD` x1000", n, lambda: bench.pipe(resp))
    measured = [reference]
    three = ["--from-csv", str(export), "--column", "email"]
    measured.append(bench.measure("(b) 3-column quoted CSV, `--column email`", n, lambda: bench.bloomctl(three)))
    numpy_env = {"BLOOMCTL_KERNEL": "numpy"}
    native = bench.measure("(b) same, numpy kernel", n, lambda: bench.bloomctl(three, numpy_env))
    measured[-1].versus_label, measured[-1].versus = "the numpy kernel", native.seconds / measured[-1].seconds
    measured.append(native)
    measured.append(
        bench.measure("(b) same, `--build server`", n, lambda: bench.bloomctl([*three, "--build", "server"]))
    )
    measured.append(bench.measure("(b) one-column CSV", n, lambda: bench.bloomctl(["--from-csv", str(single)])))
    if parquet:
        one_job = bench.measure("(b) Parquet", n, lambda: bench.bloomctl(["--from-parquet", str(parquet)]))
        two_jobs = bench.measure(
            "(d) Parquet, `--jobs 2`", n, lambda: bench.bloomctl(["--from-parquet", str(parquet), "--jobs", "2"])
        )
        two_jobs.versus_label, two_jobs.versus = "`--jobs 1`", one_job.seconds / two_jobs.seconds
        measured += [one_job, two_jobs]
    if table:
        query = f"SELECT email FROM {table}"
        env = {"BLOOMCTL_DB_URL": args.pg_url}
        ceiling = bench.measure(
            "(b) ceiling: `psql \\copy` of the query to /dev/null", n, lambda: psql_ceiling(args.pg_url, query)
        )
        ceiling.server_cpu = ceiling.slowest = None
        row = bench.measure("(b) PostgreSQL `--from-sql`", n, lambda: bench.bloomctl(["--from-sql", query], env))
        row.versus = ceiling.seconds / row.seconds
        measured += [ceiling, row]
    if args.bitmap_items:
        m = bench.n = args.bitmap_items
        head = single.with_name("bitmap.csv")
        if not head.exists():
            with single.open() as f, head.open("w") as out:
                out.writelines(itertools.islice(f, m + 1))
        bitmap = ["--from-csv", str(head), "--backend", "bitmap"]
        slow = bench.measure(
            "(c) bitmap backend, `--build server`", m, lambda: bench.bloomctl([*bitmap, "--build", "server"])
        )
        fast = bench.measure(
            "(c) bitmap backend, `--build client`", m, lambda: bench.bloomctl([*bitmap, "--build", "client"])
        )
        fast.versus = slow.seconds / fast.seconds
        measured += [slow, fast]
        bench.n = n
    measured.append(bench.measure("(d) 3-column CSV, `--jobs 2`", n, lambda: bench.bloomctl([*three, "--jobs", "2"])))
    small = single.with_name("small.csv")
    if not small.exists():
        with single.open() as f, small.open("w") as out:
            out.writelines(itertools.islice(f, 1001))
    bench.n = 1000
    help_row = bench.measure(
        "(e) `bloomctl --help`", 1, lambda: (*run_child([sys.executable, "-m", "bloomctl", "--help"])[:2], "")
    )
    tiny = bench.measure(
        "(e) 1k-item rebuild, one-column CSV", 1000, lambda: bench.bloomctl(["--from-csv", str(small)])
    )
    tiny.versus_label, tiny.versus = "(e) --help: the fixed cost is the difference", help_row.seconds / tiny.seconds
    bench.n = n
    for row in measured:
        row.ratio = (row.items / row.seconds) / (reference.items / reference.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=5_000_000)
    parser.add_argument("--bitmap-items", type=int, default=1_000_000, help="0 skips (c)")
    parser.add_argument("--module", default=os.environ.get("BLOOMCTL_TEST_REDISBLOOM_MODULE"))
    parser.add_argument("--redis-server", default=os.environ.get("BLOOMCTL_TEST_REDIS_SERVER", "redis-server"))
    parser.add_argument("--rounds", type=int, default=3, help="every run this many times, interleaved")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test", help="'' skips PostgreSQL")
    args = parser.parse_args()
    if not args.module:
        sys.exit("needs RedisBloom: --module /path/to/redisbloom.so (or BLOOMCTL_TEST_REDISBLOOM_MODULE)")
    for tool in (args.redis_server, "redis-cli"):
        if not shutil.which(tool):
            sys.exit(f"needs {tool}")
    n = args.items
    workdir = Path(tempfile.mkdtemp(prefix="bloomctl-bench-"))
    print("writing the sources ...", file=sys.stderr)
    sources = write_sources(workdir, n)
    resp = encode_reference(workdir, n, b"ref")
    table = postgres_table(args.pg_url, sources[0]) if args.pg_url and shutil.which("psql") else None
    proc, port = start_server(args.module, workdir, args.redis_server)
    bench = Bench(proc, port, n)
    try:
        server = bench.client.info("server")["redis_version"]
        module = next(m for m in bench.client.module_list() if m[b"name"] == b"bf")[b"ver"]
        for number in range(args.rounds):
            print(f"round {number + 1} of {args.rounds}", file=sys.stderr)
            one_round(bench, args, sources, resp, table)
    finally:
        proc.terminate()
        proc.wait()
        if table:
            drop_table(args.pg_url, table)
        shutil.rmtree(workdir, ignore_errors=True)

    reference = bench.rows[next(iter(bench.rows))]
    cpu = statistics.median(row.server_cpu or 0.0 for row in reference)
    print(f"\nRedis {server}, RedisBloom {module}, loopback, {os.cpu_count()} cores; capacity {2 * n:,}, 1%;", end=" ")
    print(f"medians of {args.rounds} rounds (the range of x (a) in brackets)\n")
    print("| run | items | s | items/s | x (a) | server CPU s | slowest command | client peak RSS MiB | notes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |")
    for rows in bench.rows.values():
        print(fmt_rows(rows))
    print(f"\n(a)'s server CPU: {cpu:.2f} s; 10% of it is {cpu / 10:.2f} s")


if __name__ == "__main__":
    main()
