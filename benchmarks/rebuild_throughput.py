"""What a rebuild costs, and what it costs the server, in one run on one local redis-server.

    python benchmarks/rebuild_throughput.py --module /path/redisbloom.so [--redis-server PATH]
        [--items 5000000] [--bitmap-items 1000000] [--pg-url postgresql://postgres@127.0.0.1/test]
        [--only csv,parquet,sql,bitmap,jobs,fixed,dask,spark,engines]

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
  (f) distributed builds with Dask from the Parquet file: `--engine dask` with `--engine-slots`
      1 and 2 (the CLI: Dask's threads in that process), then `bloomctl.distributed.dask.build`
      on a `distributed.LocalCluster` of 1 and 2 worker processes (one thread each), the
      cluster's start ("engine start") timed apart from the build
  (g) Spark: `--engine spark --spark-master local[1]` and `local[2]` (the CLI, the JVM's start
      included), and the creation of a SparkSession alone

For each run: seconds, items/s, the ratio to (a), the redis-server's CPU seconds during the run
(/proc/<pid>/stat), the slowest command in SLOWLOG (everything over 1 ms is logged; none means
every command ran under 1 ms) and the client's peak RSS (wait4: the largest of the command and
the processes it reaped). An engine row is also compared with the one-process (b) Parquet row of
its round (built in the client), 2 workers with 1, and its filter checked against that row's:
the same bits (BF.SCANDUMP), BF.CARD, and a sample of the items found (BF.MEXISTS).

--only runs some groups (and always (a)): csv, parquet, sql, bitmap, jobs, fixed, dask, spark;
engines is dask,spark; an engine group runs (b) Parquet too, its reference.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hiredis
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks._common import cpu_seconds, slowest_command, start_server

MADD = 1000  # items per pre-encoded BF.MADD of the reference
SLOWLOG_MICROS = 1000
GROUPS = ("csv", "parquet", "sql", "bitmap", "jobs", "fixed", "dask", "spark")
CHECK_SAMPLE = 1000  # items of an engine's filter looked up (BF.MEXISTS)
PARQUET = "(b) Parquet"  # the engine rows' reference: one process, built in the client


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
    compare: dict[str, float] = field(default_factory=dict)  # more comparisons: label -> ratio
    check: str = ""  # an engine's filter against the client's


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

    def record(self, label: str, seconds: float, note: str = "") -> Row:
        """A row timed inside another run (an engine's start): no items, no server figures."""
        row = Row(label, 0, seconds, note=note)
        self.rows.setdefault(label, []).append(row)
        print(f"  {label}: {seconds:.2f} s", file=sys.stderr)
        return row

    def filter_state(self, key: str = "users") -> tuple[int, str, int]:
        """The filter's BF.CARD, a digest of its bits (BF.SCANDUMP's chunks after the header, which
        holds the count) and how many of a fixed sample of the items it finds."""
        card = int(self.client.execute_command("BF.CARD", key))
        digest, cursor, first = hashlib.sha256(), 0, True
        while True:
            cursor, chunk = self.client.execute_command("BF.SCANDUMP", key, cursor)
            if cursor == 0:
                break
            if not first:
                digest.update(chunk)
            first = False
        sample = random.Random(7).sample(range(self.n), min(CHECK_SAMPLE, self.n))
        found = sum(self.client.execute_command("BF.MEXISTS", key, *(email(i) for i in sample)))
        return card, digest.hexdigest(), found

    def check(self, row: Row, reference: tuple[int, str, int]) -> None:
        """``row``'s filter (still on the server) against the client build's ``reference``."""
        card, bits, found = self.filter_state()
        wanted = min(CHECK_SAMPLE, self.n)
        parts = ["bits = client's" if bits == reference[1] else "BITS DIFFER from the client's"]
        diff = card - reference[0]
        parts.append("BF.CARD = client's" if diff == 0 else f"BF.CARD {diff:+,} vs client's {reference[0]:,}")
        parts.append(f"{found}/{wanted} sampled found" if found == wanted else f"ONLY {found}/{wanted} sampled found")
        row.check = ", ".join(parts)
        if bits != reference[1] or found != wanted:
            print(f"  !! {row.label}: {row.check}", file=sys.stderr)

    def engine_child(self, spec: dict[str, Any]) -> tuple[float, int | None, dict[str, Any]]:
        """This script run again as ``--engine-child`` (a fresh interpreter, its own cluster or
        JVM): wall seconds, peak RSS and the child's JSON (its own timings)."""
        spec = {**spec, "url": self.url, "n": self.n}
        command = [sys.executable, str(Path(__file__).resolve()), "--engine-child", json.dumps(spec)]
        seconds, rss, out = run_child(command, {"PYSPARK_PYTHON": sys.executable})
        return seconds, rss, json.loads(out)

    def pipe(self, resp: Path) -> tuple[float, int | None, str]:
        self.client.execute_command("BF.RESERVE", "ref", "0.01", 2 * self.n)
        seconds, rss, out = run_child(["redis-cli", "-p", str(self.port), "--pipe"], stdin=resp)
        if b"errors: 0" not in out:
            raise RuntimeError(out.decode(errors="replace"))
        return seconds, rss, "redis-cli's RSS"


def run_engine_child(spec: dict[str, Any]) -> None:
    """``--engine-child``: one engine start or build, its timings printed as JSON on stdout.

    dask-cluster: a LocalCluster of ``workers`` processes (one thread each) and its Client made
    ("start"), then ``bloomctl.distributed.dask.build`` of the Parquet file read with one partition
    per row group ("build": from the read's metadata to the swapped filter). spark-session: the
    creation of a SparkSession for ``master`` alone, then (untimed) the input partitions Spark
    makes of the file."""
    started = time.perf_counter()
    if spec["kind"] == "dask-cluster":
        from distributed import Client, LocalCluster

        imported = time.perf_counter()
        cluster = LocalCluster(n_workers=spec["workers"], threads_per_worker=1, processes=True)
        client = Client(cluster)
        ready = time.perf_counter()
        try:
            import dask.dataframe as dd

            from bloomctl.distributed.dask import build

            began = time.perf_counter()
            frame = dd.read_parquet(spec["parquet"], dtype_backend="pyarrow", split_row_groups=True)
            report = build(
                frame,
                "email",
                key="users",
                url=spec["url"],
                client=client,
                slots=spec["workers"],
                capacity=2 * spec["n"],
                error_rate=0.01,
                swap=True,
            )
            done = time.perf_counter()
            result: dict[str, Any] = {"import": imported - started, "start": ready - imported, "build": done - began}
            result.update(partitions=frame.npartitions, build_where=report.build, swapped=report.swapped)
        finally:
            client.close()
            cluster.close()
    elif spec["kind"] == "spark-session":
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        imported = time.perf_counter()
        spark = SparkSession.builder.appName("bloomctl-bench").master(spec["master"]).getOrCreate()
        ready = time.perf_counter()
        try:
            partitions = spark.read.parquet(spec["parquet"]).rdd.getNumPartitions()
        finally:
            spark.stop()
        result = {"import": imported - started, "start": ready - imported, "partitions": partitions}
    else:
        raise SystemExit(f"unknown engine child {spec['kind']!r}")
    print(json.dumps(result))


def dask_partitions(parquet: Path) -> int | None:
    """The partitions Dask makes of the file by default (what `--engine dask` reads)."""
    try:
        import dask.dataframe as dd
    except ImportError:
        return None
    return int(dd.read_parquet(str(parquet), dtype_backend="pyarrow").npartitions)


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
    for label in first.compare:
        values = [row.compare[label] for row in rows if label in row.compare]
        span = f" ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else ""
        note += f"; {statistics.median(values):.2f}x{span} {label}"
    checks = list(dict.fromkeys(row.check for row in rows if row.check))  # distinct, in order
    if checks:
        note += "; " + " / ".join(checks)
    note = note.lstrip("; ")
    if not first.items:  # a start-up timed alone
        span = f" ({min(r.seconds for r in rows):.2f}-{max(r.seconds for r in rows):.2f})" if len(rows) > 1 else ""
        cells = [first.label, "-", f"{seconds:.2f}{span}", "-", "-"]
        return "| " + " | ".join([*cells, "-", "-", rss, note]) + " |"
    cells = [first.label, f"{first.items:,}", f"{seconds:.2f}", f"{first.items / seconds:,.0f}", ratio]
    return "| " + " | ".join([*cells, cpu, slow, rss, note]) + " |"


def one_round(
    bench: Bench, args: argparse.Namespace, sources: tuple[Path, Path, Path | None], resp: Path, table: str | None
) -> None:
    n = bench.n
    only = args.only
    export, single, parquet = sources
    reference = bench.measure("(a) `redis-cli --pipe`, pre-encoded `BF.MADD` x1000", n, lambda: bench.pipe(resp))
    measured = [reference]
    three = ["--from-csv", str(export), "--column", "email"]
    if "csv" in only:
        measured.append(bench.measure("(b) 3-column quoted CSV, `--column email`", n, lambda: bench.bloomctl(three)))
        numpy_env = {"BLOOMCTL_KERNEL": "numpy"}
        native = bench.measure("(b) same, numpy kernel", n, lambda: bench.bloomctl(three, numpy_env))
        measured[-1].versus_label, measured[-1].versus = "the numpy kernel", native.seconds / measured[-1].seconds
        measured.append(native)
        measured.append(
            bench.measure("(b) same, `--build server`", n, lambda: bench.bloomctl([*three, "--build", "server"]))
        )
        measured.append(bench.measure("(b) one-column CSV", n, lambda: bench.bloomctl(["--from-csv", str(single)])))
    engines = only & {"dask", "spark"}
    one_job = client_state = None
    if parquet and only & {"parquet", "jobs", "dask", "spark"}:
        one_job = bench.measure(PARQUET, n, lambda: bench.bloomctl(["--from-parquet", str(parquet)]))
        measured.append(one_job)
        if engines:  # what the engines' filters must match: this client build's
            client_state = bench.filter_state()
            if client_state[2] != min(CHECK_SAMPLE, n):
                print(f"  !! {PARQUET}: only {client_state[2]} sampled items found", file=sys.stderr)
        if "jobs" in only:
            two_jobs = bench.measure(
                "(d) Parquet, `--jobs 2`", n, lambda: bench.bloomctl(["--from-parquet", str(parquet), "--jobs", "2"])
            )
            two_jobs.versus_label, two_jobs.versus = "`--jobs 1`", one_job.seconds / two_jobs.seconds
            measured.append(two_jobs)
    if table and "sql" in only:
        query = f"SELECT email FROM {table}"
        env = {"BLOOMCTL_DB_URL": args.pg_url}
        ceiling = bench.measure(
            "(b) ceiling: `psql \\copy` of the query to /dev/null", n, lambda: psql_ceiling(args.pg_url, query)
        )
        ceiling.server_cpu = ceiling.slowest = None
        row = bench.measure("(b) PostgreSQL `--from-sql`", n, lambda: bench.bloomctl(["--from-sql", query], env))
        row.versus = ceiling.seconds / row.seconds
        measured += [ceiling, row]
    if args.bitmap_items and "bitmap" in only:
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
    if "jobs" in only:
        measured.append(
            bench.measure("(d) 3-column CSV, `--jobs 2`", n, lambda: bench.bloomctl([*three, "--jobs", "2"]))
        )
    if "fixed" in only:
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
    if parquet and one_job and client_state and engines:
        measured += engine_rows(bench, args, parquet, one_job, client_state)
    for row in measured:
        row.ratio = (row.items / row.seconds) / (reference.items / reference.seconds)


def engine_rows(
    bench: Bench, args: argparse.Namespace, parquet: Path, one_job: Row, client_state: tuple[int, str, int]
) -> list[Row]:
    """(f) and (g): each build compared with the round's (b) Parquet row, 2 workers with 1, and its
    filter checked against that row's."""
    n, only, measured = bench.n, args.only, []
    source = ["--from-parquet", str(parquet), "--column", "email"]

    def dask_cli(slots: int) -> Callable[[], tuple[float, int | None, str]]:
        return lambda: bench.bloomctl([*source, "--engine", "dask", "--engine-slots", str(slots)])

    def spark_cli(master: str) -> Callable[[], tuple[float, int | None, str]]:
        env = {"PYSPARK_PYTHON": sys.executable}
        return lambda: bench.bloomctl([*source, "--engine", "spark", "--spark-master", master], env)

    def built(row: Row, one: Row | None = None, one_label: str = "") -> Row:
        bench.check(row, client_state)
        row.compare[PARQUET] = one_job.seconds / row.seconds
        if one is not None:
            row.compare[one_label] = one.seconds / row.seconds
        measured.append(row)
        return row

    if "dask" in only:
        partitions = args.dask_partitions
        first: Row | None = None
        for slots in (1, 2):
            row = bench.measure(
                f"(f) `--engine dask --engine-slots {slots}` (threads)",
                n,
                dask_cli(slots),
            )
            parts = min(slots, partitions) if partitions else "?"
            row.note = f"Dask's default: {partitions} partition(s) of the file, so {parts} part(s)"
            first = built(row, first, "`--engine-slots 1`")
        first = None
        for workers in (1, 2):
            start_label = f"(f) LocalCluster, {workers} worker process(es): engine start"
            bench.rows.setdefault(start_label, [])  # the start's row above the build's
            timings: dict[str, Any] = {}

            def cluster(workers: int = workers, timings: dict[str, Any] = timings) -> tuple[float, int | None, str]:
                whole, rss, out = bench.engine_child(
                    {"kind": "dask-cluster", "workers": workers, "parquet": str(parquet)}
                )
                timings.update(out, whole=whole, rss=rss)
                if not out["swapped"]:
                    raise RuntimeError(f"the LocalCluster build did not swap: {out}")
                return out["build"], rss, f"`dask.build`, {out['partitions']} partitions (one per row group)"

            row = bench.measure(f"(f) LocalCluster, {workers} worker process(es): the build", n, cluster)
            first = built(row, first, "1 worker")
            start = bench.record(
                start_label,
                timings["start"],
                f"`LocalCluster(...)` + `Client`; `import distributed` {timings['import']:.2f} s more; "
                f"the child's whole run {timings['whole']:.2f} s",
            )
            start.rss = timings["rss"]
    if "spark" in only:
        first = None
        for cores in (1, 2):
            master = f"local[{cores}]"
            row = bench.measure(
                f"(g) `--engine spark --spark-master {master}`",
                n,
                spark_cli(master),
            )
            row.note = "the whole command: JVM and SparkSession start included"
            first = built(row, first, "`local[1]`")
        _whole, rss, out = bench.engine_child({"kind": "spark-session", "master": "local[2]", "parquet": str(parquet)})
        session = bench.record(
            "(g) SparkSession creation alone, `local[2]`",
            out["start"],
            f"`import pyspark` {out['import']:.2f} s more; Spark reads the file as {out['partitions']} "
            "input partition(s) under local[2]",
        )
        session.rss = rss
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=5_000_000)
    parser.add_argument("--bitmap-items", type=int, default=1_000_000, help="0 skips (c)")
    parser.add_argument("--module", default=os.environ.get("BLOOMCTL_TEST_REDISBLOOM_MODULE"))
    parser.add_argument("--redis-server", default=os.environ.get("BLOOMCTL_TEST_REDIS_SERVER", "redis-server"))
    parser.add_argument("--rounds", type=int, default=3, help="every run this many times, interleaved")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test", help="'' skips PostgreSQL")
    parser.add_argument(
        "--only",
        default=",".join(GROUPS),
        help="comma-separated row groups besides (a): " + ", ".join(GROUPS) + "; engines = dask,spark",
    )
    parser.add_argument("--engine-child", help=argparse.SUPPRESS)  # one engine run, in a fresh interpreter
    args = parser.parse_args()
    if args.engine_child:
        run_engine_child(json.loads(args.engine_child))
        return
    asked = {group.strip() for group in args.only.split(",") if group.strip()}
    if "engines" in asked:
        asked = (asked - {"engines"}) | {"dask", "spark"}
    if asked - set(GROUPS):
        sys.exit(f"--only: unknown group(s) {', '.join(sorted(asked - set(GROUPS)))}; use {', '.join(GROUPS)}, engines")
    for group, module in (("dask", "distributed"), ("spark", "pyspark")):
        if group in asked and importlib.util.find_spec(module) is None:
            if "--only" in sys.argv:
                sys.exit(f"--only {group} needs {module} installed")
            print(f"({group} rows skipped: {module} is not installed)", file=sys.stderr)
            asked.discard(group)
    args.only = asked
    if not args.module:
        sys.exit("needs RedisBloom: --module /path/to/redisbloom.so (or BLOOMCTL_TEST_REDISBLOOM_MODULE)")
    for tool in (args.redis_server, "redis-cli"):
        if not shutil.which(tool):
            sys.exit(f"needs {tool}")
    n = args.items
    workdir = Path(tempfile.mkdtemp(prefix="bloomctl-bench-"))
    print("writing the sources ...", file=sys.stderr)
    sources = write_sources(workdir, n)
    args.dask_partitions = dask_partitions(sources[2]) if sources[2] and "dask" in args.only else None
    resp = encode_reference(workdir, n, b"ref")
    wants_table = "sql" in args.only and args.pg_url and shutil.which("psql")
    table = postgres_table(args.pg_url, sources[0]) if wants_table else None
    proc, port = start_server(args.module, workdir, args.redis_server)
    bench = Bench(proc, port, n)
    load_before = os.getloadavg()
    began = time.perf_counter()
    try:
        server = bench.client.info("server")["redis_version"]
        module = next(m for m in bench.client.module_list() if m[b"name"] == b"bf")[b"ver"]
        for number in range(args.rounds):
            print(f"round {number + 1} of {args.rounds}", file=sys.stderr)
            one_round(bench, args, sources, resp, table)
        load_after = os.getloadavg()
    finally:
        proc.terminate()
        proc.wait()
        if table:
            drop_table(args.pg_url, table)
        shutil.rmtree(workdir, ignore_errors=True)

    elapsed = time.perf_counter() - began
    reference = bench.rows[next(iter(bench.rows))]
    cpu = statistics.median(row.server_cpu or 0.0 for row in reference)
    print(f"\nRedis {server}, RedisBloom {module}, loopback, {os.cpu_count()} cores; capacity {2 * n:,}, 1%;", end=" ")
    print(f"medians of {args.rounds} rounds (the range of x (a) in brackets)\n")
    print("| run | items | s | items/s | x (a) | server CPU s | slowest command | client peak RSS MiB | notes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |")
    for rows in bench.rows.values():
        print(fmt_rows(rows))
    print(f"\n(a)'s server CPU: {cpu:.2f} s; 10% of it is {cpu / 10:.2f} s")
    print(f"groups: {', '.join(group for group in GROUPS if group in args.only)}; rounds took {elapsed / 60:.1f} min;")
    print(
        "load average (1, 5, 15 min) before: {:.2f} {:.2f} {:.2f}, after: {:.2f} {:.2f} {:.2f}".format(
            *load_before, *load_after
        )
    )


if __name__ == "__main__":
    main()
