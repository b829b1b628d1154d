"""Client-side builds on real servers: the same bytes as the server's own filter, the probe, dual
writes through a build, and every way auto falls back to the server path."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from bloomctl.backends import get
from bloomctl.errors import KeyMissing
from bloomctl.filters.bloom import Filter
from bloomctl.keys import KeyFamily
from bloomctl.lifecycle.metadata import read_metadata

pytest.importorskip("numpy")

REDISBLOOM_PARAMS = [
    ("10000", "1%", ["--expansion", "2"]),
    ("8000", "0.1%", ["--nonscaling"]),
    ("7000", "10%", ["--expansion", "4"]),
    ("12000", "0.3", ["--expansion", "3"]),
]
BITMAP_PARAMS = [("10000", "1%", ["--nonscaling"]), ("9000", "0.05%", ["--nonscaling"])]


def awkward_items(n: int, seed: int = 7) -> list[str]:
    """Distinct-ish items of many lengths, some unicode, with repeats (counted once by the server)."""
    rng = random.Random(seed)
    words = ["user", "ünï", "日本", "x" * 40, "", "a,b"]
    items = [f"{rng.choice(words)}:{rng.randrange(10 ** rng.randrange(1, 9))}" for _ in range(n)]
    return items + items[: n // 10]


def write_items(path, items: list[str]) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write("item\n")
        f.writelines(f'"{item}"\n' if "," in item else f"{item}\n" for item in items)
    return str(path)


def dump(target, key: str) -> bytes:
    return target.dump(key)


def companions(target, role: str) -> list[bytes]:
    """Every ``{users}:<role>...`` key (a run's own build or probe key), on every node."""
    client = target.client
    if target.cluster:
        return list(client.scan_iter(match=f"{{users}}:{role}*", target_nodes=client.ALL_NODES))
    return list(client.scan_iter(match=f"{{users}}:{role}*"))


def rebuild(target, key: str, path: str, *args: str):
    result = target.cli("rebuild", key, "--from-csv", path, "--swap", "--format", "json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def params(target):
    return REDISBLOOM_PARAMS if target.backend.name == "redisbloom" else BITMAP_PARAMS


def test_client_and_server_builds_are_byte_for_byte_equal(target, tmp_path):
    path = write_items(tmp_path / "items.csv", awkward_items(6000))
    for capacity, error, extra in params(target):
        args = ["-c", capacity, "-e", error, *extra, "--backend", target.backend.name]
        client_built = rebuild(target, "c", path, *args, "--build", "client")
        server_built = rebuild(target, "s", path, *args, "--build", "server")
        assert client_built["build"] == "client" and server_built["build"] == "server"
        assert client_built["added"] == server_built["added"] < client_built["items_read"]  # the repeats
        assert dump(target, "c") == dump(target, "s"), (capacity, error, extra)
        assert target.card("c") == target.card("s")
        target.client.delete("c", "s", KeyFamily.of("c").meta, KeyFamily.of("s").meta)


def test_auto_builds_in_the_client_and_the_log_says_so(target, tmp_path):
    path = write_items(tmp_path / "items.csv", awkward_items(3000))
    result = target.cli("rebuild", "users", "--from-csv", path, "-c", "5000", "-e", "1%", "--swap", "--nonscaling")
    assert result.exit_code == 0, result.stderr
    from bloomctl.native import name

    kernel = name()  # native where pip built it, else numpy
    assert f"building in the client, {kernel} kernel (the compatibility probe matched this server)" in result.stderr
    assert f"built in       the client, {kernel} kernel" in result.stdout
    assert companions(target, "probe") == [] and companions(target, "build") == []


def test_a_probe_mismatch_falls_back_to_the_server_path(target, tmp_path, monkeypatch):
    """A server that hashes otherwise (simulated: the client's hash is perturbed, in numpy and in
    the native kernel, whichever builds) is built by the server."""
    import dataclasses

    from bloomctl.rebuild.build import bitmap, murmur, redisbloom

    monkeypatch.setattr(murmur, "SEED", 12345)
    real_positions = bitmap.positions
    monkeypatch.setattr(bitmap, "positions", lambda layout, batch: (real_positions(layout, batch) + 1) % layout.bits)
    for scheme in (bitmap, redisbloom):  # one hash more than the layout's
        real_add = scheme.native_add
        monkeypatch.setattr(
            scheme,
            "native_add",
            lambda native, layout, *rest, real=real_add: real(
                native, dataclasses.replace(layout, hashes=layout.hashes + 1), *rest
            ),
        )
    path = write_items(tmp_path / "items.csv", awkward_items(3000))
    args = ["-c", "5000", "-e", "1%", "--nonscaling", "--swap"]
    auto = target.cli("rebuild", "users", "--from-csv", path, *args, "--format", "json")
    assert auto.exit_code == 0, auto.stderr
    report = json.loads(auto.stdout)
    assert report["build"] == "server" and "compatibility probe" in report["build_note"]
    assert "building on the server: the compatibility probe found this server's filter different" in auto.stderr
    assert all(Filter(target.client, "users").mexists(awkward_items(3000)))
    forced = target.cli("rebuild", "users", "--from-csv", path, *args, "--build", "client")
    assert forced.exit_code == 4 and "cannot build in the client" in forced.stderr and "--build server" in forced.stderr


def test_memory_budget_sends_big_filters_to_the_server(target, tmp_path):
    path = write_items(tmp_path / "items.csv", awkward_items(2000))
    args = ["-c", "5000", "-e", "1%", "--nonscaling", "--swap", "--client-memory", "1M", "--format", "json"]
    auto = target.cli("rebuild", "users", "--from-csv", path, *args)
    assert auto.exit_code == 0, auto.stderr
    report = json.loads(auto.stdout)
    assert report["build"] == "server" and "more than the client memory limit 1,000,000" in report["build_note"]
    forced = target.cli("rebuild", "users", "--from-csv", path, *args, "--build", "client")
    assert forced.exit_code == 4 and "client memory limit" in forced.stderr


def test_a_scaling_filter_that_outgrows_one_link_is_built_by_the_server(target, tmp_path):
    if target.backend.name != "redisbloom":
        pytest.skip("bitmap filters never grow")
    path = write_items(tmp_path / "items.csv", [f"user:{i}" for i in range(3000)])
    args = ["-c", "1000", "-e", "1%", "--expansion", "2", "--backend", "redisbloom"]
    auto = rebuild(target, "grown", path, *args)
    assert auto["build"] == "server" and "more than 1,000 distinct items" in auto["build_note"]
    server = rebuild(target, "reference", path, *args, "--build", "server")
    assert dump(target, "grown") == dump(target, "reference")  # two sub-filters, as the server grows them
    forced = target.cli("rebuild", "grown", "--from-csv", path, *args, "--build", "client")
    assert forced.exit_code == 5 and "grows a sub-filter" in forced.stderr
    assert server["added"] == auto["added"] > 2900


def test_a_full_nonscaling_filter_is_refused_as_the_server_refuses_it(target, tmp_path):
    if target.backend.name != "redisbloom":
        pytest.skip("bitmap filters keep accepting items")
    path = write_items(tmp_path / "items.csv", [f"user:{i}" for i in range(3000)])
    for build in ("client", "server"):
        args = ["-c", "1000", "-e", "1%", "--nonscaling", "--build", build, "--backend", "redisbloom"]
        result = target.cli("rebuild", "users", "--from-csv", path, "--swap", *args)
        assert result.exit_code == 5 and "non scaling filter is full" in result.stderr, (build, result.stderr)
        assert not target.client.exists("users")


def test_stdin_with_a_scaling_filter_is_built_by_the_server(target):
    if target.backend.name != "redisbloom":
        pytest.skip("bitmap filters never grow")
    items = "".join(f"u{i}\n" for i in range(500))
    result = target.cli(
        "rebuild", "users", "--from-csv", "-", "--no-header", "-c", "1000", "-e", "1%", "--swap", input=items
    )
    assert result.exit_code == 0, result.stderr
    assert "building on the server: a scaling filter fed from a source read once" in result.stderr


def test_sharded_client_build_equals_the_server_build(target, tmp_path):
    path = write_items(tmp_path / "items.csv", awkward_items(4000))
    args = ["-c", "12000", "-e", "1%", "--nonscaling", "--shards", "3", "--backend", target.backend.name]
    assert rebuild(target, "c", path, *args, "--build", "client")["build"] == "client"
    assert rebuild(target, "s", path, *args, "--build", "server")["build"] == "server"
    from bloomctl.lifecycle.manifest import read_manifest

    for member_c, member_s in zip(
        read_manifest(target.client, "c").members, read_manifest(target.client, "s").members, strict=True
    ):
        assert dump(target, member_c.decode()) == dump(target, member_s.decode())


@pytest.mark.parametrize("rate", [200, 5000])
def test_dual_writes_through_a_client_build_are_never_lost(target, tmp_path, rate):
    """A writer adds new items the documented way (standby first, without creating it, then the
    active filter) all through a client build, at a gentle and at a hard rate: every item that
    reached a standby is in the swapped-in filter. (Items written before the standby exists reach
    only the old filter: the source of truth must have them, on either path.)"""
    path = write_items(tmp_path / "items.csv", [f"user:{i}" for i in range(1_000_000)])
    args = ["-c", "2000000", "-e", "1%", "--nonscaling", "--swap"]
    assert target.cli("rebuild", "users", "--from-csv", path, *args).exit_code == 0
    standby, backend = KeyFamily.of("users").standby, target.backend
    dual: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            item = f"new:{i}".encode()
            try:
                backend.madd(target.client, standby, [item])
                dual.append(item.decode())
            except KeyMissing:  # no rebuild running (yet, or any more)
                pass
            backend.madd(target.client, b"users", [item])
            i += 1
            time.sleep(1 / rate)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(0.1)
        result = target.cli("rebuild", "users", "--from-csv", path, "--swap", "--format", "json")
    finally:
        stop.set()
        thread.join()
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["swapped"] and len(dual) > 5, len(dual)
    present = Filter(target.client, "users").mexists(dual)
    missing = [item for item, here in zip(dual, present, strict=True) if not here]
    assert missing == [], f"{len(missing)} of {len(dual)} dual writes lost ({report['build']}, {report['build_note']})"
    assert read_metadata(target.client, KeyFamily.of("users").meta)["state"] == "verified"


def spy_on_standby_reads(monkeypatch, write=None) -> list[bytes]:
    """Record every full read of a standby's bits; ``write(key)`` runs after each upload (the
    application writing to the standby between the upload and the cutover)."""
    from bloomctl.rebuild.build import redisbloom

    real_read, real_upload, reads = redisbloom.read_bits, redisbloom.upload_chunks, []

    def read(client, key, layout):
        if key.endswith(b":standby"):  # not the probe's filter
            reads.append(key)
        return real_read(client, key, layout)

    def upload(client, key, data, starts):
        sent = real_upload(client, key, data, starts)
        if write is not None and b":build:" in key:  # (not the probe's own upload, onto its own key)
            write(key.split(b":build:")[0] + b":standby")
        return sent

    monkeypatch.setattr(redisbloom, "read_bits", read)
    monkeypatch.setattr(redisbloom, "upload_chunks", upload)
    return reads


def test_without_dual_writes_the_standby_is_never_read_back(target, tmp_path, monkeypatch):
    """An empty standby (BF.CARD 0) has no bits to merge: no BF.SCANDUMP of its data, the one
    command a rebuild sends that the module sizes (chunks of up to 16 MiB), not bloomctl."""
    if target.backend.name != "redisbloom":
        pytest.skip("the bitmap upload ORs into the standby: it never reads it")
    reads = spy_on_standby_reads(monkeypatch)
    path = write_items(tmp_path / "items.csv", [f"user:{i}" for i in range(5000)])
    report = rebuild(target, "users", path, "-c", "10000", "-e", "1%", "--nonscaling", "--build", "client")
    assert report["build"] == "client" and reads == []
    assert all(Filter(target.client, "users").mexists(["user:0", "user:4999"]))


def test_a_write_between_the_upload_and_the_cutover_is_merged(target, tmp_path, monkeypatch):
    """RedisBloom: the cutover script sees BF.CARD move (a dual write landed after the count was
    read) and reads the standby; the written item is in the result. Bitmap: ORing needs no check."""
    if target.backend.name != "redisbloom":
        pytest.skip("the bitmap upload ORs into the standby: nothing to race")
    written: list[bytes] = []

    def write_once(standby: bytes) -> None:
        if not written:
            target.backend.madd(target.client, standby, [b"late:write"])
            written.append(standby)

    reads = spy_on_standby_reads(monkeypatch, write_once)
    path = write_items(tmp_path / "items.csv", [f"user:{i}" for i in range(5000)])
    report = rebuild(target, "users", path, "-c", "10000", "-e", "1%", "--nonscaling", "--build", "client")
    assert report["build"] == "client" and len(reads) == 1  # the cutover refused once, then read
    assert Filter(target.client, "users").exists("late:write")


def test_dual_writes_that_never_stop_send_the_build_to_the_server(target, tmp_path, monkeypatch):
    """When every cutover attempt finds the standby changed, auto finishes on the server path
    (nothing uploaded had replaced the standby); the written items are all there."""
    if target.backend.name != "redisbloom":
        pytest.skip("the bitmap upload ORs into the standby: nothing to race")
    counter = iter(range(10**6))

    def write(standby: bytes) -> None:
        target.backend.madd(target.client, standby, [f"busy:{next(counter)}".encode()])

    spy_on_standby_reads(monkeypatch, write)
    path = write_items(tmp_path / "items.csv", [f"user:{i}" for i in range(5000)])
    report = rebuild(target, "users", path, "-c", "10000", "-e", "1%", "--nonscaling")
    assert report["build"] == "server" and "during 8 merges" in report["build_note"]
    written = [f"busy:{i}" for i in range(next(counter))]
    assert len(written) == 9 and all(Filter(target.client, "users").mexists([*written, "user:0", "user:4999"]))
    assert companions(target, "build") == []


def test_without_numpy_auto_builds_on_the_server(target, tmp_path, monkeypatch):
    """The plain install (no numpy) keeps the server path; asking for the client says what to install."""
    from bloomctl import extras

    real = extras.missing
    hidden = extras.MissingExtra("numpy is not installed (a client build needs it): pip install 'redis-bloomctl[fast]'")
    monkeypatch.setattr(extras, "missing", lambda name: hidden if name == extras.CLIENT_BUILD else real(name))
    path = write_items(tmp_path / "items.csv", [f"user:{i}" for i in range(1000)])
    args = ["-c", "5000", "-e", "1%", "--nonscaling", "--swap"]
    auto = target.cli("rebuild", "users", "--from-csv", path, *args, "--format", "json")
    assert auto.exit_code == 0, auto.stderr
    assert json.loads(auto.stdout)["build"] == "server" and "numpy is not installed" in auto.stderr
    forced = target.cli("rebuild", "users", "--from-csv", path, *args, "--build", "client")
    assert forced.exit_code == 9 and "pip install 'redis-bloomctl[fast]'" in forced.stderr  # before any write
    assert not target.client.exists(KeyFamily.of("users").standby)


def bits_of(target, key: str) -> bytes:
    return target.dump(key, header=False)


def test_jobs_build_the_same_bits_in_parallel(target, tmp_path):
    """--jobs 2 (each process on the items a hash gives it) gives the bits of --jobs 1; the count, the sum
    of the parts' counts, is within 0.1% on distinct items (false positives across the parts)."""
    path = write_items(tmp_path / "items.csv", [f"user:{i}@example.com" for i in range(200_000)])
    args = ["-c", "400000", "-e", "1%", "--nonscaling", "--build", "client", "--backend", target.backend.name]
    one = rebuild(target, "one", path, *args)
    two = rebuild(target, "two", path, *args, "--jobs", "2")
    assert bits_of(target, "one") == bits_of(target, "two")
    assert abs(two["added"] - one["added"]) <= one["items_read"] // 1000
    assert (two["items_read"], two["rows"], two["verified"]) == (one["items_read"], one["rows"], one["verified"])


def test_jobs_split_a_sql_source_by_a_column(target, sqlite_engine):
    import sqlalchemy

    with sqlite_engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE users (id INTEGER, email TEXT)"))
        rows = [{"id": i if i % 97 else None, "email": f"u{i}@x"} for i in range(-500, 20_000)]
        conn.execute(sqlalchemy.text("INSERT INTO users VALUES (:id, :email)"), rows)
    url = sqlite_engine.url.render_as_string(hide_password=False)
    args = ["--from-sql", "SELECT email, id FROM users", "--db-url", url, "-c", "50000", "-e", "1%", "--nonscaling"]
    args += ["--build", "client", "--backend", target.backend.name, "--swap", "--format", "json"]
    one = target.cli("rebuild", "one", *args)
    two = target.cli("rebuild", "two", *args, "--jobs", "3", "--split-column", "id")
    assert one.exit_code == 0 and two.exit_code == 0, two.stderr
    assert json.loads(two.stdout)["items_read"] == json.loads(one.stdout)["items_read"] == 20_500  # NULL ids too
    assert bits_of(target, "one") == bits_of(target, "two")


def test_jobs_need_a_split_column_for_sql_and_a_file_not_stdin(target, tmp_path):
    bad = target.cli("rebuild", "u", "--from-csv", "-", "-c", "100", "-e", "1%", "--jobs", "2", input="a\nb\n")
    assert bad.exit_code == 2 and "--jobs reads the file once in every job" in bad.stderr
    sql = target.cli(
        "rebuild", "u", "--from-sql", "SELECT 1 AS x", "--db-url", "sqlite://", "-c", "100", "-e", "1%", "--jobs", "2"
    )
    assert sql.exit_code == 2 and "needs --split-column" in sql.stderr
    server = target.cli(
        "rebuild",
        "u",
        "--from-csv",
        write_items(tmp_path / "x.csv", ["a"]),
        "-c",
        "100",
        "-e",
        "1%",
        "--jobs",
        "2",
        "--build",
        "server",
    )
    assert server.exit_code == 2 and "leave out --jobs with --build server" in server.stderr


def test_jobs_share_items_by_hash_even_where_the_csv_module_takes_over(target, tmp_path):
    """A literal quote inside an unquoted field part-way sends the rest of the file to the csv
    module, at a point that depends on pyarrow's read-ahead: every job still reads every item
    exactly once (they share items by hash, not by batch number)."""
    items = [f"user:{i}" for i in range(120_000)]
    items[60_000] = 'ab"c'  # legal unquoted in the csv module's eyes, not in the fast path's
    path = write_items(tmp_path / "items.csv", items)
    args = ["-c", "300000", "-e", "1%", "--nonscaling", "--build", "client", "--backend", target.backend.name]
    one = rebuild(target, "one", path, *args)
    two = rebuild(target, "two", path, *args, "--jobs", "2")
    assert two["items_read"] == one["items_read"] == 120_000
    assert bits_of(target, "one") == bits_of(target, "two")
    assert all(Filter(target.client, "two").mexists(items))


def test_jobs_count_a_repeated_item_once(target, tmp_path):
    """Each item twice, shuffled: a repeat goes to the job that has the first, so the count is
    the distinct items' (a NONSCALING filter sized for them is not reported full)."""
    items = [f"user:{i}" for i in range(50_000)] * 2
    random.Random(3).shuffle(items)
    path = write_items(tmp_path / "items.csv", items)
    args = ["-c", "60000", "-e", "1%", "--nonscaling", "--build", "client", "--backend", target.backend.name]
    one = rebuild(target, "one", path, *args)
    two = rebuild(target, "two", path, *args, "--jobs", "2")
    assert one["added"] < 50_000 and abs(two["added"] - one["added"]) <= 50, (one["added"], two["added"])
    assert bits_of(target, "one") == bits_of(target, "two")


def test_jobs_split_a_sql_source_by_a_fractional_column(target, sqlite_engine):
    """2.5 % 2 is 0.5, which no job would match: the split column is cast to an integer first."""
    import sqlalchemy

    with sqlite_engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE users (k REAL, email TEXT)"))
        conn.execute(
            sqlalchemy.text("INSERT INTO users VALUES (:k, :email)"),
            [{"k": i / 4, "email": f"u{i}"} for i in range(8000)],
        )
    url = sqlite_engine.url.render_as_string(hide_password=False)
    args = ["--from-sql", "SELECT email, k FROM users", "--db-url", url, "-c", "20000", "-e", "1%", "--nonscaling"]
    result = target.cli("rebuild", "f", *args, "--jobs", "2", "--split-column", "k", "--swap", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["items_read"] == 8000
    assert all(Filter(target.client, "f").mexists([f"u{i}" for i in range(8000)]))


def test_jobs_split_a_postgresql_numeric_column(target, pg_engine):
    import sqlalchemy

    table = f"bloomctl_split_{random.getrandbits(32):08x}"
    with pg_engine.begin() as conn:
        conn.execute(
            sqlalchemy.text(
                f"CREATE TABLE {table} AS SELECT g / 4.0 AS k, 'u' || g AS email FROM generate_series(1, 6000) g"
            )
        )
    try:
        url = pg_engine.url.render_as_string(hide_password=False)
        args = [
            "--from-sql",
            f"SELECT email, k FROM {table}",
            "--db-url",
            url,
            "-c",
            "20000",
            "-e",
            "1%",
            "--nonscaling",
        ]
        result = target.cli("rebuild", "f", *args, "--jobs", "3", "--split-column", "k", "--swap", "--format", "json")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["items_read"] == 6000
        assert all(Filter(target.client, "f").mexists([f"u{g}" for g in range(1, 6001)]))
    finally:
        with pg_engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP TABLE {table}"))


def test_a_failed_upload_leaves_no_copy_of_the_filter(target, tmp_path, monkeypatch):
    """The upload dies after the build's key was created (a dropped connection, an OOM, Ctrl-C):
    the key goes with it, and it expires anyway should the process be killed outright."""
    if target.backend.name != "redisbloom":
        pytest.skip("the bitmap upload ORs into the standby: no copy is made")
    import redis

    from bloomctl.rebuild.build import redisbloom

    ttls: list[int] = []

    def upload(client, key, data, starts):
        ttls.append(target.client.pttl(key))
        raise redis.exceptions.ConnectionError("simulated: the connection dropped")

    monkeypatch.setattr(redisbloom, "upload_chunks", upload)
    path = write_items(tmp_path / "items.csv", [f"user:{i}" for i in range(5000)])
    result = target.cli(
        "rebuild", "users", "--from-csv", path, "-c", "10000", "-e", "1%", "--build", "client", "--swap"
    )
    assert result.exit_code != 0 and "Traceback" not in result.stderr
    assert 0 < ttls[0] <= redisbloom.BUILD_TTL_MS and companions(target, "build") == []
    assert not target.client.exists("users")  # nothing swapped: there was no filter before


def test_the_swapped_in_filter_keeps_no_expiry_of_the_upload(target, tmp_path):
    path = write_items(tmp_path / "items.csv", [f"user:{i}" for i in range(5000)])
    report = rebuild(target, "users", path, "-c", "10000", "-e", "1%", "--build", "client")
    assert report["build"] == "client" and target.client.pttl("users") == -1


def test_no_room_for_the_uploads_copy_builds_on_the_server(target, tmp_path):
    """The upload needs a second copy of the filter on the server until the cutover; where that
    does not fit, auto builds on the server, so an evicting server drops nothing."""
    if target.backend.name != "redisbloom" or target.cluster:
        pytest.skip("RedisBloom's upload copy; one node's memory")
    path = write_items(tmp_path / "items.csv", [f"user:{i}" for i in range(20_000)])
    assert rebuild(target, "users", path, "-c", "1M", "-e", "1%", "--nonscaling")["build"] == "client"
    client = target.client
    used = client.info("memory")["used_memory"]
    client.config_set("maxmemory", str(used + 1_800_000))  # the 1.2 MB standby fits, a second copy does not
    client.config_set("maxmemory-policy", "allkeys-lru")
    evicted = client.info("stats")["evicted_keys"]
    try:
        report = rebuild(target, "users", path)
        assert report["build"] == "server" and "no room" in report["build_note"], report
        assert client.info("stats")["evicted_keys"] == evicted
    finally:
        client.config_set("maxmemory", "0")
        client.config_set("maxmemory-policy", "noeviction")
    assert all(Filter(client, "users").mexists(["user:0", "user:19999"]))


def build_with_dual_writes(target, tmp_path, monkeypatch, where: str, written: list[str], items: int = 5000) -> dict:
    """A client build of user:0..``items``-1 into a NONSCALING filter of 10,000 while the
    application writes ``written`` into the standby before the upload (on ``where``'s backend
    only); the rebuild's report."""
    if target.backend.name != where:
        pytest.skip("one backend per case")
    from bloomctl.rebuild.build import bitmap, redisbloom

    module = redisbloom if where == "redisbloom" else bitmap
    real_finish = module.finish

    def finish(client, family, layout, array, generation, check):
        target.backend.madd(target.client, family.standby, [item.encode() for item in written])
        return real_finish(client, family, layout, array, generation, check)

    monkeypatch.setattr(module, "finish", finish)
    path = write_items(tmp_path / "items.csv", [f"user:{i}" for i in range(items)])
    report = rebuild(target, "users", path, "-c", "10000", "-e", "1%", "--nonscaling", "--build", "client")
    assert report["build"] == "client"
    return report


@pytest.mark.parametrize("where", ["redisbloom", "bitmap"])
def test_dual_writes_during_the_build_are_counted_on_both_backends(target, tmp_path, monkeypatch, where):
    """Items the application wrote to the standby before the upload count with the build's own,
    on RedisBloom as on the bitmap backend (which counts them in its header already)."""
    written = [f"dual:{i}" for i in range(50)]
    report = build_with_dual_writes(target, tmp_path, monkeypatch, where, written)
    assert target.card("users") == report["added"] + 50
    assert all(Filter(target.client, "users").mexists(written))


@pytest.mark.parametrize("where", ["redisbloom", "bitmap"])
def test_dual_writes_of_items_the_source_holds_are_counted_once(target, tmp_path, monkeypatch, where):
    """The application writes items the source holds too (2,000 of 5,000) into the standby during
    a client build: both counted them, and the filter recorded 7,000 items its bits did not hold
    (seen: 493,994 for 400,000 distinct), so it looked fuller than it was and its dump was refused
    as forged. The count is settled against the merged bits, and the dump restores."""
    build_with_dual_writes(target, tmp_path, monkeypatch, where, [f"user:{i}" for i in range(2000)])
    assert abs(target.card("users") - 5000) <= 50, target.card("users")
    dump = tmp_path / "users.bfdump"
    assert target.cli("dump", "users", "-o", str(dump)).exit_code == 0
    restored = target.cli("restore", "copy", "-i", str(dump))
    assert restored.exit_code == 0, restored.stderr


@pytest.mark.parametrize("where", ["redisbloom", "bitmap"])
def test_repeated_dual_writes_do_not_fill_a_filter_near_its_capacity(target, tmp_path, monkeypatch, where):
    """9,950 source items into a NONSCALING filter of 10,000, and the application writes 90 of
    them again into the standby: the sum, 10,040, was within the estimate's noise, so it stood.
    RedisBloom then took the swapped filter for full and refused every new item the application
    added (false negatives, exit 0); the bitmap build was refused as over capacity. A sum past
    the capacity that the bits put within it is settled, as a parallel build's is."""
    build_with_dual_writes(target, tmp_path, monkeypatch, where, [f"user:{i}" for i in range(90)], items=9950)
    assert target.card("users") <= 10_000, target.card("users")
    new = [f"new:{i}" for i in range(20)]
    Filter(target.client, "users").madd(new)  # (on a full filter, an error or each item refused)
    assert all(Filter(target.client, "users").mexists([*new, "user:0", "user:9949"]))


def test_an_items_share_does_not_depend_on_the_batches_it_came_in():
    """What --jobs relies on: whichever batches a process cut the source into (they move where
    the csv module takes over from pyarrow), each item, and every repeat of it, falls to the
    same process, and every item to exactly one."""
    pa = pytest.importorskip("pyarrow")
    from bloomctl.rebuild.build.parallel import take_share

    rng = random.Random(11)
    items = [f"item:{rng.randrange(10**6)}".encode() for _ in range(20_000)]
    owners: dict[bytes, set[int]] = {}
    for cut in (1000, 4096, 7):  # three different batchings, as lists and as Arrow arrays
        taken: list[bytes] = []
        for index in range(3):
            for start in range(0, len(items), cut):
                batch = items[start : start + cut]
                mine = take_share(pa.array(batch, pa.binary()) if cut != 7 else batch, index, 3)
                mine = mine.to_pylist() if cut != 7 else mine
                taken += mine
                for item in mine:
                    owners.setdefault(item, set()).add(index)
        assert sorted(taken) == sorted(items)
    assert all(len(indexes) == 1 for indexes in owners.values())
    assert {index for indexes in owners.values() for index in indexes} == {0, 1, 2}


def test_a_killed_runs_upload_copy_goes_with_the_next_run(target, tmp_path, monkeypatch):
    """A run killed during its upload (kill -9: no cleanup) leaves its build key, which expires
    within the hour; the next run removes it at once (the standby's metadata names it)."""
    if target.backend.name != "redisbloom":
        pytest.skip("the bitmap upload ORs into the standby: no copy is made")
    from bloomctl.rebuild.build import redisbloom

    real_upload = redisbloom.upload_chunks

    def killed(client, key, data, starts):
        if b":build:" not in key:  # the probe's own upload onto its key: not the build's
            return real_upload(client, key, data, starts)
        raise SystemExit(137)  # stands for the end of the process: nothing after this runs ...

    real_unlink = target.client.__class__.unlink
    monkeypatch.setattr(redisbloom, "upload_chunks", killed)
    path = write_items(tmp_path / "items.csv", [f"user:{i}" for i in range(5000)])
    args = ["-c", "10000", "-e", "1%", "--build", "client", "--swap"]
    with monkeypatch.context() as patch:  # ... not even the finally clauses' unlink of the copy
        patch.setattr(
            target.client.__class__,
            "unlink",
            lambda self, *keys: 0 if any(b":build:" in k for k in keys) else real_unlink(self, *keys),
        )
        target.cli("rebuild", "users", "--from-csv", path, *args)
        left = companions(target, "build")
    assert len(left) == 1 and 0 < target.client.pttl(left[0]) <= redisbloom.BUILD_TTL_MS
    target.client.delete(KeyFamily.of("users").lock)  # the killed run's lock would expire by itself
    monkeypatch.undo()
    report = rebuild(target, "users", path, "-c", "10000", "-e", "1%", "--build", "client")
    assert report["build"] == "client" and companions(target, "build") == []
    assert "build" not in read_metadata(target.client, KeyFamily.of("users").meta)


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_a_rebuild_that_reads_no_dataframe_never_imports_pandas(bloom, tmp_path, kind):
    """pyarrow's pa.array() and pa.scalar() import pandas where it is installed (the dask extra
    brings it), to ask whether their input is a DataFrame, and so does pyarrow.dataset: 0.24 s
    of every client build's start. bloomctl's values are made from buffers and its Parquet files
    read with ParquetFile; a fresh interpreter shows pandas unloaded."""
    pytest.importorskip("pandas")  # (without pandas there is nothing to import)
    import subprocess
    import sys

    source = tmp_path / "ids.csv"
    source.write_text("id,name\n" + "".join(f"u{i},n{i}\n" for i in range(3000)))
    if kind == "parquet":
        import pyarrow.csv as pcsv
        import pyarrow.parquet as pq

        pq.write_table(pcsv.read_csv(source), str(tmp_path / "ids.parquet"), row_group_size=1000)
        source = tmp_path / "ids.parquet"
    code = (
        "import sys\nfrom bloomctl.cli import main\n"
        f"sys.argv = ['bloomctl', '--url', {bloom.url!r}, '-q', 'rebuild', 'k', '--from-{kind}', {str(source)!r},"
        " '--template', 'x:{id}/{name}', '-c', '10000', '-e', '1%', '--build', 'client', '--swap']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    print(exc.code, 'pandas' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["0", "False"], result.stderr


def _build_scripts(target, monkeypatch, when: str) -> None:
    """Another run takes the standby over (its generation) at ``when`` of a client build's upload."""
    from bloomctl.rebuild.build import bitmap, redisbloom

    def take_over(standby: bytes) -> None:
        if standby == KeyFamily.of("users").standby:  # (not the probe's filter, built first)
            target.client.hset(KeyFamily.of("users").standby_meta, "generation", "another-run")

    if when == "upload":  # RedisBloom: after the build's copy is filled, before the cutover script
        real = redisbloom.upload_chunks

        def upload(client, key, data, starts):
            sent = real(client, key, data, starts)
            if b":build:" in key:
                take_over(key.split(b":build:")[0] + b":standby")
            return sent

        monkeypatch.setattr(redisbloom, "upload_chunks", upload)
    elif when == "or":  # bitmap: before the first chunk is ORed into the standby
        real_finish = bitmap.finish

        def finish(client, family, layout, array, generation, check):
            take_over(family.standby)
            return real_finish(client, family, layout, array, generation, check)

        monkeypatch.setattr(bitmap, "finish", finish)
    else:  # bitmap: after the chunks, before the count is added
        real_count = bitmap.server_count

        def server_count(client, key):
            take_over(key)
            return real_count(client, key)

        monkeypatch.setattr(bitmap, "server_count", server_count)


@pytest.mark.parametrize("when", ["upload", "or", "count"])
def test_a_client_build_writes_nothing_into_a_standby_another_run_took(target, tmp_path, monkeypatch, when):
    """The upload scripts stop at a standby another run took over (its generation): none of this
    run's bits or count reach it (each case kills a hand-made mutant: scripts/lua_mutants.py)."""
    if (target.backend.name == "redisbloom") != (when == "upload"):
        pytest.skip("each backend's own scripts")
    if target.cluster:
        pytest.skip("the scripts are the same on every topology")
    path = write_items(tmp_path / "u.csv", [f"user:{i}" for i in range(2000)])
    _build_scripts(target, monkeypatch, when)
    standby = KeyFamily.of("users").standby
    args = ["-c", "10000", "-e", "1%", "--nonscaling", "--build", "client", "--swap"]
    result = target.cli("rebuild", "users", "--from-csv", str(path), *args)
    assert result.exit_code == 5 and "replaced by another run" in result.stderr, result.stderr
    assert not target.client.exists("users")  # nothing swapped in
    assert target.client.hget(KeyFamily.of("users").standby_meta, "generation") == b"another-run"
    backend = get(target.backend.name)  # the other run's standby: none of this run's items or count
    assert backend.card(target.client, standby) == 0
    if when != "count":  # (at "count" its bits were ORed in before the take-over)
        assert not any(backend.mexists(target.client, standby, [f"user:{i}".encode() for i in range(50)]))


def test_a_discard_removes_only_the_runs_own_standby(target):
    """A run that failed discards its standby, unless another run has replaced it meanwhile."""
    from bloomctl.lifecycle.lock import FilterLock
    from bloomctl.lifecycle.standby import Standbys, Targets
    from bloomctl.sizing.bloom import plan

    client = target.client
    family = KeyFamily.of("users")
    the_plan = plan(1000, 0.01, None if target.backend.name == "bitmap" else 2)
    client.set(family.standby, b"another run's standby")
    client.hset(family.standby_meta, mapping={"generation": "another-run", "state": "loading"})
    mine = Standbys(client, Targets([family.active], the_plan), FilterLock(client, family.active), "this-run")
    assert mine.discard() == 0
    assert client.get(family.standby) == b"another run's standby"
    client.hset(family.standby_meta, "generation", "this-run")
    assert mine.discard() == 1 and not client.exists(family.standby, family.standby_meta)
