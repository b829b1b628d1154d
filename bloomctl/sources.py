"""Sources: stream the items of a filter out of a CSV file or a SQL query, in batches of bytes.

A source yields lists of items (UTF-8 bytes) so the loader's per-item Python work stays small,
and its memory does not grow with the input. Rows that cannot be read are counted, and beyond
``skip_bad_rows`` stop the run with file:line. Blank values are skipped and counted.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import re
import string
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import IO, Any

from bloomctl.errors import SourceError, UsageError

BLOCK_BYTES = 1 << 20
MAX_LINE_BYTES = 64 << 20
MAX_EXAMPLES = 5
BYTES_AS_IS = {"utf-8", "ascii", "utf-8-sig"}  # codecs whose bytes already are the UTF-8 item


@dataclass
class SourceStats:
    rows: int = 0  # data rows read (not the header)
    items: int = 0  # items yielded
    blank: int = 0  # rows whose value was empty (skipped)
    bad_rows: int = 0  # rows skipped as unreadable (within --skip-bad-rows)
    examples: list[str] = field(default_factory=list)  # the first few bad rows, "file:line: why"

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "items": self.items,
            "blank": self.blank,
            "bad_rows": self.bad_rows,
            "bad_row_examples": self.examples,
        }


class ItemFormatter:
    """Turns the selected column (or, with a template, several columns) of a row into an item."""

    def __init__(self, names: list[str] | None, column: str | None, template: str | None, prefix: str | None) -> None:
        if template and prefix:
            raise UsageError("--template and --prefix exclude each other")
        if template and column:
            raise UsageError("--template names its columns itself: leave out --column")
        self.names = names
        self.prefix = (prefix or "").encode()
        self.template: str | None = None
        self.indexes: list[int] = []
        if template:
            pieces: list[str] = []
            try:
                parsed = list(string.Formatter().parse(template))
            except ValueError as exc:
                raise UsageError(f"--template {template!r}: {exc}") from None
            for literal, name, spec, conversion in parsed:
                pieces.append(literal.replace("{", "{{").replace("}", "}}"))
                if name is None:
                    continue
                if spec or conversion:
                    raise UsageError(f"--template field {{{name}}}: format specs and conversions are not supported")
                pieces.append(f"{{{len(self.indexes)}}}")
                self.indexes.append(self.column_index(name))
            if not self.indexes:
                raise UsageError("--template has no {column} field")
            self.template = "".join(pieces)
            self.index = max(self.indexes)
        else:
            self.index = self.column_index(column) if column else 0

    def column_index(self, column: str) -> int:
        """A header name, or a 1-based position (like cut -f)."""
        if self.names is not None and column in self.names:
            return self.names.index(column)
        if column.isdigit() and int(column) >= 1:
            return int(column) - 1
        if self.names is None:
            raise UsageError(f"column {column!r}: without a header, name columns by position (1, 2, ...)")
        raise UsageError(f"no column {column!r}; the header has: {', '.join(self.names)}")

    @property
    def width(self) -> int:
        """How many fields a row needs."""
        return self.index + 1

    def text_item(self, row: list[str]) -> bytes:
        if self.template is not None:
            return self.template.format(*(row[i] for i in self.indexes)).encode("utf-8")
        return self.prefix + row[self.index].encode("utf-8")


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
            chunk, self.head = self.head, b""
            return chunk
        return self.rest.read(size)

    def close(self) -> None:  # stdin is not ours to close
        pass


def rebatch(chunks: Iterator[list[bytes]], size: int, stats: SourceStats) -> Iterator[list[bytes]]:
    """Lists of exactly ``size`` items (the last may be shorter) out of lists of any length."""
    pending: list[bytes] = []
    for chunk in chunks:
        if pending:
            need = size - len(pending)
            pending.extend(chunk[:need])
            chunk = chunk[need:]
            if len(pending) < size:
                continue
            stats.items += size
            yield pending
            pending = []
        whole = len(chunk) - len(chunk) % size
        for start in range(0, whole, size):
            stats.items += size
            yield chunk[start : start + size]
        pending = chunk[whole:]
    if pending:
        stats.items += len(pending)
        yield pending


class BadRows:
    """Counts unreadable rows and stops the run past the tolerance."""

    def __init__(self, stats: SourceStats, tolerance: int, name: str) -> None:
        self.stats, self.tolerance, self.name = stats, tolerance, name

    def __call__(self, line: int | str, reason: str) -> None:
        where = f"{self.name}:{line}: {reason}"
        self.stats.bad_rows += 1
        if len(self.stats.examples) < MAX_EXAMPLES:
            self.stats.examples.append(where)
        if self.stats.bad_rows > self.tolerance:
            hint = "" if self.tolerance else " (--skip-bad-rows N tolerates up to N bad rows)"
            raise SourceError(where + hint)


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
        delimiter: str = ",",
        encoding: str = "utf-8",
        template: str | None = None,
        prefix: str | None = None,
        skip_bad_rows: int = 0,
    ) -> None:
        if len(delimiter) != 1:
            raise UsageError(f"--delimiter must be one character, got {delimiter!r}")
        if delimiter == '"':
            raise UsageError("--delimiter cannot be the quote character")
        try:
            self.codec = codecs.lookup(encoding).name
        except LookupError:
            raise UsageError(f"unknown --encoding {encoding!r}") from None
        try:
            ascii_compatible = "\n,;\t|".encode(encoding) == b"\n,;\t|"
        except LookupError:  # a codec that is not a text encoding (rot13, base64, ...)
            ascii_compatible = False
        if not ascii_compatible or self.codec.startswith(("utf-16", "utf-32")):
            raise UsageError(
                f"--encoding {encoding}: only ASCII-compatible encodings (utf-8, latin-1, cp1252, ...); "
                "convert the file with iconv first"
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
            raise SourceError(f"cannot read {self.path}: {exc.strerror}") from None
        if self.path.endswith(".gz"):
            return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
        return raw

    def preflight(self) -> None:
        """Open the file and read its header now, so a wrong --column or --template fails before
        anything is written (from stdin, the first block is kept and replayed by the load)."""
        if not self.rewindable and self._stdin_head is None:
            self._stdin_head = sys.stdin.buffer.read(BLOCK_BYTES)
        stream = self._open()
        try:
            names, _rest, _lines = self._read_header(self._blocks(stream))
            ItemFormatter(names, self.column, self.template, self.prefix)
        except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise SourceError(f"cannot read {self.name}: {exc}") from None
        finally:
            if self.rewindable:
                stream.close()

    def count(self) -> int:
        """Data lines in the file (a fast newline count, header excluded): the estimate for --capacity auto."""
        if not self.rewindable:
            raise UsageError("--capacity auto and --verify all read the source twice: give a file, not stdin")
        lines = returns = 0
        last = b"\n"
        with self._open() as f:
            try:
                while chunk := f.read(BLOCK_BYTES * 4):
                    lines += chunk.count(b"\n")
                    returns += chunk.count(b"\r")
                    last = chunk[-1:]
            except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
                raise SourceError(f"cannot read {self.name}: {exc}") from None
        if lines == 0 and returns:  # old Mac line ends, as the reader treats them
            lines, last = returns, (b"\n" if last == b"\r" else last)
        if last != b"\n":
            lines += 1
        return max(lines - (1 if self.header else 0), 0)

    def batches(self, size: int) -> Iterator[list[bytes]]:
        """One pass over the file: lists of at most ``size`` items."""
        self.stats = SourceStats()
        bad = BadRows(self.stats, self.skip_bad_rows, self.name)
        stream = self._open()
        try:
            yield from rebatch(self._items(stream, bad), size, self.stats)
        except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise SourceError(f"cannot read {self.name}: {exc}") from None
        finally:
            if self.rewindable:
                stream.close()

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
                    raise SourceError(f"{self.name}: a line longer than {MAX_LINE_BYTES // 2**20} MiB")
                tail = chunk
                continue
            tail = chunk[cut + 1 :]
            yield chunk[: cut + 1]
        if tail:
            yield tail

    def _read_header(self, blocks: Iterator[bytes]) -> tuple[list[str] | None, bytes, int]:
        """The header names, what is left of the first block, and the lines consumed."""
        first = next(blocks, b"")
        if first.startswith(codecs.BOM_UTF8) and self.codec in ("utf-8", "utf-8-sig"):
            first = first[len(codecs.BOM_UTF8) :]
        if not self.header:
            return None, first, 0
        parts = re.split(rb"\r\n|\r|\n", first, maxsplit=1)
        line, rest = parts[0], parts[1] if len(parts) > 1 else b""
        try:
            names = next(csv.reader([line.decode(self.encoding)], delimiter=self.delimiter, strict=True), [])
        except UnicodeDecodeError:
            raise SourceError(f"{self.name}:1: the header is not valid {self.encoding}") from None
        except csv.Error as exc:
            raise SourceError(f"{self.name}:1: malformed header ({exc})") from None
        if not names:
            raise SourceError(f"{self.name}:1: empty header line (use --no-header for a file without one)")
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
            yield from self._slow(iter(block.splitlines(keepends=True)), bad, fmt, line_no)
            line_no += block.count(b"\n") + (0 if block.endswith(b"\n") else 1)

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

    def _slow(self, lines: Iterator[bytes], bad: BadRows, fmt: ItemFormatter, line_no: int) -> Iterator[list[bytes]]:
        """Row by row with the csv module: exact line numbers for every problem."""
        state = {"line": line_no, "placeholder": False}  # physical lines read; last line undecodable

        def decoded() -> Iterator[str]:
            for raw in lines:
                state["line"] += 1
                try:
                    text = raw.decode(self.encoding)
                except UnicodeDecodeError:
                    bad(state["line"], f"not valid {self.encoding}")
                    state["placeholder"] = True
                    yield "\n"  # an empty row keeps the reader in step; it is skipped below
                else:
                    state["placeholder"] = False
                    yield text

        reader = csv.reader(decoded(), delimiter=self.delimiter, strict=True)
        items: list[bytes] = []
        while True:
            start = state["line"] + 1
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                self.stats.rows += 1
                bad(start, f"malformed CSV ({exc})")
                continue
            if not row:
                if not state["placeholder"]:
                    self.stats.blank += 1  # an empty line
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


# --- SQL ----------------------------------------------------------------------------------------

# PostgreSQL type OIDs whose COPY text form equals str() of the value psycopg returns:
# text, varchar, bpchar, name, int2, int4, int8, uuid.
COPY_SAFE_TYPES = frozenset({25, 1043, 1042, 19, 21, 23, 20, 2950})

DRIVER_HINTS = {
    "postgresql": ("postgresql+psycopg", "psycopg", "pip install 'redis-bloomctl[postgresql]'"),
    "mysql": ("mysql+pymysql", "pymysql", "pip install 'redis-bloomctl[mysql]'"),
    "mariadb": ("mariadb+pymysql", "pymysql", "pip install 'redis-bloomctl[mysql]'"),
}


def normalise_db_url(url: str) -> str:
    """``postgresql://`` and ``mysql://`` name drivers bloomctl does not ship: use the ones it does."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise UsageError("--db-url must look like postgresql://user@host/db, mysql://..., or sqlite:///path")
    if scheme in DRIVER_HINTS:
        return f"{DRIVER_HINTS[scheme][0]}://{rest}"
    return url


