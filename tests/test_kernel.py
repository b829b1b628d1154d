"""The client build's native kernel against its reference, numpy, and against the servers.

The kernel hashes each item and sets its bits in one pass; numpy hashes a whole batch and sorts
its positions. Both must give the same bits and the same count (the items that set a new bit, as
the server counts them) for every layout, item length and buffer shape; the rebuilds at the end
compare both with the server's own filter.
"""

from __future__ import annotations

import json
import os
import random

import pytest

np = pytest.importorskip("numpy")

from bloomctl import native as kernel  # noqa: E402
from bloomctl.errors import UsageError  # noqa: E402
from bloomctl.lifecycle.manifest import read_manifest  # noqa: E402
from bloomctl.rebuild.build import bitmap, redisbloom  # noqa: E402
from bloomctl.rebuild.build.bits import BitArray  # noqa: E402
from bloomctl.rebuild.build.items import buffers  # noqa: E402

CLIENT_BUILD = pytest.mark.matrix("rebuild, built in the client")  # docs/compatibility.md's row


@pytest.fixture(scope="module")
def native():
    if os.environ.get(kernel.KERNEL_ENV, "auto") == "numpy":
        pytest.skip(f"{kernel.KERNEL_ENV}=numpy: this run checks the numpy code alone")
    found = kernel.native()
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the native kernel is not built: pip install -e . needs a C compiler (gcc)")
        pytest.skip("the native kernel is not built here (no C compiler when pip installed bloomctl)")
    return found


def awkward(n: int, seed: int) -> list[bytes]:
    """Items of every length from 0 to 300 bytes (every tail length, many blocks), binary, with repeats."""
    rng = random.Random(seed)
    items = [rng.randbytes(length) for length in range(301)]
    items += [rng.randbytes(rng.randrange(0, 301)) for _ in range(n)]
    return items + items[::7]


# (bytes, hashes); past 64 hashes (error rates below about 1e-19) the kernel takes another loop
LAYOUTS = [(1, 1), (8, 7), (17, 13), (1000, 7), (4096, 3), (65_536, 10), (100_003, 20), (125_000, 64), (125_000, 65)]
LAYOUTS += [(250_000, 200)]


def reference(scheme, layout, items: list[bytes]) -> BitArray:
    array = BitArray(layout.nbytes, msb_first=scheme is bitmap)
    for start in range(0, len(items), 500):  # several batches: the count carries across them
        array.add(scheme.positions(layout, items[start : start + 500]))
    return array


def layout_of(scheme, nbytes: int, hashes: int):
    if scheme is redisbloom:
        return redisbloom.Layout(b"", nbytes, nbytes * 8, hashes, 10**9, False)
    return bitmap.Layout(nbytes, nbytes * 8, hashes, 10**9)


def native_build(native, scheme, layout, items: list[bytes], batch: int = 500) -> tuple[np.ndarray, int]:
    bits, count = np.zeros(layout.nbytes, dtype=np.uint8), 0
    for start in range(0, len(items), batch):
        data, offsets = buffers(items[start : start + batch])
        count += scheme.native_add(native, layout, bits, data, offsets)
    return bits, count


@pytest.mark.parametrize("scheme", [redisbloom, bitmap], ids=["redisbloom", "bitmap"])
@pytest.mark.parametrize("nbytes, hashes", LAYOUTS)
def test_the_kernel_sets_the_bits_and_counts_of_numpy(native, scheme, nbytes, hashes):
    items = awkward(3000, seed=nbytes + hashes)
    layout = layout_of(scheme, nbytes, hashes)
    expected = reference(scheme, layout, items)
    bits, count = native_build(native, scheme, layout, items)
    assert count == expected.count
    assert np.array_equal(bits, expected.data)
    if nbytes >= 1000:
        assert 0 < count < len(items)  # the repeats (and, in a small filter, false positives) are not counted


