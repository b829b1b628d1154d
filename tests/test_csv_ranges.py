"""CSV files cut into byte ranges for --jobs: the cuts, each range read as the whole file reads it
there (items, counts, errors with their exact lines), and builds in several processes on real
servers with the bits of a build in one.

The cuts are checked three ways: the scan for them (native kernel and numpy) against a byte by
byte reference, every cut against the records the csv module finds reading the whole file, and
the items and statistics of the parts against one read, on both readers (pyarrow and the csv
module). Files here are small, so ``MIN_RANGE_BYTES`` is lowered to cut them all.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import itertools
import json
import os
import random
import time

import pytest

from bloomctl import native as kernel
from bloomctl.errors import SourceError
from bloomctl.sources import CsvSource, csv_cuts
from bloomctl.sources import csv as csv_source
from bloomctl.sources.base import SourceStats, item_list, merge_stats
from bloomctl.sources.csv_cuts import Scan, cut_ranges, scan_cuts_numpy
from tests.fixtures.redis import Target

np = pytest.importorskip("numpy")

SIGNATURE = codecs.BOM_UTF8


@pytest.fixture(autouse=True)
def cut_every_file(monkeypatch):
    monkeypatch.setattr(csv_source, "MIN_RANGE_BYTES", 0)


@pytest.fixture(params=["native", "numpy"])
def scan_kernel(request, monkeypatch):
    """Each scan test runs on the native kernel and on numpy (in chunks of 64 bytes, so that the
    small files still cross chunks)."""
    if request.param == "native":
        found = kernel.native() if os.environ.get(kernel.KERNEL_ENV, "auto") != "numpy" else None
        if found is None:
            pytest.skip("the native kernel is not in use here")
        return lambda data, delimiter, targets, stop: Scan(*found.csv_cuts(data, delimiter, targets, stop))
    monkeypatch.setattr(csv_cuts, "SCAN_CHUNK", 64)
    return scan_cuts_numpy


# --- the scan for cuts ---------------------------------------------------------------------


def reference_scan(data: bytes, delimiter: int, targets: list[int], stop: int) -> Scan:
    """What ``csv_cuts`` answers, byte by byte: the spec, written plainly."""
    size, special = len(data), {ord('"'), 10, 13, delimiter}
    quotes = lines = 0
    problem = None
    cuts: list[tuple[int, int]] = []  # every cut: position, line breaks before it
    for i, byte in enumerate(data):
        if i == stop and problem is None:
            problem = i
        if byte == ord('"'):
            if quotes % 2 == 0:
                fine = (data[i - 1] if i else 10) in special
            else:
                fine = i + 1 == size or data[i + 1] in special
            if not fine and problem is None:
                problem = i
            quotes += 1
        if byte == 10 or (byte == 13 and (i + 1 == size or data[i + 1] != 10)):
            lines += 1
        if byte == 10 and quotes % 2 == 0 and data[i + 1 : i + 4] != SIGNATURE:
            cuts.append((i + 1, lines))
    allowed = [(at, n) for at, n in cuts if problem is None or at <= problem]
    found: list[tuple[int, int]] = []
    for target in targets:
        cut = next(((at, n) for at, n in allowed if at >= target), None)
        if cut is None:
            break
        found.append(cut)
    if len(found) == len(targets):
        end, stopped, safe = (found[-1][0] if found else 0), -1, (0, 0)
    elif problem is not None:
        end, stopped, safe = problem, problem, (allowed[-1] if allowed else (0, 0))
    else:
        end, stopped, safe = size, -1, (0, 0)
    high = next((i for i, byte in enumerate(data) if byte >= 0x80), -1)
    return Scan([at for at, _ in found], [n for _, n in found], stopped, *safe, high if high < end else -1)


def random_bytes(rng: random.Random) -> bytes:
    """Anything: stray quotes, lone carriage returns, signatures, bytes that are not UTF-8."""
    pieces = [b'"', b'""', b"\n", b"\r\n", b"\r", b",", b";", b"a", b"bc", "é".encode(), SIGNATURE, b"\xff"]
    return b"".join(rng.choice(pieces) for _ in range(rng.randrange(0, 400)))


def random_csv(rng: random.Random, rows: int = 30) -> bytes:
    """Strict CSV: quoted fields holding delimiters, escaped quotes, \\n and \\r\\n; \\n or \\r\\n line
    ends; a header or not; a last line with or without its line end."""
    end = rng.choice(["\n", "\r\n"])
    lines = ["id,name,note"] if rng.random() < 0.5 else []
    for i in range(rng.randrange(0, rows)):
        fields = [str(i)]
        for _ in range(2):
            value = "".join(
                rng.choice(["a", "b ", ",", "\n", "\r\n", '"', "é", ""]) for _ in range(rng.randrange(0, 6))
            )
            if rng.random() < 0.6 or any(c in value for c in ',"\n\r'):
                value = '"' + value.replace('"', '""') + '"'
            fields.append(value)
        lines.append(",".join(fields))
    return (end.join(lines) + rng.choice(["", end])).encode()


def test_the_scan_finds_the_cuts_of_the_reference(scan_kernel):
    rng = random.Random(5)
    for _ in range(1500):
        data = random_bytes(rng) if rng.random() < 0.5 else random_csv(rng)
        targets = sorted(rng.randrange(0, len(data) + 1) for _ in range(rng.randrange(0, 6)))
        stop = rng.choice([len(data), rng.randrange(0, len(data) + 1)])
        delimiter = rng.choice([ord(","), ord(";")])
        assert scan_kernel(data, delimiter, targets, stop) == reference_scan(data, delimiter, targets, stop), (
            data,
            delimiter,
            targets,
            stop,
        )


def test_the_scan_across_many_blocks(scan_kernel):
    """Long files: quotes and line ends at every offset of a 64-byte block and of a chunk."""
    rng = random.Random(8)
    for _ in range(20):
        data = b"".join(random_csv(rng, rows=300) for _ in range(3))
        targets = sorted(rng.randrange(0, len(data) + 1) for _ in range(8))
        assert scan_kernel(data, ord(","), targets, len(data)) == reference_scan(data, ord(","), targets, len(data))


def test_the_kernel_refuses_targets_out_of_order():
    found = kernel.native() if os.environ.get(kernel.KERNEL_ENV, "auto") != "numpy" else None
    if found is None:
        pytest.skip("the native kernel is not in use here")
    with pytest.raises(ValueError, match="targets must ascend"):
        found.csv_cuts(b"a\nb\n", ord(","), [3, 1], 4)
    with pytest.raises(ValueError, match="targets must ascend"):
        found.csv_cuts(b"a\nb\n", ord(","), [5], 4)


# --- every cut is where a read of the whole file starts a record ------------------------------


def record_starts(data: bytes, encoding: str = "utf-8") -> dict[int, int]:
    """Where the csv module, reading the whole file as ``CsvSource`` feeds it (line by line, an
    undecodable line as an empty one), starts each record: byte offset -> line breaks before it."""
    lines = data.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    state = {"line": 0}

    def decoded():
        for raw in lines:
            state["line"] += 1
            try:
                yield raw.decode(encoding)
            except UnicodeDecodeError:
                yield "\n"

    reader = csv.reader(decoded(), strict=True)
    starts = {}
    while True:
        starts[offsets[state["line"]]] = state["line"]
        try:
            next(reader)
        except StopIteration:
            return starts
        except csv.Error:
            continue


def test_every_cut_starts_a_record_of_the_whole_read():
    rng = random.Random(13)
    checked = 0
    for _ in range(1500):
        data = random_bytes(rng) if rng.random() < 0.4 else random_csv(rng)
        if not data:
            continue
        starts = record_starts(data)
        for parts in (2, 3, 5, 8):
            ranges = cut_ranges(data, ord(","), parts, "utf-8")
            assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
            assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
            for start, _end, lines in ranges[1:]:
                if start < len(data):
                    assert starts.get(start) == lines, (data, parts, start)
                    checked += 1
    assert checked > 3000


def test_no_cut_past_a_quote_strict_csv_refuses_or_a_byte_that_is_not_text():
    """A literal quote in an unquoted field (the csv module takes it as text) or a line that
    cannot be decoded (read as an empty row) would move the records from the quotes' count: the
    cuts stop before them, and the part before reads the rest."""
    rows = b"".join(b'%d,"x\ny",z\n' % i for i in range(100))
    for fault in (b'9,ab"c,x\n', b'9,"\xff,x\n', b'9,"ab"c,x\n'):
        data = rows + fault + rows
        ranges = cut_ranges(data, ord(","), 4, "utf-8")
        assert ranges[1][0] < len(rows) + 1 and ranges[2][0] == len(rows) and ranges[3][0] == len(data)
    clean = cut_ranges(rows + b'9,"\xc3\xa9",x\n' + rows, ord(","), 4, "utf-8")
    assert len({start for start, _end, _lines in clean}) == 4


def test_a_utf8_signature_never_starts_a_part():
    data = b"a\n" + SIGNATURE + b"b\nc\n"
    assert cut_ranges(data, ord(","), 2, "utf-8")[1][0] == len(b"a\n") + len(SIGNATURE) + 2


# --- each part reads what the whole read reads there ------------------------------------------


def quoted_rows(n: int, end: str = "\n") -> str:
    return "".join(f'{i},"name {i}, ""q""","line\none {i}"{end}' for i in range(n))


