"""Distributed builds: the engine-neutral seam (spec, parts, merge, Arrow round trip) without a
server, then Dask on a real LocalCluster against real servers: bits equal to a one-process client
build and to the server's own build on both backends, sharded filters, items repeated across
partitions, a failing task, dual writes during the job, and the command line's ``--engine``."""

from __future__ import annotations

import dataclasses
import json
import pickle
import random
import re
import subprocess
import sys

import pytest

from bloomctl.errors import UsageError
from bloomctl.filters.bloom import Filter, open_filter

np = pytest.importorskip("numpy")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def layouts(scheme: str, sizes: list[int], hashes: int = 7) -> tuple:
    from bloomctl.rebuild.build import bitmap, redisbloom

    if scheme == "redisbloom":
        return tuple(redisbloom.Layout(b"", n, n * 8, hashes, 10**9, False) for n in sizes)
    return tuple(bitmap.Layout(n, n * 8, hashes, 10**9) for n in sizes)


def spec_of(scheme: str = "redisbloom", sizes=(4096,), **recipe):
    from bloomctl.rebuild.build.spec import BuildSpec

    return BuildSpec(scheme, layouts(scheme, list(sizes)), tuple(f"m{i}" for i in range(len(sizes))), **recipe)


def random_items(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 301))) for _ in range(count)]


def one_build(spec, items: list[bytes]):
    from bloomctl.rebuild.build.client import Build

    build = Build(spec.backend, spec.layouts, spec.names, checked=False)
    build.add(pa.array(items, pa.binary()))
    return build


@pytest.mark.parametrize("scheme", ["redisbloom", "bitmap"])
def test_any_merge_tree_of_parts_gives_the_bits_of_one_build(scheme):
    """Parts of shares of the items (items of 0-300 bytes, repeats across shares), merged
    left to right, right to left, as a balanced tree and in a random order: the bits of one build
    over everything, counts that add up, and the inputs unchanged."""
    from bloomctl.rebuild.build.spec import merge, merge_all

    spec = spec_of(scheme, sizes=(3000, 1700))  # two members: items routed as a sharded filter's
    items = random_items(3000, 1)
    items += items[:500]  # repeats: in another share
    rng = random.Random(2)
    rng.shuffle(items)
    cuts = sorted(rng.sample(range(1, len(items)), 6))
    shares = [items[a:b] for a, b in zip([0, *cuts], [*cuts, len(items)], strict=True)]
    parts = [spec.partial([pa.array(share, pa.binary())], index) for index, share in enumerate(shares)]
    kept = [[data.copy() for data in part.datas] for part in parts]
    whole = one_build(spec, items)

    def balanced(group):
        if len(group) == 1:
            return group[0]
        middle = len(group) // 2
        return merge(balanced(group[:middle]), balanced(group[middle:]))

    def copies(group):  # merge_all ORs into the first part's arrays: give it copies
        return [dataclasses.replace(part, datas=[data.copy() for data in part.datas]) for part in group]

    shuffled = parts[:]
    rng.shuffle(shuffled)
    for merged in (
        merge_all(copies(parts)),
        merge_all(copies(parts[::-1])),
        balanced(parts),
        merge_all(copies(shuffled)),
    ):
        assert all(np.array_equal(a, b.data) for a, b in zip(merged.datas, whole.arrays, strict=True))
        assert merged.counts == [sum(part.counts[i] for part in parts) for i in range(2)]
        assert merged.stats.items == len(items) == merged.stats.rows
    assert all(
        np.array_equal(a, b)
        for part, datas in zip(parts, kept, strict=True)
        for a, b in zip(part.datas, datas, strict=True)
    )