@pytest.mark.parametrize("scheme", [redisbloom, bitmap], ids=["redisbloom", "bitmap"])
def test_any_alignment_and_offset_width_give_the_same_bits(native, scheme):
    """Items read at every byte alignment of the buffer, from int32 and int64 offsets that need
    not start at 0 (an Arrow slice), and from a pyarrow array sliced at an odd row."""
    pa = pytest.importorskip("pyarrow")
    items = awkward(500, seed=3)
    layout = layout_of(scheme, 4096, 7)
    expected = reference(scheme, layout, items)
    joined = b"".join(items)
    lengths = np.array([len(item) for item in items], dtype=np.int64)
    for shift in range(8):
        for dtype, width in ((np.int64, 8), (np.int32, 4)):
            storage = np.zeros(len(joined) + shift + 16, dtype=np.uint8)
            storage[shift : shift + len(joined)] = np.frombuffer(joined, dtype=np.uint8)
            offsets = np.zeros(len(items) + 1, dtype=dtype)
            offsets[1:] = np.cumsum(lengths)
            offsets += shift
            bits = np.zeros(layout.nbytes, dtype=np.uint8)
            adder = native.redisbloom_add if scheme is redisbloom else native.bitmap_add
            count = adder(storage, offsets, width, bits, layout.bits, layout.hashes)
            assert count == expected.count and np.array_equal(bits, expected.data), (shift, width)
    sliced = pa.array([b"pad", *items], type=pa.binary()).slice(1)  # offsets start past 0
    data, offsets = buffers(sliced)
    bits = np.zeros(layout.nbytes, dtype=np.uint8)
    count = scheme.native_add(native, layout, bits, data, offsets)
    first = BitArray(layout.nbytes, msb_first=scheme is bitmap)
    first.add(scheme.positions(layout, items))
    assert count == first.count and np.array_equal(bits, first.data)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"offsets": [0, 5, 3]}, "offsets must grow"),
        ({"offsets": [0, 2, 99]}, "stay within the data"),
        ({"offsets": [-1, 2]}, "from 0 or more"),
        ({"width": 2}, "int32 or int64"),
        ({"nbits": 8 * 16 + 1}, "fit the bit array"),
        ({"nbits": 0}, "at least 1"),
        ({"hashes": 0}, "between 1 and 2"),
        ({"hashes": (1 << 20) + 1}, "between 1 and 2"),
    ],
)
def test_a_wrong_buffer_is_refused_and_nothing_is_written(native, change, message):
    call = {"data": b"abcdefgh", "offsets": [0, 3, 8], "width": 8, "nbits": 8 * 16, "hashes": 3}
    call.update(change)
    offsets = np.array(call["offsets"], dtype=np.int64)
    bits = np.zeros(16, dtype=np.uint8)
    for adder in (native.redisbloom_add, native.bitmap_add):
        with pytest.raises(ValueError, match=message):
            adder(call["data"], offsets, call["width"], bits, call["nbits"], call["hashes"])
        assert not bits.any()
    with pytest.raises(TypeError):
        native.redisbloom_add(b"ab", np.array([0, 2]), 8, b"read-only", 8, 1)  # bits must be writable


@pytest.mark.parametrize("code", ["portable", "ni"])
def test_both_sha1_codes_give_hashlibs_bits(native, code):
    """The bitmap scheme's SHA-1: the portable C and the processor's SHA instructions (where it has
    them), each against numpy's positions from hashlib, for items of 0 to 300 bytes (one, two and
    several blocks, every padding case)."""
    was = native.sha1_code()
    try:
        native.sha1_code(code)
    except ValueError:
        pytest.skip("this processor has no SHA instructions")
    try:
        for nbytes, hashes in ((4096, 7), (125_000, 13)):
            items = awkward(2000, seed=nbytes)
            layout = layout_of(bitmap, nbytes, hashes)
            expected = reference(bitmap, layout, items)
            bits, count = native_build(native, bitmap, layout, items)
            assert count == expected.count and np.array_equal(bits, expected.data)
    finally:
        native.sha1_code(was)
    with pytest.raises(ValueError, match="no SHA-1 code"):
        native.sha1_code("md5")


@CLIENT_BUILD
def test_a_wrong_kernel_choice_is_refused_before_anything_is_written(target, tmp_path, monkeypatch):
    path = tmp_path / "items.csv"
    path.write_text("item\na\nb\n")
    monkeypatch.setenv(kernel.KERNEL_ENV, "fastest")
    result = target.cli("rebuild", "users", "--from-csv", str(path), "-c", "100", "-e", "1%", "--swap")
    assert result.exit_code == 2 and "BLOOMCTL_KERNEL must be one of auto, native, numpy" in result.stderr
    assert not target.client.exists("{users}:standby") and not target.client.exists("{users}:standby:meta")


def test_the_kernel_is_chosen_by_the_environment(native, monkeypatch):
    monkeypatch.setenv(kernel.KERNEL_ENV, "numpy")
    assert kernel.native() is None and kernel.name() == "numpy"
    monkeypatch.setenv(kernel.KERNEL_ENV, "native")
    assert kernel.native() is native
    monkeypatch.setenv(kernel.KERNEL_ENV, "fast")
    with pytest.raises(UsageError, match="BLOOMCTL_KERNEL must be one of auto, native, numpy"):
        kernel.native()


