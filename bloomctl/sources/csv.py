"""CSV files (or stdin, or gzip): the items of one column, or of a template over several.

Read in 1 MiB blocks: blocks without a quote character take a fast path (split on the delimiter
in C, no decoding into str for UTF-8 input); a block with anything unusual (a quote, bad
encoding, a short row) is read row by row with the csv module, which knows the exact line of
every problem.

For ``jobs``, a plain file is cut into byte ranges, one per job, at line ends outside quoted
fields (``cut_ranges``): each job reads its range as the whole file would be read there, with
the same line numbers. Where a file cannot be cut (stdin, gzip, a pipe, a small file), every job
reads all of it and keeps the items a hash gives it.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import mmap
import os
import re
import stat
import sys
import zlib
from collections.abc import Iterator
from functools import lru_cache
from typing import IO, Any, NamedTuple

from bloomctl import extras
from bloomctl.defaults import DEFAULT_DELIMITER, DEFAULT_ENCODING, DEFAULT_SKIP_BAD_ROWS
from bloomctl.errors import SourceError, UsageError
from bloomctl.sources.arrow_errors import Unsure
from bloomctl.sources.base import (
    NOT_SHOWN,
    BadRows,
    Batch,
    ItemFormatter,
    SourceStats,
    header_names,
    item_list,
    rebatch,
)
from bloomctl.sources.csv_cuts import cut_ranges

BLOCK_BYTES = 1 << 20
MAX_LINE_BYTES = 64 << 20
BYTES_AS_IS = {"utf-8", "ascii", "utf-8-sig"}  # codecs whose bytes already are the UTF-8 item
UTF8 = {"utf-8", "utf-8-sig"}  # what StrictStream checks, so what pyarrow may read
MIN_RANGE_BYTES = 4 << 20  # smaller files are shared out by hash: cutting them saves nothing
SHIFTING_CODECS = ("utf-7", "iso2022", "hz")  # plain ASCII bytes can change what later bytes mean


@lru_cache(maxsize=64)
def bytes_stand_alone(codec: str) -> bool:
    """Whether every byte below 0x80 is always the ASCII character it looks like, wherever it
    stands: UTF-8, and the single-byte codecs that extend ASCII (latin-1, cp1252, iso8859-*).
    Not Shift_JIS, GBK, Big5 and the like, whose second byte of a character can be a '|' or a '"'
    (a cut found by counting quotes would then fall inside a field), nor UTF-16 or UTF-7."""
    if codec in UTF8 or codec == "ascii":
        return True
    try:
        decoder = codecs.getincrementaldecoder(codec)()
    except LookupError:
        return False
    for value in range(256):
        decoder.reset()
        try:
            text = decoder.decode(bytes([value]), final=False)
        except UnicodeDecodeError:  # a byte the codec leaves undefined (cp1252's 0x81): no lead byte
            continue
        if len(text) != 1 or (value < 0x80 and text != chr(value)):
            return False  # '' is a lead byte waiting for the rest of its character
    return True


def file_listing(path: str, info: os.stat_result) -> tuple[Any, ...]:
    """What tells a file from its rewrite: its size and times, and which file it is (inode and
    device; the change time, which no one can set back, catches a same-size rewrite whose
    modification time was restored: `cp -p`, `rsync --inplace -t`)."""
    return (path, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)


@lru_cache(maxsize=64)
def _first_field(delim: bytes) -> re.Pattern[bytes]:
    """The first field of every line of a block (lines end with \\n; the last one may not)."""
    return re.compile(b"^([^" + re.escape(delim) + b"\\n]*)", re.M)


@lru_cache(maxsize=64)
def _nth_field(delim: bytes, index: int) -> re.Pattern[bytes]:
    """Field ``index`` (0-based) of every line that has one."""
    field_ = b"[^" + re.escape(delim) + b"\\n]*"
    return re.compile(b"^(?:" + field_ + re.escape(delim) + b"){" + str(index).encode() + b"}(" + field_ + b")", re.M)


class _Replay:
    """Bytes already read from a stream, then the rest of the stream (stdin read twice)."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self.head, self.rest = head, rest

    def read(self, size: int = -1) -> bytes:
        if self.head:
            cut = len(self.head) if size is None or size < 0 else size
            chunk, self.head = self.head[:cut], self.head[cut:]
            return chunk
        return self.rest.read(size)

    def close(self) -> None:  # stdin is not ours to close
        pass