FILES = {
    "quoted newlines": "id,name,note\n" + quoted_rows(300),
    "crlf": "id,name,note\r\n" + quoted_rows(300, "\r\n"),
    "no trailing newline": "id,name,note\n" + quoted_rows(200) + '9,"last\nrow",x',
    "no header": quoted_rows(300),
    "empty lines": "id,name,note\n" + quoted_rows(100) + "\n\n" + quoted_rows(100) + "\n",
    "lone carriage returns": "id,name,note\n" + "".join(f"{i},n{i}\r{i},m{i}\n" for i in range(300)),
    "bad rows late": "id,name,note\n" + quoted_rows(200) + "9\n" + quoted_rows(100) + '9,"ab"c,x\n' + quoted_rows(50),
    "bad utf-8 late": "id,name,note\n" + quoted_rows(200) + "9,\udcff,x\n" + quoted_rows(100),
    "stray quote": "id,name,note\n" + quoted_rows(100) + '9,ab"c,x\n' + quoted_rows(100),
    "fewer rows than parts": "id,name,note\n1,a,b\n",
    "header only": "id,name,note\n",
}


def file_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def read_whole(source: CsvSource) -> tuple[list[bytes], SourceStats, str | None]:
    items: list[bytes] = []
    error = None
    try:
        for batch in source.fast_batches(37):
            items += item_list(batch)
    except SourceError as exc:
        error = str(exc)
    return items, source.stats, error