@CLIENT_BUILD
def test_a_tiny_error_rate_builds_in_the_client_too(target, tmp_path):
    """1e-20 needs 67 hashes: the kernel's other loop, with the bits the server sets."""
    path = tmp_path / "items.csv"
    path.write_text("item\n" + "".join(f"item-{i}\n" for i in range(3000)))
    common = ["--from-csv", str(path), "-c", "5000", "-e", "1e-20", "--nonscaling", "--swap", "--format", "json"]
    for key, build in (("c", "client"), ("s", "server")):
        result = target.cli("rebuild", key, *common, "--backend", target.backend.name, "--build", build)
        assert result.exit_code == 0, result.stderr
    assert target.dump("c") == target.dump("s") and target.card("c") == 3000


@CLIENT_BUILD
@pytest.mark.parametrize("choice", ["native", "numpy"])
def test_both_kernels_build_the_servers_own_filter(target, tmp_path, monkeypatch, native, choice):
    """A client build with either kernel gives the bytes and the count of the same items added on
    the server (sharded too), on every backend that builds in the client."""
    monkeypatch.setenv(kernel.KERNEL_ENV, choice)
    items = [item.hex() for item in awkward(2000, seed=11)]
    path = tmp_path / "items.csv"
    path.write_text("item\n" + "".join(f"{item}\n" for item in items))
    common = ["--from-csv", str(path), "-c", "9000", "-e", "1%", "--nonscaling", "--swap", "--format", "json"]
    for key, extra in (("c", ["--build", "client"]), ("s", ["--build", "server"])):
        result = target.cli("rebuild", key, *common, "--backend", target.backend.name, *extra)
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["build"] == extra[1]
    assert target.dump("c") == target.dump("s")
    assert target.card("c") == target.card("s")
    assert 0.99 * len(set(items)) < target.card("c") <= len(set(items))  # repeats count once
    for key, extra in (("sc", ["--build", "client"]), ("ss", ["--build", "server"])):
        result = target.cli("rebuild", key, *common, "--backend", target.backend.name, "--shards", "3", *extra)
        assert result.exit_code == 0, result.stderr
    built, served = read_manifest(target.client, "sc").members, read_manifest(target.client, "ss").members
    for member_c, member_s in zip(built, served, strict=True):
        assert target.dump(member_c.decode()) == target.dump(member_s.decode())


def strict_outcome(data: bytes, sizes: list[int], use_native: bool) -> tuple[str, int]:
    """What StrictStream makes of ``data`` read in blocks of ``sizes``: the problem it raises (or
    'ok') and how many bytes it had passed on by then."""
    import io

    from bloomctl.sources.arrow_csv import StrictStream
    from bloomctl.sources.arrow_errors import Unsure

    stream = StrictStream(io.BytesIO(data), b",")
    if not use_native:
        stream.native = None
    passed = 0
    try:
        for size in [*sizes, 1 << 20, 1 << 20]:
            buffer = bytearray(size)
            n = stream.readinto(buffer)
            assert bytes(buffer[:n]) == data[passed : passed + n]  # the bytes go through unchanged
            passed += n
    except Unsure as exc:
        # a block with both kinds of quote problem may name either first: the caller only
        # hands the file to the csv module, which finds the exact line itself
        return ("a quote problem" if "quote" in str(exc) else str(exc)), passed
    return "ok", passed


def test_the_kernels_csv_check_decides_as_numpys(native):
    """Strict CSV's quote rules in C against the numpy reference: random rows of quotes, commas,
    letters, line ends and non-ASCII bytes, cut into blocks anywhere (a quote, an escaped `""`,
    a CRLF or a UTF-8 sequence split across two reads)."""
    rng = random.Random(5)
    alphabet = [b'"', b'""', b",", b"a", b"\n", b"\r\n", "é".encode(), b"\xff"]
    outcomes = set()
    for _ in range(3000):
        data = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        if rng.random() < 0.5:  # well-formed fields too, or every case would be a problem
            fields = [
                b'"' + rng.choice([b"a", b'x""y', b"b,c", b""]) + b'"' if rng.random() < 0.5 else b"a" for _ in range(3)
            ]
            data = b",".join(fields) + b"\n" + data
        sizes = [rng.randrange(1, 9) for _ in range(rng.randrange(0, 6))]
        expected = strict_outcome(data, sizes, use_native=False)
        assert strict_outcome(data, sizes, use_native=True) == expected, (data, sizes)
        outcomes.add(expected[0])
    assert outcomes == {
        "ok",
        "a quote problem",
        "not valid UTF-8",
    }