def test_a_part_round_trips_through_arrow_in_chunks():
    """Bits cut into chunks (here 1,000 bytes), the counts and the sample: read back equal; two
    parts' tables together read back as their merge; a lost or doubled chunk is refused."""
    from bloomctl.rebuild.build.spec import arrow_batches, from_arrow, merge, to_arrow

    spec = spec_of("redisbloom", sizes=(4500, 2100), sample_size=50, seed=7)
    a = spec.partial([pa.array(random_items(2000, 3), pa.binary())], 0)
    b = spec.partial([pa.array(random_items(900, 4), pa.binary())], 1)
    table = to_arrow(a, chunk_bytes=1000)
    assert max(len(value) for value in table.column("data").to_pylist()) == 1000
    back = from_arrow(table)
    assert all(np.array_equal(x, y) for x, y in zip(back.datas, a.datas, strict=True))
    assert (back.counts, back.largest, back.stats, back.sample_size) == (a.counts, a.largest, a.stats, 50)
    assert back.sample == a.sample and np.array_equal(back.sample_keys, a.sample_keys)
    both = from_arrow(pa.concat_tables([to_arrow(a, 1000), to_arrow(b, 700)]))
    expected = merge(a, b)
    assert all(np.array_equal(x, y) for x, y in zip(both.datas, expected.datas, strict=True))
    assert both.counts == expected.counts and sorted(both.sample) == sorted(expected.sample)
    batches = list(arrow_batches(a, 1000))
    with pytest.raises(ValueError, match="incomplete"):
        from_arrow(pa.Table.from_batches(batches[1:]))
    with pytest.raises(ValueError, match="incomplete or doubled"):
        from_arrow(pa.Table.from_batches([batches[0], *batches]))
    with pytest.raises(ValueError, match="incomplete or doubled"):  # as many bytes, one chunk twice, one lost
        from_arrow(pa.Table.from_batches([batches[0], batches[0], *batches[2:]]))


def test_samples_merge_into_a_uniform_sample_of_the_whole():
    """Each part keeps its items with the smallest random keys; merged, the smallest of the union:
    over many builds every item is as likely to be drawn, whichever part read it."""
    from bloomctl.rebuild.build.spec import merge

    spec = spec_of("redisbloom", sizes=(512,), sample_size=10)
    hits = {f"i{i}".encode(): 0 for i in range(100)}
    for trial in range(400):
        small = spec.partial([pa.array([f"i{i}".encode() for i in range(20)], pa.binary())], 2 * trial)
        large = spec.partial([pa.array([f"i{i}".encode() for i in range(20, 100)], pa.binary())], 2 * trial + 1)
        for item in merge(small, large).sample:
            hits[item] += 1
    small_share = sum(hits[f"i{i}".encode()] for i in range(20)) / (400 * 10)
    assert 0.15 < small_share < 0.25  # 20 of 100 items: 20% of the draws (sd 0.6%)


def test_a_spec_pickles_and_builds_items_exactly_as_a_parquet_rebuild(tmp_path):
    """The spec crosses to a worker by pickle; from record batches it builds the items of the
    Parquet rules (templates, prefixes, integers as digits, nulls and empty values blank): the
    bits and statistics of the Parquet source read in one process."""
    from bloomctl.sources import open_source

    table = pa.table(
        {
            "id": pa.array([1, None, 3, -4, 5, 6], pa.int64()),
            "email": pa.array(["a@x", "b@x", "", "日本@x", None, "f@x"], pa.string()),
            "other": pa.array([1.5] * 6, pa.float64()),  # not read: not refused
        }
    )
    path = tmp_path / "t.parquet"
    pq.write_table(table, str(path), row_group_size=2)
    for recipe in ({"column": "email"}, {"column": "id", "prefix": "u:"}, {"template": "{id}/{email}"}):
        spec = pickle.loads(pickle.dumps(spec_of("bitmap", sizes=(256,), **recipe)))
        part = spec.partial(table.to_batches(max_chunksize=4))
        source = open_source(parquet_path=str(path), **recipe)
        items = [item for batch in source.batches(100) for item in batch]
        assert all(np.array_equal(a, b.data) for a, b in zip(part.datas, one_build(spec, items).arrays, strict=True))
        assert (part.stats.rows, part.stats.blank, part.stats.items) == (
            source.stats.rows,
            source.stats.blank,
            source.stats.items,
        )
    with pytest.raises(UsageError, match="'other' has type double"):
        spec_of(column="other").partial([table])


def test_going_on_from_a_part_leaves_it_unchanged():
    """A Dask task that runs again gets the same input: ``onto`` copies the part it goes on from."""
    spec = spec_of("redisbloom", sizes=(1024,), sample_size=5)
    first = spec.partial([pa.array(random_items(300, 5), pa.binary())])
    before = (first.datas[0].copy(), list(first.counts), list(first.sample))
    second = spec.partial([pa.array(random_items(300, 6), pa.binary())], onto=first)
    assert np.array_equal(first.datas[0], before[0]) and (first.counts, first.sample) == (before[1], before[2])
    whole = one_build(spec, random_items(300, 5) + random_items(300, 6))
    assert np.array_equal(second.datas[0], whole.arrays[0].data)
    assert second.counts == [whole.arrays[0].count] and second.stats.items == 600


