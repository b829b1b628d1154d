"""The Arrow CSV path against the csv module's: the same items, the same counts, the same errors.

Every case is read twice, once as a user gets it (pyarrow in front, the csv module taking over
where pyarrow cannot vouch for the result) and once with pyarrow turned off; pyarrow's block is
made tiny so that most cases switch readers part-way through the file.
"""

from __future__ import annotations

import gzip

import pytest

from bloomctl.errors import SourceError
from bloomctl.sources import CsvSource
from bloomctl.sources.base import item_list

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

GOOD = "".join(f'{i},name {i},"e{i}, ""x"""\n' for i in range(400))
CASES = {
    "plain": "id,name,email\n" + "".join(f"{i},n{i},e{i}\n" for i in range(500)),
    "quoted": "id,name,email\n" + GOOD,
    "multiline": "id,name,email\n" + GOOD + '7,"two\nlines",x\n' + GOOD,
    "crlf": ("id,name,email\n" + GOOD).replace("\n", "\r\n"),
    "cr only": "id,name,email\r" + "".join(f"{i},n{i},e{i}\r" for i in range(300)),
    "bom": "\ufeffid,name,email\n" + GOOD,
    "empty lines": "id,name,email\n" + GOOD + "\n\n" + GOOD + "\n",
    "blank values": "id,name,email\n" + "".join(f"{i},,e{i}\n" if i % 3 else f",n{i},\n" for i in range(400)),
    "malformed quote late": "id,name,email\n" + GOOD + '9,"ab"c,x\n' + GOOD,
    "unterminated at the end": "id,name,email\n" + GOOD + '9,"never closed,x\n',
    "literal quote in a field": "id,name,email\n" + GOOD + '9,ab"c,x\n' + GOOD,
    "short row": "id,name,email\n" + GOOD + "9\n" + GOOD,
    "long row": "id,name,email\n" + GOOD + "9,a,b,c,d\n" + GOOD,
    "bad utf-8 in another column": b"id,name,email\n" + GOOD.encode() + b"9,\xff\xfe,x\n" + GOOD.encode(),
    "nul byte": "id,name,email\n" + GOOD + "9,a\x00b,x\n" + GOOD,
    "no trailing newline": "id,name,email\n" + GOOD + "9,last,x",
    "unicode": "id,name,email\n" + "".join(f"{i},名前{i},ü{i}\n" for i in range(300)),
    # a whole block of blank items, then the csv module takes over: blanks counted once
    "blank block then a switch": "id,name,email\n" + "".join(f"{i},,e\n" for i in range(2000)) + '9,"ab"c,x\n' + GOOD,
}


def utf8_cut_by_a_read() -> bytes:
    """A lone UTF-8 lead byte as the last byte of a 4096-byte read, only ASCII after it."""
    head = b"id,name,email\n" + b"".join(b"%d,n%d,e\n" % (i, i) for i in range(200))
    head += b"9," + b"x" * (4095 - len(head) - 2)
    assert len(head) == 4095
    return head + b"\xc3a,e\n" + b"".join(b"%d,n%d,e\n" % (i, i) for i in range(5000))


CASES["utf-8 cut by a read"] = utf8_cut_by_a_read()


def read_all(source: CsvSource, size: int = 97) -> tuple[list[bytes], tuple[int, int, int, list[str]], str | None]:
    items, error = [], None
    try:
        for batch in source.fast_batches(size):
            items += item_list(batch)
    except SourceError as exc:
        error = str(exc)
    stats = source.stats
    return items, (stats.rows, stats.blank, stats.bad_rows, stats.examples), error


@pytest.fixture(autouse=True)
def tiny_blocks(monkeypatch):
    from bloomctl.sources import arrow_csv

    monkeypatch.setattr(arrow_csv, "BLOCK_BYTES", 4096)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(
    "options",
    [
        {"column": "name"},
        {"column": "3", "skip_bad_rows": 5},
        {"template": "{id}/{email}"},
        {"column": "email", "prefix": "user:"},
    ],
    ids=["name", "third-skip5", "template", "prefix"],
)
def test_the_arrow_path_reads_what_the_csv_module_reads(tmp_path, monkeypatch, case, options):
    text = CASES[case]
    path = tmp_path / "t.csv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    fast = read_all(CsvSource(str(path), **options))
    monkeypatch.setattr(CsvSource, "_arrow_possible", lambda self: False)
    exact = read_all(CsvSource(str(path), **options))
    if exact[2] is None:
        assert fast == exact
    else:  # the run stops: the same error, after the same rows (items before it may differ in batching)
        assert fast[1:] == exact[1:]