def _redact(url: str) -> str:
    from bloomctl.connection import redact_url

    return redact_url(url)


class SqlSource:
    """Items from the first (or ``column``) column of a query, streamed with a server-side cursor."""

    def __init__(
        self,
        url: str,
        query: str,
        *,
        column: str | None = None,
        template: str | None = None,
        prefix: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> None:
        if not query.strip():
            raise UsageError("--from-sql needs a query")
        self.url = normalise_db_url(url)
        self.query = query.strip().rstrip(";")
        self.params = params or {}
        self.column, self.template, self.prefix = column, template, prefix
        self.stats = SourceStats()
        self._engine: Any = None
        self.rewindable = True

    @property
    def description(self) -> str:
        return f"SQL at {_redact(self.url)}"

    @property
    def engine(self) -> Any:
        if self._engine is None:
            try:
                import sqlalchemy
            except ImportError:
                raise UsageError("SQL sources need SQLAlchemy: pip install 'redis-bloomctl[sql]'") from None
            try:
                self._engine = sqlalchemy.create_engine(self.url)
            except ImportError as exc:
                scheme = self.url.split("+")[0].split(":")[0]
                hint = DRIVER_HINTS.get(scheme, ("", "", "install the database driver"))[2]
                raise UsageError(f"the driver for {scheme} is not installed ({exc.name}): {hint}") from None
            except Exception as exc:  # ArgumentError and friends: an unparsable URL
                raise UsageError(f"invalid --db-url {_redact(self.url)}: {self._scrub(exc)}") from None
        return self._engine

    def _scrub(self, exc: BaseException) -> str:
        text = str(exc).split("\n")[0]
        try:
            from sqlalchemy.engine import make_url

            password = make_url(self.url).password
        except Exception:
            password = None
        return text.replace(password, "***") if password else text

    def _error(self, exc: BaseException, what: str) -> SourceError:
        return SourceError(f"{what} failed at {_redact(self.url)}: {self._scrub(exc)}")

    def _scalar(self, sql: str, **params: Any) -> Any:
        from sqlalchemy import text

        try:
            with self.engine.connect() as conn:
                return conn.execute(text(sql), params).scalar()
        except UsageError:
            raise
        except Exception as exc:
            raise self._error(exc, "the query") from None

    def preflight(self) -> None:
        """Connect, and check the query's columns against --column/--template before anything is written."""
        from sqlalchemy import text

        try:
            with self.engine.connect() as conn:
                names = list(
                    conn.execute(text(f"SELECT * FROM ({self.query}) AS bloomctl_cols WHERE 1 = 0"), self.params).keys()
                )
        except (UsageError, SourceError):
            raise
        except Exception as exc:
            raise self._error(exc, "the query") from None
        ItemFormatter(names, self.column, self.template, self.prefix)

    def count(self) -> int:
        return int(self._scalar(f"SELECT COUNT(*) FROM ({self.query}) AS bloomctl_count"))

    def now(self) -> datetime:
        """The database's clock: catch-up compares against it, not against this machine's."""
        moment = self._scalar("SELECT CURRENT_TIMESTAMP")
        if isinstance(moment, str):  # SQLite answers text: 'YYYY-MM-DD HH:MM:SS'
            moment = datetime.fromisoformat(moment)
        return moment

    @staticmethod
    def check_column_name(column: str) -> str:
        if not column.replace("_", "").isalnum():
            raise UsageError(f"--since-column {column!r} must be a plain column name")
        return column

    def since(self, column: str, moment: Any) -> SqlSource:
        """The same source restricted to rows whose ``column`` is at or after ``moment`` (the catch-up)."""
        return self._narrowed(column, ">=", moment)

    def before(self, column: str, moment: Any) -> SqlSource:
        """The rows whose ``column`` is before ``moment``: what a full verification can demand on a live table."""
        return self._narrowed(column, "<", moment)

    def _narrowed(self, column: str, operator: str, moment: Any) -> SqlSource:
        narrowed = SqlSource(
            self.url,
            f"SELECT * FROM ({self.query}) AS bloomctl_src WHERE {self.check_column_name(column)} {operator} :moment",
            column=self.column,
            template=self.template,
            prefix=self.prefix,
            params={"moment": moment},
        )
        narrowed._engine = self._engine
        return narrowed

    def batches(self, size: int) -> Iterator[list[bytes]]:
        self.stats = SourceStats()
        copy_column = self._copy_column() if self._copy_possible() else None
        if copy_column is not None:
            yield from self._copy_batches(size, *copy_column)
            return
        yield from self._cursor_batches(size)

    def _copy_possible(self) -> bool:
        """PostgreSQL through psycopg, without bound parameters: COPY ... TO STDOUT is 2x faster."""
        if self.params or self.template is not None:
            return False
        try:
            import psycopg  # noqa: F401
        except ImportError:
            return False
        return self.engine.dialect.name == "postgresql" and self.engine.dialect.driver == "psycopg"

    def _copy_column(self) -> tuple[str, bytes] | None:
        """The item column's name and the prefix, when COPY's text gives exactly the bytes the cursor
        path gives (text and integer types); None otherwise (booleans, timestamps, bytea ... differ)."""
        from sqlalchemy import text

        try:
            with self.engine.connect() as conn:
                result = conn.execute(text(f"SELECT * FROM ({self.query}) AS bloomctl_cols LIMIT 0"))
                names = list(result.keys())
                types = [column.type_code for column in result.cursor.description]
        except Exception as exc:
            raise self._error(exc, "the query") from None
        fmt = ItemFormatter(names, self.column, None, self.prefix)
        if types[fmt.index] not in COPY_SAFE_TYPES:
            return None
        return names[fmt.index], fmt.prefix

    def _copy_batches(self, size: int, column_name: str, prefix: bytes) -> Iterator[list[bytes]]:
        """Rows from ``COPY (SELECT column FROM (query)) TO STDOUT``, read straight from libpq: one
        Python call per row. The text format has one row per line, and a newline inside a value
        arrives as the escape ``\\n``, so raw newlines always separate rows.
        """
        import psycopg
        from psycopg import pq

        try:
            # Only the item's column travels: no splitting here, and fewer bytes from the server.
            column = '"' + column_name.replace('"', '""') + '"'
            select = f"SELECT {column} FROM ({self.query}) AS bloomctl_src"
            conninfo = self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
            # UTF8 whatever the URL or PGCLIENTENCODING say: items are stored as UTF-8, as on the cursor path
            with psycopg.connect(conninfo, autocommit=True, client_encoding="UTF8") as raw:
                pgconn = raw.pgconn
                pgconn.send_query(f"COPY ({select}) TO STDOUT".encode())
                result = pgconn.get_result()
                if result is None or result.status != pq.ExecStatus.COPY_OUT:
                    message = result.get_error_message() if result is not None else b"no result"
                    raise SourceError(f"COPY failed: {message.decode(errors='replace').strip()}")
                get, done = pgconn.get_copy_data, False
                while not done:
                    rows: list[bytes] = []
                    append = rows.append
                    for _ in range(size):  # the hot loop: one libpq call and one append per row
                        nbytes, data = get(0)
                        if nbytes < 0:
                            done = True
                            break
                        append(data)
                    if rows:
                        yield from self._copy_items(rows, prefix)
                while (result := pgconn.get_result()) is not None:
                    if result.status == pq.ExecStatus.FATAL_ERROR:
                        raise SourceError(f"COPY failed: {result.get_error_message().decode(errors='replace').strip()}")
        except (UsageError, SourceError, GeneratorExit):
            raise
        except Exception as exc:  # the driver's errors, one line each and without the password
            raise self._error(exc, "the query") from None

    def _copy_items(self, rows: list[bytes], prefix: bytes) -> Iterator[list[bytes]]:
        body = b"".join(rows)[:-1]  # one value per row, each row ending with a newline
        count = len(rows)
        values = body.split(b"\n")
        if b"\\" in body:
            values = [_copy_unescape(v) if b"\\" in v else v for v in values]
        self.stats.rows += count
        items = [v for v in values if v] if b"" in values else values
        self.stats.blank += count - len(items)
        if prefix and items:
            items = (
                (prefix + (b"\n" + prefix).join(items)).split(b"\n")
                if b"\n" not in body
                else [prefix + v for v in items]
            )
        self.stats.items += len(items)
        if items:
            yield items

    def _cursor_batches(self, size: int) -> Iterator[list[bytes]]:
        from sqlalchemy import text

        try:
            with self.engine.connect() as conn:
                result = conn.execution_options(stream_results=True, yield_per=size).execute(
                    text(self.query), self.params
                )
                names = list(result.keys())
                fmt = ItemFormatter(names, self.column, self.template, self.prefix)
                index = fmt.index
                for rows in result.partitions(size):
                    self.stats.rows += len(rows)
                    if fmt.template is not None:
                        texts = [[_text(v) for v in row] for row in rows]
                        items = [fmt.text_item(row) for row in texts if all(row[i] for i in fmt.indexes)]
                    else:
                        items = [_item(row[index], fmt.prefix) for row in rows]
                        items = [item for item in items if item]
                    self.stats.blank += len(rows) - len(items)
                    self.stats.items += len(items)
                    if items:
                        yield items
        except (UsageError, SourceError, GeneratorExit):
            raise
        except Exception as exc:  # the driver's errors, one line each and without the password
            raise self._error(exc, "the query") from None


_COPY_ESCAPES = {b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v", b"\\": b"\\"}
_COPY_ESCAPE = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|(.))", re.S)


def _copy_unescape(field: bytes) -> bytes:
    """A field of PostgreSQL's COPY text format as its bytes; ``\\N`` (NULL) becomes empty."""
    if field == b"\\N":
        return b""

    def one(match: re.Match[bytes]) -> bytes:
        octal, hexa, char = match.groups()
        if octal:
            return bytes([int(octal, 8) & 0xFF])
        if hexa:
            return bytes([int(hexa, 16)])
        return _COPY_ESCAPES.get(char, char)

    return _COPY_ESCAPE.sub(one, field)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def _item(value: Any, prefix: bytes) -> bytes:
    if value is None:
        return b""
    if isinstance(value, bytes):
        raw = value
    elif isinstance(value, memoryview):
        raw = value.tobytes()
    else:
        raw = str(value).encode("utf-8")
    return prefix + raw if raw and prefix else raw


def open_source(*, csv_path: str | None, sql: str | None, db_url: str | None, **options: Any) -> CsvSource | SqlSource:
    if bool(csv_path) == bool(sql):
        raise UsageError("give exactly one of --from-csv PATH and --from-sql QUERY")
    if csv_path:
        return CsvSource(csv_path, **options)
    if not db_url:
        raise UsageError("--from-sql needs --db-url (or BLOOMCTL_DB_URL)")
    sql_options = {k: options[k] for k in ("column", "template", "prefix") if k in options}
    return SqlSource(db_url, sql, **sql_options)