class _Range:
    """Bytes ``[start, end)`` of an open file: the part of a CSV file that one job reads."""

    def __init__(self, raw: IO[bytes], size: int) -> None:
        self.raw, self.left = raw, size

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(self.left if size is None or size < 0 else min(size, self.left))
        self.left -= len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        n = self.raw.readinto(memoryview(buffer).cast("B")[: self.left])  # type: ignore[attr-defined]
        self.left -= n
        return int(n)

    def close(self) -> None:
        self.raw.close()


class FileCut(NamedTuple):
    """A file cut into byte ranges: what the parts were cut from, and each part's range."""

    listing: tuple[Any, ...]  # ``file_listing``: checked when each part reads
    head: tuple[list[str] | None, int]  # the header's names (None: no header) and the first row's width
    spans: list[tuple[int, int, int]]  # per part: start, end, line breaks before start


class CsvSource:
    """Items from one column of a CSV file (``-``: stdin; ``.gz``: gzip), read in 1 MiB blocks.

    Blocks without a quote character take a fast path (split on the delimiter, no decoding into
    str for UTF-8 input). A block with anything unusual (a quote, bad encoding, a short row) is
    read row by row with the csv module, which knows the exact line of every problem.
    """

    def __init__(
        self,
        path: str,
        *,
        column: str | None = None,
        header: bool = True,
        delimiter: str = DEFAULT_DELIMITER,
        encoding: str = DEFAULT_ENCODING,
        template: str | None = None,
        prefix: str | None = None,
        skip_bad_rows: int = DEFAULT_SKIP_BAD_ROWS,
    ) -> None:
        if len(delimiter) != 1:
            raise UsageError("`delimiter` must be one character, got %r", delimiter)
        if delimiter == '"':
            raise UsageError("`delimiter` cannot be the quote character")
        try:
            self.codec = codecs.lookup(encoding).name
        except LookupError:
            raise UsageError("unknown `encoding` %r", encoding) from None
        try:
            probe = "utf-8" if self.codec == "utf-8-sig" else encoding  # the signature is not a character
            ascii_compatible = "\n,;\t|".encode(probe) == b"\n,;\t|"
        except LookupError:  # a codec that is not a text encoding (rot13, base64, ...)
            ascii_compatible = False
        if not ascii_compatible or self.codec.startswith(("utf-16", "utf-32")):
            raise UsageError(
                "`encoding` %s: only ASCII-compatible encodings (utf-8, latin-1, cp1252, ...); convert the file with iconv first",
                encoding,
            )
        self.path = path
        self.name = "<stdin>" if path == "-" else path
        self.header = header
        self.delimiter = delimiter
        self.encoding = encoding
        self.column, self.template, self.prefix = column, template, prefix
        self.skip_bad_rows = skip_bad_rows
        self.stats = SourceStats()
        self.formatter: ItemFormatter | None = None
        self._stdin_head: bytes | None = None
        self.span: tuple[int, int, int] | None = None  # a part's byte range (``FileCut.spans``)
        self.head: tuple[list[str] | None, int] | None = None  # the file's header, for a part's range
        self.listing: tuple[Any, ...] | None = None  # the file as it was when it was cut (``file_listing``)
        self._cut: FileCut | None = None  # how ``part`` cut the file (None: shared out by hash)
        self._cut_parts = 0  # for how many parts
        self.bad_rows_before = 0  # bad rows of the parts before this one: they count against `skip_bad_rows`

    @property
    def rewindable(self) -> bool:
        return self.path != "-"

    @property
    def description(self) -> str:
        return f"CSV {self.name}"

    def _open(self) -> IO[bytes]:
        if self.path == "-":
            if self._stdin_head is not None:  # preflight read the start of stdin: replay it first
                return _Replay(self._stdin_head, sys.stdin.buffer)  # type: ignore[return-value]
            return sys.stdin.buffer
        try:
            raw = open(self.path, "rb")  # noqa: SIM115 - closed by the caller
        except OSError as exc:
            raise SourceError("cannot read %s: %s", self.path, exc.strerror) from None
        if self.span is not None:
            return self._range(raw)
        if self.path.endswith(".gz"):
            return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
        return raw

    def _range(self, raw: IO[bytes]) -> IO[bytes]:
        """This part's bytes of the file, once the file is known to be the one that was cut."""
        assert self.span is not None
        info = os.fstat(raw.fileno())
        if self.listing != file_listing(self.path, info):
            raw.close()
            raise SourceError("the CSV file %s changed while the jobs read it", self.name)
        start, end, _lines = self.span
        raw.seek(start)
        return _Range(raw, end - start)  # type: ignore[return-value]

    def preflight(self) -> None:
        """Open the file and read its header now, so a wrong column or template fails before
        anything is written (from stdin, the first block is kept and replayed by the load)."""
        if not self.rewindable and self._stdin_head is None:
            self._stdin_head = sys.stdin.buffer.read(BLOCK_BYTES)
        stream = self._open()
        try:
            names, rest, _lines = self._read_header(self._blocks(stream))
            fmt = ItemFormatter(names, self.column, self.template, self.prefix)
            width = len(names) if names is not None else _first_row_width(rest, self.delimiter)
            if width and fmt.width > width:  # every row would be bad: a usage error, found before any write
                shown = header_names(names) if names is not None else None
                if names is None:
                    where = f"the first row has {width}"
                elif shown is None:
                    where = f"the header has {width}, which {NOT_SHOWN}"
                else:
                    where = f"the header has {width}: {shown}"
                raise UsageError("the item needs column %s, but %s", fmt.width, where)
        except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise SourceError("cannot read %s: %s", self.name, exc) from None
        finally:
            if self.rewindable:
                stream.close()

    def count(self) -> int:
        """Data lines in the file (a fast newline count, header excluded): the estimate for `capacity` auto."""
        if not self.rewindable:
            raise UsageError("`capacity` auto and `verify_all` read the source twice: give a file, not stdin")
        lines = returns = 0
        last = b"\n"
        with self._open() as f:
            try:
                while chunk := f.read(BLOCK_BYTES * 4):
                    lines += chunk.count(b"\n")
                    returns += chunk.count(b"\r")
                    last = chunk[-1:]
            except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
                raise SourceError("cannot read %s: %s", self.name, exc) from None
        if lines == 0 and returns:  # old Mac line ends, as the reader treats them
            lines, last = returns, (b"\n" if last == b"\r" else last)
        if last != b"\n":
            lines += 1
        return max(lines - (1 if self.header else 0), 0)

    def batches(self, size: int) -> Iterator[list[bytes]]:
        """One pass over the file: lists of at most ``size`` items."""
        for batch in self.fast_batches(size):
            yield item_list(batch)

    @property
    def shared_parse(self) -> bool:
        """Whether every part reads the whole file and keeps the items a hash gives it (a file
        ``part`` could not cut), rather than its own byte range."""
        return self.span is None and self._cut is None

    def part(self, index: int, parts: int, split_column: str | None = None) -> CsvSource:
        """The reader of process ``index`` of ``parts``: its byte range of the file (``cut_ranges``;
        part 0 reads the header, the others are given its names and their first line's number).
        A file that cannot be cut (gzip, not a regular file, under ``MIN_RANGE_BYTES``) is read
        whole by every part, which keeps the items a hash gives it (``parallel.take_share``). Part
        0 cuts the file again if it changed since; the others take the last cut's ranges."""
        if split_column is not None:
            raise UsageError("`split_column` splits SQL sources; a CSV file is cut into byte ranges")
        if not self.rewindable:
            raise UsageError("`jobs` reads the file once in every job: give a file, not stdin")
        if self._cut_parts != parts or (index == 0 and not self._cut_current()):
            self._cut, self._cut_parts = self._cut_file(parts), parts
        copy = CsvSource.__new__(CsvSource)
        copy.__dict__.update(self.__dict__)
        copy.stats = SourceStats()
        copy._cut, copy._cut_parts = None, 0
        if self._cut is not None:
            copy.span, copy.head, copy.listing = self._cut.spans[index], self._cut.head, self._cut.listing
        return copy

    def _cut_current(self) -> bool:
        try:
            info = os.stat(self.path)
        except OSError:
            return False
        return self._cut is not None and self._cut.listing == file_listing(self.path, info)

    def _cut_file(self, parts: int) -> FileCut | None:
        """The file cut into ``parts`` byte ranges, or None where it cannot be (or is not worth it)."""
        delimiter = self._delimiter_byte()
        if (
            delimiter is None
            or self.path.endswith(".gz")
            or self.codec.startswith(SHIFTING_CODECS)
            or not bytes_stand_alone(self.codec)
        ):
            return None
        try:
            if not stat.S_ISREG(os.stat(self.path).st_mode):
                return None  # (a named pipe: opening it would wait for a writer)
            raw = open(self.path, "rb")  # noqa: SIM115 - closed below
        except OSError:
            return None  # each part's read says why
        with raw:
            info = os.fstat(raw.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size < max(MIN_RANGE_BYTES, 1):
                return None
            names, rest, _lines = self._read_header(self._blocks(raw))
            head = (names, len(names) if names is not None else _first_row_width(rest, self.delimiter))
            try:
                with mmap.mmap(raw.fileno(), info.st_size, access=mmap.ACCESS_READ) as data:
                    spans = cut_ranges(data, delimiter, parts, self.codec)
            except (OSError, ValueError):  # a file system without mmap, a file cut short meanwhile
                return None
        return FileCut(file_listing(self.path, info), head, spans)

    def _delimiter_byte(self) -> int | None:
        """The delimiter's one byte in the file's encoding (None when it takes several: a byte of
        it could then be part of another character, and the cuts could not be trusted)."""
        try:
            encoded = self.delimiter.encode("utf-8" if self.codec == "utf-8-sig" else self.encoding)
        except UnicodeError:
            return None
        return encoded[0] if len(encoded) == 1 else None

    def fast_batches(self, size: int) -> Iterator[Batch]:
        """``batches``, but Arrow arrays where pyarrow read them (no Python object per item)."""
        return self._all_batches(size)

    def _all_batches(self, size: int) -> Iterator[Batch]:
        self.stats = SourceStats(bad_rows=self.bad_rows_before)
        bad = BadRows(self.stats, self.skip_bad_rows, self.name)
        if self.span is not None and self.span[0] >= self.span[1]:
            return  # a part with nothing to read (a file of fewer records than parts)
        try:
            delivered, blank = 0, 0
            if self._arrow_possible():
                try:
                    for items in self._arrow_items():  # every batch, an all-blank one too
                        delivered, blank = self.stats.rows, self.stats.blank
                        for start in range(0, len(items), size):
                            piece = items.slice(start, size)
                            self.stats.items += len(piece)
                            yield piece
                    return
                except Unsure:  # the csv module reads the rest, from the first row not delivered
                    self.stats.rows, self.stats.blank = delivered, blank
            yield from self._exact(bad, size, skip_rows=delivered)
        except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise SourceError("cannot read %s: %s", self.name, exc) from None

    def _exact(self, bad: BadRows, size: int, *, skip_rows: int) -> Iterator[list[bytes]]:
        stream = self._open()
        try:
            if skip_rows:
                yield from rebatch(self._resume(stream, bad, skip_rows), size, self.stats)
            else:
                yield from rebatch(self._items(stream, bad), size, self.stats)
        finally:
            if self.rewindable:
                stream.close()

    def _arrow_possible(self) -> bool:
        """pyarrow reads files in UTF-8 (or ASCII) with a one-byte delimiter; stdin keeps the csv
        reader, since a switch to it part-way would need to read the start again."""
        if not self.rewindable or self.codec not in UTF8 or len(self.delimiter.encode()) != 1:
            return False  # (ASCII too: pyarrow would not refuse a byte over 127)
        # (imported, not only found: an install that does not import reads through the csv module)
        return extras.available(extras.PARQUET) and extras.available(extras.CLIENT_BUILD)

    def _arrow_items(self) -> Iterator[Any]:
        from bloomctl.sources import arrow_csv

        stream = self._open()
        try:
            names, first, _lines = self._read_header(self._blocks(stream))
        finally:
            stream.close()
        if self.head is not None:  # a part: the width of the file's first row, not of its own
            width = self.head[1]
        else:
            width = len(names) if names is not None else _first_row_width(first, self.delimiter)
        fmt = ItemFormatter(names, self.column, self.template, self.prefix)
        if fmt.width > width:
            raise Unsure("rows are shorter than the item's column")
        header = self.header and (self.span is None or self.span[0] == 0)
        stream = self._open()
        try:
            yield from arrow_csv.read(
                stream, width=width, header=header, delimiter=self.delimiter, fmt=fmt, stats=self.stats
            )
        finally:
            stream.close()

    def _resume(self, stream: IO[bytes], bad: BadRows, skip_rows: int) -> Iterator[list[bytes]]:
        """The csv module's rows after the first ``skip_rows`` (which pyarrow delivered)."""
        blocks = self._blocks(stream)
        names, first, line_no = self._read_header(blocks)
        fmt = ItemFormatter(names, self.column, self.template, self.prefix)

        def rest() -> Iterator[bytes]:
            yield from first.splitlines(keepends=True)
            for block in blocks:
                yield from block.splitlines(keepends=True)

        yield from self._slow(rest(), bad, fmt, line_no, skip=skip_rows)

    # --- reading ----------------------------------------------------------------------------

    def _blocks(self, stream: IO[bytes]) -> Iterator[bytes]:
        """Blocks of whole lines (ended by \\n, or by \\r in a file that has no \\n)."""
        tail = b""
        while chunk := stream.read(BLOCK_BYTES):
            chunk = tail + chunk
            cut = chunk.rfind(b"\n")
            if cut == -1:
                cut = chunk.rfind(b"\r", 0, len(chunk) - 1)  # old Mac line ends; not a CRLF cut in half
            if cut == -1:
                if len(chunk) > MAX_LINE_BYTES:
                    raise SourceError("%s: a line longer than %s MiB", self.name, MAX_LINE_BYTES // 2**20)
                tail = chunk
                continue
            tail = chunk[cut + 1 :]
            yield chunk[: cut + 1]
        if tail:
            yield tail

    def _read_header(self, blocks: Iterator[bytes]) -> tuple[list[str] | None, bytes, int]:
        """The header names, what is left of the first block, and the lines before it (a part
        after the first: the file's names, and the lines before its range)."""
        first = next(blocks, b"")
        if self.span is not None and self.span[0] > 0:
            return (self.head[0] if self.head is not None else None), first, self.span[2]
        if first.startswith(codecs.BOM_UTF8) and self.codec in ("utf-8", "utf-8-sig"):
            first = first[len(codecs.BOM_UTF8) :]
        if not self.header:
            return None, first, 0
        parts = re.split(rb"\r\n|\r|\n", first, maxsplit=1)
        line, rest = parts[0], parts[1] if len(parts) > 1 else b""
        try:
            names = next(csv.reader([line.decode(self.encoding)], delimiter=self.delimiter, strict=True), [])
        except UnicodeDecodeError:
            raise SourceError("%s:1: the header is not valid %s", self.name, self.encoding) from None
        except csv.Error as exc:
            raise SourceError("%s:1: malformed header (%s)", self.name, exc) from None
        if not names:
            raise SourceError("%s:1: empty header line (pass `header=False` for a file without one)", self.name)
        return names, rest, 1

    def _items(self, stream: IO[bytes], bad: BadRows) -> Iterator[list[bytes]]:
        blocks = self._blocks(stream)
        names, first, line_no = self._read_header(blocks)
        self.width = len(names) if names else 0  # fields per row, when a header tells
        self.formatter = fmt = ItemFormatter(names, self.column, self.template, self.prefix)
        as_is = self.codec in BYTES_AS_IS
        delim = self.delimiter.encode("utf-8")

        def all_blocks() -> Iterator[bytes]:
            if first:
                yield first
            yield from blocks

        source = all_blocks()
        for block in source:
            data = block
            if not as_is:
                try:
                    data = block.decode(self.encoding).encode("utf-8")
                except UnicodeDecodeError:
                    data = b""  # unusual: read it row by row below
            # The fast path splits on one byte: a delimiter that is several bytes in UTF-8 (like "§")
            # would cut other characters that share its first byte.
            if data and b'"' not in data and fmt.template is None and len(delim) == 1:
                items = self._fast_block(data, delim, fmt)
                if items is not None:
                    yield items
                    line_no += data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
                    continue
            if b'"' in block:
                # Quoted fields may hold newlines: from here on the csv module reads everything.
                yield from self._slow(self._lines(block, source), bad, fmt, line_no)
                return
            lines = block.splitlines(keepends=True)  # a lone \r ends a line too
            yield from self._slow(iter(lines), bad, fmt, line_no)
            line_no += len(lines)

    def _fast_block(self, data: bytes, delim: bytes, fmt: ItemFormatter) -> list[bytes] | None:
        """Items of a block of plain lines, or None when a row needs a closer look."""
        if self.codec in BYTES_AS_IS:
            try:
                data.decode("ascii" if self.codec == "ascii" else "utf-8")  # validation only; C speed
            except UnicodeDecodeError:
                return None
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
            if b"\r" in data:
                return None  # a bare carriage return ends a line too: the csv module knows
        body = data[:-1] if data.endswith(b"\n") else data  # so that ^ does not match after the last line
        lines = body.split(b"\n")
        index = fmt.index
        if delim not in data:  # one column: every line is a value
            if index > 0:
                return None
            values = lines
        else:
            # One regex pass in C, anchored at each line's start: a line with extra fields still gives
            # its own field, a line that is too short gives no match (and the slow path its number).
            values = (_first_field(delim) if index == 0 else _nth_field(delim, index)).findall(body)
        if len(values) != len(lines):
            return None  # a short row: find its line number the slow way
        self.stats.rows += len(values)
        items = [v for v in values if v] if b"" in values else values
        self.stats.blank += len(values) - len(items)
        if fmt.prefix and items:
            prefix = fmt.prefix
            items = (prefix + (b"\n" + prefix).join(items)).split(b"\n")  # C-speed prefixing
        return items

    @staticmethod
    def _lines(block: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
        yield from block.splitlines(keepends=True)
        for more in rest:
            yield from more.splitlines(keepends=True)

    def _slow(
        self, lines: Iterator[bytes], bad: BadRows, fmt: ItemFormatter, line_no: int, *, skip: int = 0
    ) -> Iterator[list[bytes]]:
        """Row by row with the csv module: exact line numbers for every problem. The first ``skip``
        rows (empty ones included) are only counted off: another reader delivered them."""
        state = {"line": line_no, "placeholder": False}  # physical lines read; last line undecodable

        def decoded() -> Iterator[str]:
            for raw in lines:
                state["line"] += 1
                try:  # (utf-8-sig would drop a U+FEFF that starts a line: the other readers keep it)
                    text = raw.decode("utf-8" if self.codec == "utf-8-sig" else self.encoding)
                except UnicodeDecodeError:
                    bad(state["line"], f"not valid {self.encoding}")
                    state["placeholder"] = True
                    yield "\n"  # an empty row keeps the reader in step; it is skipped below
                else:
                    state["placeholder"] = False
                    yield text

        if csv.field_size_limit() < MAX_LINE_BYTES:  # 128 KiB by default: the fast paths have no such limit
            csv.field_size_limit(MAX_LINE_BYTES)
        reader = csv.reader(decoded(), delimiter=self.delimiter, strict=True)
        items: list[bytes] = []
        while True:
            start = state["line"] + 1
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                if skip:
                    skip -= 1
                    continue
                self.stats.rows += 1
                bad(start, f"malformed CSV ({exc})")
                continue
            if skip:
                skip -= 1
                continue
            if not row:
                if not state["placeholder"]:  # an empty line: a row with a blank value, as elsewhere
                    self.stats.rows += 1
                    self.stats.blank += 1
                continue
            self.stats.rows += 1
            if len(row) < fmt.width:
                bad(start, f"{len(row)} field(s), column {fmt.width} needed")
                continue
            if not all(row[i] for i in fmt.indexes or [fmt.index]):  # a blank value (any, with a template)
                self.stats.blank += 1
                continue
            items.append(fmt.text_item(row))
            if len(items) >= 4096:
                yield items
                items = []
        if items:
            yield items


def _first_row_width(block: bytes, delimiter: str) -> int:
    """Fields in the first row of a file without a header (0 for an empty file)."""
    lines = block.decode("utf-8", "replace").splitlines(keepends=True)
    try:
        return len(next(csv.reader(lines, delimiter=delimiter), []))
    except csv.Error:
        return 0