# --- Dask on a real LocalCluster --------------------------------------------------------------


@pytest.fixture(scope="module")
def dask_client():
    pytest.importorskip("dask.dataframe")
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=50
    )
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


def frame(items: list[str | None], partitions: int, **more):
    import dask.dataframe as dd
    import pandas as pd

    data = {"email": pd.array(items, dtype="string[pyarrow]"), **more}
    return dd.from_pandas(pd.DataFrame(data), npartitions=partitions, sort=False)


def write_parquet(path, items: list[str | None], row_group: int = 2500) -> str:
    pq.write_table(pa.table({"email": pa.array(items, pa.string())}), str(path), row_group_size=row_group)
    return str(path)


def members(target, key: str) -> list[bytes]:
    """The keys of a filter's members: its own, or its shards' (in shard order)."""
    from bloomctl.lifecycle.manifest import read_manifest

    manifest = read_manifest(target.client, key)
    return [key.encode()] if manifest is None else [family.active for family in manifest.families]


@pytest.mark.parametrize("sharded", [False, True], ids=["one", "sharded"])
def test_dask_builds_the_bits_of_a_client_build_and_of_the_server(target, dask_client, tmp_path, sharded):
    """The same items through Dask (7 partitions, 2 workers), a one-process client build and the
    server's own build: the same bits, the same count, every item found (0 false negatives)."""
    from bloomctl.distributed import dask as engine

    items = [f"user{i}@example.com" for i in range(12_000)] + [None, ""] * 50
    path = write_parquet(tmp_path / "u.parquet", items)
    shards = ["--shards", "3"] if sharded else []
    args = ["--from-parquet", path, "--column", "email", "-c", "20000", "-e", "1%", "--nonscaling"]
    args += ["--backend", target.backend.name, "--swap", *shards]
    for key, where in (("one", "client"), ("server", "server")):
        result = target.cli("rebuild", key, *args, "--build", where, "--format", "json")
        assert result.exit_code == 0, result.stderr
    report = engine.build(
        frame(items, 7),
        "email",
        key="spread",
        redis=target.client,
        client=dask_client,
        capacity=20_000,
        error_rate=0.01,
        nonscaling=True,
        backend=target.backend.name,
        shards=3 if sharded else None,
        swap=True,
    )
    assert (report.build, report.swapped, report.source.items, report.source.blank) == ("client", True, 12_000, 100)
    for one, server, spread in zip(*(members(target, key) for key in ("one", "server", "spread")), strict=True):
        assert target.dump(spread, header=False) == target.dump(one, header=False) == target.dump(server, header=False)
        # one count per part: an item that is a false positive of another part's bits counts in its own
        assert target.card(one) == target.card(server) <= target.card(spread) <= target.card(one) * 1.01
    assert all(open_filter(target.client, "spread").mexists(items[:12_000]))


def test_items_in_two_partitions_are_counted_once(bloom, dask_client):
    """The same 4,000 items in two partitions: the two parts count 8,000, the bits hold about
    4,000, so the filter records the server's count for 4,000 (a warning says so) and takes
    more items as it should; a NONSCALING filter of 6,000 is not taken for full."""
    from bloomctl.distributed import dask as engine
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(bloom.url))
    items = [f"user{i}@example.com" for i in range(4000)]
    said: list[str] = []
    report = engine.build(
        frame(items + items, 2),
        "email",
        key="twice",
        redis=client,
        client=dask_client,
        capacity=6000,
        error_rate=0.01,
        nonscaling=True,
        swap=True,
        events=lambda message, fields: said.append(message),
    )
    assert report.source.items == 8000
    # each part counts 4,000 less its own false positives (a few): about 8,000 in all
    counted = [re.search(r"the parts counted ([\d,]+) items, the bits hold about", line) for line in said]
    assert [7900 < int(m.group(1).replace(",", "")) <= 8000 for m in counted if m] == [True], said
    card = int(client.execute_command("BF.CARD", "twice"))
    assert abs(card - 4000) <= 40
    assert Filter(client, "twice").madd([f"new{i}" for i in range(1500)]).count(True) >= 1450  # not full