def read_in_parts(source: CsvSource, parts: int) -> tuple[list[bytes], SourceStats, str | None]:
    """The parts read one after the other, their outcome judged as ``build_parts`` judges it."""
    from bloomctl.rebuild.build.parallel import Part, _first_error

    pieces = [source.part(index, parts) for index in range(parts)]
    assert not source.shared_parse and all(piece.span is not None for piece in pieces)
    items: list[bytes] = []
    results: list[Part] = []
    failure = None
    for piece in pieces:
        mine: list[bytes] = []
        try:
            for batch in piece.fast_batches(37):
                mine += item_list(batch)
        except SourceError as exc:
            failure = exc
            break
        items += mine
        results.append(Part([], [], piece.stats, None, []))
    try:
        _first_error(source, pieces, results, failure, 37)
    except SourceError as exc:
        return items, merge_stats([r.stats for r in results] or [SourceStats()], False), str(exc)
    return items, merge_stats([r.stats for r in results], False), None


OPTIONS = [
    {"column": "name"},
    {"column": "3", "skip_bad_rows": 1},
    {"column": "name", "skip_bad_rows": 5},
    {"template": "{id}/{note}"},
    {"column": "note", "prefix": "p:"},
]


@pytest.mark.parametrize("reader", ["arrow", "csv module"])
@pytest.mark.parametrize("name", sorted(FILES))
def test_the_parts_read_what_the_whole_file_reads(tmp_path, monkeypatch, reader, name):
    from bloomctl.sources import arrow_csv

    monkeypatch.setattr(arrow_csv, "BLOCK_BYTES", 4096)  # pyarrow's blocks end inside the parts
    if reader == "csv module":
        monkeypatch.setattr(CsvSource, "_arrow_possible", lambda self: False)
    path = tmp_path / "t.csv"
    path.write_bytes(file_bytes(FILES[name]))
    for options in OPTIONS:
        if name == "no header":
            options = {key: value for key, value in options.items() if key not in ("column", "template")}
            options |= {"header": False, "column": "2"}
        items, stats, error = read_whole(CsvSource(str(path), **options))
        whole = (stats.rows, stats.blank, stats.bad_rows, stats.examples)
        for parts in (2, 3, 7):
            got, merged, got_error = read_in_parts(CsvSource(str(path), **options), parts)
            assert got_error == error, (options, parts)
            if error is None:
                assert got == items, (options, parts)
                assert (merged.rows, merged.blank, merged.bad_rows, merged.examples) == whole, (options, parts)