def test_clean_files_come_as_arrow_arrays(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("id,name,email\n" + GOOD)
    batches = list(CsvSource(str(path), column="email").fast_batches(1000))
    assert batches and all(isinstance(batch, pa.Array) for batch in batches)


def test_gzip_and_no_header(tmp_path):
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(GOOD.encode()))
    fast = read_all(CsvSource(str(path), column="2", header=False))
    assert fast[0][:2] == [b"name 0", b"name 1"] and len(fast[0]) == 400 and fast[2] is None


def test_a_bad_row_after_the_switch_has_its_exact_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("id,name,email\n" + GOOD + '7,"two\nlines",x\n' + GOOD + '9,"ab"c,x\n')
    _items, stats, error = read_all(CsvSource(str(path), column="name"))
    assert error is not None and error.startswith(f"{path}:{1 + 400 + 2 + 400 + 1}: malformed CSV")
    assert stats[0] == 802  # rows: 400 + 1 (two lines) + 400 + the malformed one


def test_long_fields_and_encodings_agree_on_both_paths(tmp_path, monkeypatch):
    """A 200 KB field (over the csv module's default limit of 128 KiB), --encoding ascii with a
    byte over 127, and utf-8-sig (accepted: its signature is dropped): both readers agree."""
    from bloomctl.sources import arrow_csv

    monkeypatch.setattr(arrow_csv, "BLOCK_BYTES", 1 << 20)
    long_field = "id,name\n1," + "y" * 200_000 + "\n2,b\n"
    cases = [
        (long_field, {"column": "name"}, ["y" * 200_000, "b"]),
        ("id,name\n1,né\n2,b\n", {"column": "name", "encoding": "ascii", "skip_bad_rows": 1}, ["b"]),
        ("\ufeffid,name\n1,a\n2,ü\n", {"column": "name", "encoding": "utf-8-sig"}, ["a", "ü"]),
    ]
    for text, options, expected in cases:
        path = tmp_path / "t.csv"
        path.write_bytes(text.encode())
        fast = read_all(CsvSource(str(path), **options))
        with monkeypatch.context() as patch:
            patch.setattr(CsvSource, "_arrow_possible", lambda self: False)
            exact = read_all(CsvSource(str(path), **options))
        assert fast == exact, options
        assert fast[0] == [item.encode() for item in expected], options


def as_bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


@pytest.mark.parametrize("kind", ["binary", "string", "large_binary", "large_string"])
def test_items_of_keeps_exactly_the_present_values(kind):
    """A batch without blanks is passed on as it is (its offsets say so); with a null or an empty
    value anywhere, those rows are dropped and counted. Sliced arrays (offsets not from 0) too."""
    import random

    from bloomctl.sources.arrow_items import items_of
    from bloomctl.sources.base import ItemFormatter

    rng = random.Random(kind)
    fmt = ItemFormatter(["c0"], None, None, None)
    for _ in range(300):
        values = [
            rng.choice(["a", "bb", "é", "", None]) if rng.random() < 0.1 else f"v{rng.randrange(99)}" for _ in range(40)
        ]
        array = pa.array(values, type=getattr(pa, kind)())
        start = rng.randrange(0, 5)
        array = array.slice(start, rng.randrange(0, 40 - start))
        expected = [as_bytes(value) for value in array.to_pylist() if value]
        items, blank = items_of([array], fmt)
        assert [as_bytes(item) for item in items.to_pylist()] == expected
        assert blank == len(array) - len(expected)


def test_a_stream_with_nothing_yet_is_not_taken_for_its_end():
    """A non-blocking stream's readinto answers None when it has no bytes yet: read as the end of
    the file, the rest of the items would be lost; it hands the file to the csv module instead."""
    import io

    from bloomctl.sources.arrow_csv import StrictStream
    from bloomctl.sources.arrow_errors import Unsure

    class NothingYet(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, buffer):
            return None

    with pytest.raises(Unsure, match="no bytes without being at its end"):
        StrictStream(NothingYet(), b",").readinto(bytearray(16))