def test_a_failing_task_leaves_the_active_filter_and_releases_the_lock(target, dask_client):
    """A task fails half-way: the rebuild raises, the active filter keeps its items, the standby
    is never swapped (marked failed), and the lock is free: the next build runs at once."""
    from bloomctl.distributed import dask as engine
    from bloomctl.keys import KeyFamily
    from bloomctl.lifecycle.metadata import read_metadata

    target.reserve("keep", 5000)
    target.add("keep", [b"old-1", b"old-2"])
    items = [f"u{i}" for i in range(3000)]

    def explode(part):
        if len(part) and part["email"].iloc[0] == "u1500":
            raise RuntimeError("worker lost its disk")
        return part

    bad = frame(items, 6).map_partitions(explode, meta={"email": "string[pyarrow]"})
    options = dict(redis=target.client, client=dask_client, capacity=5000, error_rate=0.01, swap=True)
    with pytest.raises(RuntimeError, match="worker lost its disk"):
        engine.build(bad, "email", key="keep", backend=target.backend.name, **options)
    assert Filter(target.client, "keep").mexists([b"old-1", b"old-2", b"u1"]) == [True, True, False]
    meta = read_metadata(target.client, KeyFamily.of("keep").standby_meta)
    assert meta.get("state") == "failed"
    report = engine.build(frame(items, 6), "email", key="keep", backend=target.backend.name, **options)
    assert report.swapped and all(Filter(target.client, "keep").mexists(items))


def test_dual_writes_during_the_job_survive(target, dask_client):
    """The application adds through the dual-write path while the engine builds: its items are
    in the filter swapped in."""
    from bloomctl.distributed import dask as engine

    target.reserve("live", 20_000)
    late = [f"late{i}" for i in range(300)]

    def during(message, fields):
        if fields.get("engine") == "dask":  # the standby exists, the workers are about to build
            Filter(target.client, "live").madd(late, dual_write=True)

    report = engine.build(
        frame([f"u{i}" for i in range(5000)], 4),
        "email",
        key="live",
        redis=target.client,
        client=dask_client,
        backend=target.backend.name,
        capacity=20_000,
        error_rate=0.01,
        swap=True,
        events=during,
    )
    assert report.swapped
    assert all(Filter(target.client, "live").mexists(late + [f"u{i}" for i in range(5000)]))


def test_the_command_line_builds_with_dask(bloom, tmp_path):
    """`rebuild --engine dask --from-parquet`: Dask's own reader, threads in this process, the
    same bits as a client build; wrong combinations are one line and exit 2, before any write."""
    pytest.importorskip("dask.dataframe")
    from tests.fixtures.redis import Cli, Target

    target = Target("redisbloom", "standalone", bloom.url)
    cli: Cli = target.cli
    items = [f"user{i}@x" if i % 10 else None for i in range(8000)]
    folder = tmp_path / "export"
    folder.mkdir()
    write_parquet(folder / "a.parquet", items[:5000], 1000)
    write_parquet(folder / "b.parquet", items[5000:], 1000)
    args = ["--from-parquet", str(folder), "--column", "email", "-e", "1%", "--swap", "--format", "json"]
    # a process of its own: no Dask client of another test becomes its scheduler
    command = [sys.executable, "-m", "bloomctl", "--url", bloom.url, "rebuild", "spread", *args]
    spread = subprocess.run([*command, "--engine", "dask", "--engine-slots", "3"], capture_output=True, text=True)
    one = cli("rebuild", "one", *args, "--build", "client")
    assert spread.returncode == 0 and one.exit_code == 0, spread.stderr
    report = json.loads(spread.stdout)
    assert (report["items_read"], report["blank"], report["build"]) == (7200, 800, "client")
    assert "building the bits on Dask" in spread.stderr
    assert target.dump("spread") == target.dump("one")
    wrong = {
        ("--engine", "dask", "--jobs", "2"): "leave out --jobs",
        ("--engine", "dask", "--build", "server"): "leave out --build server",
        ("--scheduler", "tcp://x:1"): "go with --engine",
        ("--engine", "dask", "--spark-master", "local[2]"): "go with --engine spark",
        ("--engine", "dask", "--type", "cuckoo"): "cuckoo",
    }
    for extra, message in wrong.items():
        result = cli("rebuild", "fresh", *args, *extra)
        assert result.exit_code == 2 and message in result.stderr, (extra, result.stderr)
    assert target.client.keys("*fresh*") == []
    csv = tmp_path / "u.csv"
    csv.write_text("email\na@x\n")
    result = cli("rebuild", "spread", "--from-csv", str(csv), "--column", "email", "--engine", "dask")
    assert result.exit_code == 2 and "--engine reads --from-parquet" in result.stderr
    assert target.dump("spread") == target.dump("one")  # nothing written by the refused runs