def test_random_files_read_the_same_in_parts(tmp_path):
    rng = random.Random(21)
    path = tmp_path / "r.csv"
    for _ in range(150):
        data = random_csv(rng, rows=60) if rng.random() < 0.7 else random_bytes(rng)
        path.write_bytes(data)
        options = {"column": "1", "header": False, "skip_bad_rows": 1000}
        items, stats, error = read_whole(CsvSource(str(path), **options))
        for parts in (2, 4):
            got, merged, got_error = read_in_parts(CsvSource(str(path), **options), parts)
            assert (got, got_error) == (items, error), data
            assert (merged.rows, merged.blank, merged.bad_rows, merged.examples) == (
                stats.rows,
                stats.blank,
                stats.bad_rows,
                stats.examples[:5],
            ), data


def test_latin1_and_a_one_byte_delimiter_are_cut_a_wider_one_is_not(tmp_path):
    path = tmp_path / "l.csv"
    path.write_bytes("id;name\n".encode("latin-1") + b"".join(b"%d;n\xe9%d\n" % (i, i) for i in range(500)))
    source = CsvSource(str(path), column="name", delimiter=";", encoding="latin-1")
    items, stats, _error = read_whole(source)
    got, merged, _ = read_in_parts(source, 3)
    assert got == items and merged.rows == stats.rows == 500
    wide = CsvSource(str(path), column="1", delimiter="§")
    wide.part(0, 2)
    assert wide.shared_parse  # "§" is two bytes in UTF-8: one of them could belong to another character


def test_what_cannot_be_cut_is_shared_out_by_hash(tmp_path, monkeypatch):
    text = "id,name\n" + "".join(f"{i},n{i}\n" for i in range(100))
    gz = tmp_path / "t.csv.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    small = tmp_path / "small.csv"
    small.write_text(text)
    assert CsvSource(str(gz)).part(1, 2).shared_parse
    monkeypatch.setattr(csv_source, "MIN_RANGE_BYTES", 1 << 20)
    source = CsvSource(str(small))
    part = source.part(1, 2)
    assert part.shared_parse and source.shared_parse and part.span is None
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    assert CsvSource(str(fifo)).part(1, 2).shared_parse  # (without opening it: that waits for a writer)