def test_a_missing_engine_names_its_extra(bloom, tmp_path):
    """Without Dask installed, `--engine dask` is one line naming the extra, exit 9."""
    path = write_parquet(tmp_path / "u.parquet", ["a@x", "b@x"])
    code = (
        "import sys; sys.modules['dask'] = None; sys.modules['dask.dataframe'] = None\n"
        "from bloomctl.cli import main\n"
        f"main(['--url', {bloom.url!r}, 'rebuild', 'k', '--from-parquet', {path!r}, '--column', 'email', "
        "'--engine', 'dask', '-c', '100', '-e', '1%'])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 9, result.stderr
    assert "pip install 'redis-bloomctl[dask]'" in result.stderr and "Traceback" not in result.stderr


class _Engine:
    """An engine of a user's own: hands back what ``make(spec)`` builds."""

    name, description = "own", "an engine of our own"

    def __init__(self, make) -> None:
        self.make = make

    def build(self, spec, source):
        return self.make(spec)


def test_an_engine_part_of_another_filter_is_refused_before_any_upload(bloom):
    """An engine of the user's own that hands back the part of another filter (another size), or
    no items at all: refused before anything is uploaded, and the active filter stays."""
    from bloomctl.distributed import BuildSpec, FrameSource, run
    from bloomctl.errors import SourceError
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(bloom.url))
    client.execute_command("BF.ADD", "mine", "old")
    schema = pa.schema([("email", pa.string())])
    source = FrameSource("a test frame", schema, lambda: 10, lambda columns: iter([]), column="email")

    def other_filter(spec):
        smaller = BuildSpec(spec.backend, (spec.layouts[0].__class__(b"", 64, 512, 3, 10, False),), ("x",))
        return smaller.partial([pa.array([b"a"], pa.binary())])

    options = {"key": "mine", "client": client, "capacity": 1000, "error_rate": 0.01, "swap": True}
    with pytest.raises(ValueError, match="does not fit this filter"):
        run(source, _Engine(other_filter), **options)
    with pytest.raises(SourceError, match="yielded no items"):
        run(source, _Engine(lambda spec: spec.partial([])), **options)
    assert client.execute_command("BF.EXISTS", "mine", "old") == 1
    assert int(client.execute_command("BF.CARD", "mine")) == 1


def test_every_item_verified_and_a_filter_that_outgrows_one_link(bloom, dask_client):
    """`verify_all` reads the DataFrame again on the driver; a scaling filter whose items outgrow
    its one sub-filter is refused before anything is uploaded (an engine never falls back to
    reading everything through the driver), the active filter kept."""
    from bloomctl.distributed import dask as engine
    from bloomctl.errors import StateConflict
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(bloom.url))
    items = [f"u{i}" for i in range(3000)]
    options = {"redis": client, "client": dask_client, "error_rate": 0.01, "swap": True}
    report = engine.build(frame(items, 3), "email", key="all", capacity=5000, verify_all=True, **options)
    assert (report.verify_mode, report.verified, report.swapped) == ("all", 3000, True)
    with pytest.raises(StateConflict, match=r"engine's build cannot finish: .*more than 1,000 distinct items"):
        engine.build(frame(items, 3), "email", key="all", capacity=1000, **options)
    assert int(client.execute_command("BF.CARD", "all")) == 3000


def test_the_pages_dask_example_runs(bloom, dask_client, monkeypatch, tmp_path):
    """docs/distributed.md's Dask example, as written but for the scheduler's address and the
    files' path."""
    from pathlib import Path

    page = (Path(__file__).parent.parent / "docs" / "distributed.md").read_text(encoding="utf-8")
    example = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "bloom_dask" in b)
    path = write_parquet(tmp_path / "users.parquet", [f"user{i}@example.com" for i in range(5000)])
    example = example.replace('"tcp://scheduler:8786"', repr(dask_client.scheduler.address))
    example = example.replace('"s3://exports/users/"', repr(path))
    monkeypatch.setenv("BLOOMCTL_URL", bloom.url)
    printed: list[str] = []
    exec(compile(example, "docs/distributed.md", "exec"), {"print": lambda *a: printed.append(" ".join(map(str, a)))})
    assert printed == ["5000 True"]