def test_a_file_changed_after_the_cut_is_refused_in_one_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("id,name\n" + "".join(f"{i},n{i}\n" for i in range(100)))
    source = CsvSource(str(path), column="name")
    part = source.part(1, 2)
    with open(path, "a") as f:
        f.write("100,n100\n")
    with pytest.raises(SourceError) as caught:
        list(part.fast_batches(10))
    assert str(caught.value) == f"the CSV file {path} changed while the jobs read it"
    fresh = source.part(0, 2)  # part 0 cuts again: the file as it is now
    assert fresh.listing is not None and fresh.listing[1] == os.path.getsize(path)


def test_a_same_size_rewrite_with_its_time_restored_is_refused(tmp_path):
    """`cp -p` or `rsync --inplace -t` over the file between the cut and a job's read: the size
    and the modification time are the old ones, the bytes are not (two rows re-padded). The old
    cuts must not be applied to the new bytes: the change time tells."""
    path = tmp_path / "t.csv"
    rows = [f"{i:05d},n{i}\n" for i in range(1000)]
    path.write_text("id,name\n" + "".join(rows))
    before = os.stat(path)
    source = CsvSource(str(path), column="name")
    part = source.part(1, 2)
    rows[10], rows[990] = "00010,n10x\n", "00990,n99\n"  # the same size in all
    time.sleep(0.01)
    path.write_text("id,name\n" + "".join(rows))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (os.stat(path).st_size, os.stat(path).st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    with pytest.raises(SourceError, match="changed while the jobs read it"):
        list(part.fast_batches(10))


@pytest.mark.parametrize(
    ("codec", "expected"),
    [("utf-8", True), ("utf-8-sig", True), ("latin-1", True), ("cp1252", True), ("iso8859-15", True)]
    + [(name, False) for name in ("shift_jis", "cp932", "gbk", "gb18030", "big5", "johab", "utf-16", "utf-7")],
)
def test_only_encodings_whose_ascii_bytes_stand_alone_are_cut(codec, expected):
    """In Shift_JIS 'ポ' is 0x83 0x7C: its second byte is a '|'. Counting quotes and delimiters
    byte by byte is right only where every byte below 0x80 is the character it looks like."""
    from bloomctl.sources.csv import bytes_stand_alone

    assert bytes_stand_alone(codec) is expected


def test_a_shift_jis_file_whose_bytes_look_like_delimiters_reads_whole(tmp_path):
    """A Shift_JIS file, '|'-delimited, with 'ポ"x|y' at its middle: cut by counting quotes, the
    second half was read from inside a quoted field (160,001 of 320,002 items, exit 0 with
    --skip-bad-rows). Such an encoding is shared out by hash: the parts read what one reads."""
    import codecs as codec_module

    row = lambda prefix, i: f"{prefix}{i:07d}|some value\n".encode("shift_jis")  # noqa: E731
    special = ('ポ"x|y\n' + 'a|"\n' + '"|b\n').encode("shift_jis")
    data = b"id|v\n" + b"".join(row("k", i) for i in range(2000)) + special
    data += b"".join(row("m", i) for i in range(2000))
    path = tmp_path / "sjis.csv"
    path.write_bytes(data)
    source = CsvSource(str(path), column="id", delimiter="|", encoding="shift_jis", skip_bad_rows=5)
    whole = sorted(item for batch in source.batches(1000) for item in batch)
    parts = [source.part(i, 2) for i in range(2)]
    assert all(part.shared_parse for part in parts)  # not cut: each reads the whole, keeps its share
    from bloomctl.rebuild.build.parallel import take_share

    shared = sorted(
        item for i, part in enumerate(parts) for batch in part.fast_batches(1000) for item in take_share(batch, i, 2)
    )
    assert [bytes(item) for item in shared] == whole and len(whole) == 4002
    assert codec_module.lookup("shift_jis").name == "shift_jis"


def test_a_line_that_begins_with_a_byte_order_mark_reads_the_same_on_every_path(tmp_path):
    """utf-8-sig: the csv-module path decoded each line with utf-8-sig, which drops a U+FEFF that
    begins a line; pyarrow and the fast path keep it. A part on the other path than one process
    built another item. Every path now keeps it (the file's own signature still goes)."""
    path = tmp_path / "sig.csv"
    path.write_bytes(codecs.BOM_UTF8 + b'id,note\n"q",x\n' + b"a,1\n" + codecs.BOM_UTF8 + b"b,2\n")
    items = [item for batch in CsvSource(str(path), column="id", encoding="utf-8-sig").batches(10) for item in batch]
    assert items == [b"q", b"a", codecs.BOM_UTF8 + b"b"]
    exact = CsvSource(str(path), column="id", encoding="utf-8-sig")
    exact._arrow_possible = lambda: False  # the csv-module path alone
    assert [item for batch in exact.batches(10) for item in batch] == items


# --- builds in several processes on real servers ----------------------------------------------


def awkward_csv(rows: int, end: str = "\n") -> str:
    """Quoted fields with delimiters, escaped quotes and line ends (\\n or \\r\\n), blank values,
    and no line end after the last row."""
    lines = ["id,email,note"]
    for i in range(rows):
        note = f'"said ""hi""{end}at {i}, twice"' if i % 3 else f"plain {i}"
        email = "" if i % 97 == 0 else (f'"u{i},x@example.com"' if i % 5 == 0 else f"u{i}@example.com")
        lines.append(f"{i},{email},{note}")
    return end.join(lines)


def rebuild(cli, key: str, path, *args: str):
    result = cli("rebuild", key, "--from-csv", str(path), "--swap", "--format", "json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def parts_made(monkeypatch):
    """Every part the build cut (``CsvSource.part``, in this process), as (index, part)."""
    made: list = []
    real = CsvSource.part

    def spy(self, index, parts, split_column=None):
        part = real(self, index, parts, split_column)
        made.append((index, part))
        return part

    monkeypatch.setattr(CsvSource, "part", spy)
    return made


@pytest.mark.parametrize("end", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_jobs_build_the_bits_of_one_process_from_byte_ranges(target, tmp_path, parts_made, end):
    path = tmp_path / "awkward.csv"
    path.write_bytes(awkward_csv(30_000, end).encode())
    args = ["--column", "email", "-c", "60000", "-e", "1%", "--nonscaling", "--build", "client"]
    args += ["--backend", target.backend.name]
    one = rebuild(target.cli, "one", path, *args)
    for jobs in ("2", "3"):
        many = rebuild(target.cli, "many", path, *args, "--jobs", jobs)
        assert target.dump("many", header=False) == target.dump("one", header=False), jobs
        assert (many["items_read"], many["rows"], many["blank"]) == (one["items_read"], one["rows"], one["blank"])
        assert many["rows"] == 30_000 and abs(many["added"] - one["added"]) <= 30, (many["added"], one["added"])
        assert target.card("many") == many["added"]
    spans = [part.span for _index, part in parts_made[-3:]]  # the --jobs 3 build's
    assert [start for start, _end, _lines in spans] == [0, spans[0][1], spans[1][1]]
    assert spans[2][1] == path.stat().st_size and spans[2][2] > 20_000  # (two lines a row, mostly)


def test_a_file_of_fewer_rows_than_jobs(bloom, tmp_path):
    target = Target("redisbloom", "standalone", bloom.url)
    path = tmp_path / "two.csv"
    path.write_text('id,email\n1,"a@x\nb"\n2,c@x')
    args = ["--column", "email", "-c", "100", "-e", "1%", "--build", "client"]
    one = rebuild(target.cli, "one", path, *args)
    many = rebuild(target.cli, "many", path, *args, "--jobs", "3")
    assert target.dump("many", header=False) == target.dump("one", header=False)
    assert many["rows"] == one["rows"] == 2 and many["added"] == one["added"] == 2


def bad_rows_file(path, bad_at: list[int], rows: int = 4000) -> None:
    lines = ["id,email,note"]
    for i in range(rows):
        lines.append(f"{i}" if i in bad_at else f'{i},u{i}@x,"n\n{i}"')
    path.write_text("\n".join(lines) + "\n")


def test_a_bad_row_in_the_second_range_has_its_exact_line(bloom, tmp_path, parts_made):
    target = Target("redisbloom", "standalone", bloom.url)
    path = tmp_path / "bad.csv"
    bad_rows_file(path, [3500])  # 1 header line, then 2 lines a row: row 3500 is on line 7002
    args = ["--column", "email", "-c", "10000", "-e", "1%", "--build", "client"]
    errors = set()
    for jobs in ("1", "2", "3"):
        result = target.cli("rebuild", "u", "--from-csv", str(path), *args, "--jobs", jobs, "--quiet")
        assert result.exit_code == 8, result.stderr
        errors.add(result.stderr)
    assert errors == {
        f"bloomctl: error: {path}:7002: 1 field(s), column 2 needed (--skip-bad-rows N tolerates up to N bad rows)\n"
    }
    first_of_two = next(part for index, part in parts_made if index == 1 and part.span[1] == path.stat().st_size)
    assert first_of_two.span[2] < 7001  # the bad row is in the second range, not the first


def test_bad_rows_are_tolerated_in_all_not_in_each_part(bloom, tmp_path):
    """One bad row in each half: `--skip-bad-rows 1` stops at the second, as one process does,
    and `--skip-bad-rows 2` counts both."""
    target = Target("redisbloom", "standalone", bloom.url)
    path = tmp_path / "bad.csv"
    bad_rows_file(path, [100, 3900])  # the second on line 1 + 2 * 3900 + 1, less the first one's missing line
    args = ["--column", "email", "-c", "10000", "-e", "1%", "--build", "client"]
    for jobs in ("1", "2"):
        stopped = target.cli("rebuild", "u", "--from-csv", str(path), *args, "--jobs", jobs, "--skip-bad-rows", "1")
        assert stopped.exit_code == 8 and f"{path}:7801: 1 field(s), column 2 needed" in stopped.stderr, stopped.stderr
        report = rebuild(target.cli, "u", path, *args, "--jobs", jobs, "--skip-bad-rows", "2")
        assert (report["rows"], report["bad_rows"], report["items_read"]) == (4000, 2, 3998), jobs


def test_a_file_changed_between_the_cut_and_the_read(bloom, tmp_path, monkeypatch):
    target = Target("redisbloom", "standalone", bloom.url)
    path = tmp_path / "moving.csv"
    path.write_text(awkward_csv(2000))
    real = csv_source.cut_ranges

    def cut_then_append(*args):
        ranges = real(*args)
        with open(path, "a") as f:
            f.write("\n9999,late@x,late")
        return ranges

    monkeypatch.setattr(csv_source, "cut_ranges", cut_then_append)
    args = ["--column", "email", "-c", "10000", "-e", "1%", "--build", "client", "--jobs", "2", "--quiet"]
    result = target.cli("rebuild", "u", "--from-csv", str(path), *args)
    assert result.exit_code == 8, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"bloomctl: error: the CSV file {path} changed while the jobs read it"
    ]


def test_gzip_and_small_files_still_share_out_by_hash(bloom, tmp_path, monkeypatch, parts_made):
    target = Target("redisbloom", "standalone", bloom.url)
    text = awkward_csv(5000)
    gz = tmp_path / "a.csv.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    plain = tmp_path / "a.csv"
    plain.write_text(text)
    args = ["--column", "email", "-c", "10000", "-e", "1%", "--nonscaling", "--build", "client"]
    one = rebuild(target.cli, "one", plain, *args)
    from_gzip = rebuild(target.cli, "gz", gz, *args, "--jobs", "2")
    monkeypatch.setattr(csv_source, "MIN_RANGE_BYTES", 1 << 20)
    small = rebuild(target.cli, "small", plain, *args, "--jobs", "2")
    for key, report in (("gz", from_gzip), ("small", small)):
        assert target.dump(key, header=False) == target.dump("one", header=False), key
        assert (report["rows"], report["items_read"], report["added"]) == (one["rows"], one["items_read"], one["added"])
    assert parts_made and all(part.shared_parse and part.span is None for _index, part in parts_made)