def test_repeats_that_push_the_sum_past_the_capacity_do_not_fill_the_filter(bloom, dask_client):
    """990 distinct items, 40 of them again in another partition, a NONSCALING filter of 1,000:
    the parts count 1,030, which the bits put below the capacity; the build records the server's
    count and swaps, as a one-process build of the same rows does."""
    from bloomctl.distributed import dask as engine
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(bloom.url))
    items = [f"user{i}@example.com" for i in range(990)]
    options = {"redis": client, "client": dask_client, "capacity": 1000, "error_rate": 0.01, "nonscaling": True}
    report = engine.build(frame(items + items[:40], 2), "email", key="near", swap=True, **options)
    assert report.swapped
    assert 970 <= int(client.execute_command("BF.CARD", "near")) <= 1000
    assert all(Filter(client, "near").mexists(items))


def test_engine_urls_never_show_their_secrets():
    """Where an engine runs and what it reads are shown in the log and in errors: never a user's
    password or a Spark Connect token."""
    from bloomctl.distributed import open_engine
    from bloomctl.distributed.frame import shown

    remote = open_engine("spark", spark_remote="sc://connect:15002/;token=S3CRET;user_id=me")
    master = open_engine("spark", spark_master="k8s://https://admin:pa55@api:6443")
    scheduler = open_engine("dask", scheduler="tls://user:pa55@scheduler:8786")
    for engine in (remote, master, scheduler):
        assert "S3CRET" not in engine.description and "pa55" not in engine.description
    assert remote.description == "Spark (sc://connect:15002/;token=***;user_id=me)"
    assert scheduler.description == "Dask (tls://***@scheduler:8786)"
    message = shown("cannot read s3://AKIA:wJalr@bucket/users/?password=hunter2&region=eu: 'x'")
    assert message == "cannot read s3://***@bucket/users/?password=***&region=eu: 'x'"


def test_an_unreachable_scheduler_is_one_line(bloom, tmp_path):
    """A scheduler that does not answer: exit 3 and one line naming it, no traceback, nothing written."""
    pytest.importorskip("distributed")
    path = write_parquet(tmp_path / "u.parquet", ["a@x", "b@x"])
    command = [sys.executable, "-m", "bloomctl", "--url", bloom.url, "rebuild", "unreached", "--from-parquet", path]
    command += ["--column", "email", "-c", "100", "-e", "1%", "--engine", "dask", "--scheduler", "tcp://127.0.0.1:9"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert lines and "cannot reach the Dask scheduler tcp://127.0.0.1:9" in lines[0]
    assert "Traceback" not in result.stderr


def test_an_engine_that_loses_a_share_is_refused(bloom):
    """An engine of the user's own that hands back the part of only some of the DataFrame's rows
    (a task's share lost): with `capacity` auto the DataFrame's rows were counted, and the rows
    the parts read must be as many, or nothing is swapped (the sample drawn from the parts could
    not notice: it holds only what the parts read)."""
    from bloomctl.distributed import FrameSource, run
    from bloomctl.errors import SourceError
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(bloom.url))
    client.execute_command("BF.ADD", "lossy", "old")
    schema = pa.schema([("email", pa.string())])
    rows = [f"u{i}" for i in range(1000)]
    source = FrameSource("a test frame", schema, lambda: len(rows), lambda columns: iter([]), column="email")
    half = _Engine(lambda spec: spec.partial([pa.table({"email": rows[:500]})]))
    with pytest.raises(SourceError, match="read 500 rows of the 1000"):
        run(source, half, key="lossy", client=client, capacity="auto", error_rate=0.01, swap=True)
    assert client.execute_command("BF.EXISTS", "lossy", "old") == 1
    whole = _Engine(lambda spec: spec.partial([pa.table({"email": rows})]))
    assert run(source, whole, key="lossy", client=client, capacity="auto", error_rate=0.01, swap=True).swapped
