"""What every source is: the ``Source`` protocol, its statistics, and the item recipe.

A source yields lists of items (UTF-8 bytes) so the loader's per-item Python work stays small,
and its memory does not grow with the input. Rows that cannot be read are counted, and beyond
``skip_bad_rows`` stop the run with file:line. Blank values are skipped and counted. An
``IncrementalSource`` (SQL) can also narrow itself to the rows changed since a moment, for the
rebuild's catch-up.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from bloomctl.errors import SourceError, UsageError

MAX_EXAMPLES = 5
Batch = Any  # a list of bytes, or an Arrow binary array (sources read through Arrow)


def is_arrow(batch: Batch) -> bool:
    return hasattr(batch, "buffers") and hasattr(batch, "type")


_RUNNING: dict[int, Callable[[], object]] = {}  # queries running now: how to cancel each


@contextmanager
def cancellable(cancel: Callable[[], object]) -> Iterator[None]:
    """While the block runs, ``cancel_running`` can stop its query (a database's own cancel)."""
    token = object()
    _RUNNING[id(token)] = cancel
    try:
        yield
    finally:
        _RUNNING.pop(id(token), None)


def cancel_running() -> int:
    """Ask every running query to stop on its server (Ctrl-C, SIGTERM: a query left running would
    go on for as long as it takes); returns how many were asked."""
    asked = 0
    for cancel in list(_RUNNING.values()):
        try:
            cancel()
            asked += 1
        except Exception:  # best effort: the process is stopping anyway
            continue
    return asked


def dbapi_cancel(connection: Any) -> Callable[[], object] | None:
    """The cancel of a DB-API connection, where its driver has one (psycopg: cancel_safe/cancel,
    sqlite3: interrupt; PyMySQL: KILL QUERY from a second connection); None otherwise."""
    for name in ("cancel_safe", "cancel", "interrupt"):
        method = getattr(connection, name, None)
        if callable(method):
            return method
    if type(connection).__module__.startswith("pymysql") and callable(getattr(connection, "thread_id", None)):
        return _mysql_kill_query(connection)
    return None


def _mysql_kill_query(connection: Any) -> Callable[[], object]:
    """MySQL and MariaDB stop a running query on ``KILL QUERY <id>`` sent by another connection."""
    thread = int(connection.thread_id())

    def cancel() -> None:
        import pymysql  # type: ignore[import-untyped]

        killer = pymysql.connect(
            host=connection.host,
            port=connection.port,
            user=connection.user,
            password=connection.password,
            unix_socket=connection.unix_socket,
            ssl=connection.ctx if getattr(connection, "_ssl_required", False) else None,  # TLS as required
            connect_timeout=5,
        )
        try:
            with killer.cursor() as cursor:
                cursor.execute(f"KILL QUERY {thread}")
        finally:
            killer.close()

    return cancel


def recipe_of(source: Any) -> dict[str, object]:
    """How a source builds its items: its kind and its column, template and prefix (what the
    metadata records, so a swap can refuse items built otherwise than the active filter's). An
    engine's DataFrame builds its items by the Parquet rules, and is recorded as Parquet."""
    kinds = {"CsvSource": "csv", "SqlSource": "sql", "ParquetSource": "parquet", "FrameSource": "parquet"}
    kind = next((kinds[c.__name__] for c in type(source).__mro__ if c.__name__ in kinds), type(source).__name__)
    recipe: dict[str, object] = {"source": kind}  # (a subclass of a CSV source reads CSV)
    for name in ("column", "template", "prefix"):
        value = getattr(source, name, None)
        recipe[name] = value if value not in ("", b"") else None
    return recipe


def item_list(batch: Batch) -> list[bytes]:
    """The items of a batch as Python bytes (what the server path sends)."""
    if not is_arrow(batch):
        return batch if isinstance(batch, list) else list(batch)
    import pyarrow as pa

    if pa.types.is_string(batch.type):
        batch = batch.cast(pa.binary())
    elif pa.types.is_large_string(batch.type):
        batch = batch.cast(pa.large_binary())
    items: list[bytes] = batch.to_pylist()
    return items


def item_take(batch: Batch, indexes: list[int]) -> list[bytes]:
    """Some items of a batch, as bytes (the verification sample)."""
    if not indexes:
        return []
    if is_arrow(batch):
        from bloomctl.sources.arrow_values import int64_array

        return item_list(batch.take(int64_array(indexes)))
    return [batch[i] for i in indexes]


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


@runtime_checkable
class Source(Protocol):
    """A stream of items, in batches; ``stats`` describes the last pass."""

    stats: SourceStats

    @property
    def description(self) -> str:
        """How the source is named in messages (no secrets)."""
        ...

    @property
    def rewindable(self) -> bool:
        """Whether it can be read twice (a file can, stdin cannot)."""
        ...

    def preflight(self) -> None:
        """Open the source and check the item recipe against it, before anything is written."""

    def count(self) -> int:
        """Rows in the source (quickly): the estimate behind ``capacity`` auto."""
        ...

    def batches(self, size: int) -> Iterator[list[bytes]]:
        """One pass over the source: lists of at most ``size`` items."""
        ...

    def fast_batches(self, size: int) -> Iterator[Batch]:
        """``batches``, possibly as Arrow binary arrays (a client build hashes those without
        making a Python object per item)."""
        ...

    @property
    def shared_parse(self) -> bool:
        """Whether every part (``part``) reads the whole source: then each part counts every row."""
        ...

    def part(self, index: int, parts: int, split_column: str | None = None) -> Source:
        """Share ``index`` of ``parts`` of the items, for a build in several processes."""
        ...


@runtime_checkable
class IncrementalSource(Source, Protocol):
    """A source whose rows carry a change time: the rebuild catches up on rows changed during the load."""

    def now(self) -> datetime:
        """The source's own clock (the moment the load starts, as the rows' times see it)."""
        ...

    def check_column_name(self, column: str) -> str:
        """``column``, when it can name the change-time column; a UsageError otherwise."""
        ...

    def check_selected(self, column: str, option: str) -> None:
        """A UsageError when the rows do not carry ``column`` (named by ``option``); after ``preflight``."""
        ...

    def since(self, column: str, moment: Any) -> IncrementalSource:
        """The rows whose ``column`` is at or after ``moment``."""
        ...

    def before(self, column: str, moment: Any) -> IncrementalSource:
        """The rows whose ``column`` is before ``moment``."""
        ...


class ItemFormatter:
    """Turns the selected column (or, with a template, several columns) of a row into an item."""

    def __init__(self, names: list[str] | None, column: str | None, template: str | None, prefix: str | None) -> None:
        if template and prefix:
            raise UsageError("`template` and `prefix` exclude each other")
        if template and column:
            raise UsageError("`template` names its columns itself: leave out `column`")
        self.names = names
        self.prefix = (prefix or "").encode()
        self.template: str | None = None
        self.indexes: list[int] = []
        self.literals: list[bytes] = []  # a template's text around its fields: len(indexes) + 1 pieces
        if template:
            pieces: list[str] = []
            try:
                parsed = list(string.Formatter().parse(template))
            except ValueError as exc:
                raise UsageError("`template` %r: %s", template, exc) from None
            for literal, name, spec, conversion in parsed:
                pieces.append(literal.replace("{", "{{").replace("}", "}}"))
                if len(self.literals) == len(self.indexes):
                    self.literals.append(literal.encode())
                else:
                    self.literals[-1] += literal.encode()
                if name is None:
                    continue
                if spec or conversion:
                    raise UsageError("`template` field {%s}: format specs and conversions are not supported", name)
                pieces.append(f"{{{len(self.indexes)}}}")
                self.indexes.append(self.column_index(name))
            if not self.indexes:
                raise UsageError("`template` has no {column} field")
            if len(self.literals) == len(self.indexes):
                self.literals.append(b"")
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
            raise UsageError("column %r: without a header, name columns by position (1, 2, ...)", column)
        shown = header_names(self.names)
        if shown is None:
            raise UsageError("no column %r; the header's %s fields %s", column, len(self.names), NOT_SHOWN)
        raise UsageError("no column %r; the header has: %s", column, shown)

    @property
    def width(self) -> int:
        """How many fields a row needs."""
        return self.index + 1

    def text_item(self, row: list[str]) -> bytes:
        if self.template is not None:
            return self.template.format(*(row[i] for i in self.indexes)).encode("utf-8")
        return self.prefix + row[self.index].encode("utf-8")


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
            if self.tolerance:
                raise SourceError("%s", where)
            raise SourceError("%s (`skip_bad_rows` N tolerates up to N bad rows)", where)


def merge_stats(parts: list[SourceStats], shared_parse: bool) -> SourceStats:
    """The statistics of a source read in parts: items add up; rows, blanks and bad rows add up
    too, unless every part read every row (then any part's count is the whole's)."""
    first = parts[0]
    merged = SourceStats(items=sum(part.items for part in parts))
    if shared_parse:
        merged.rows, merged.blank, merged.bad_rows, merged.examples = (
            first.rows,
            first.blank,
            first.bad_rows,
            first.examples,
        )
    else:
        merged.rows = sum(part.rows for part in parts)
        merged.blank = sum(part.blank for part in parts)
        merged.bad_rows = sum(part.bad_rows for part in parts)
        merged.examples = [example for part in parts for example in part.examples][:MAX_EXAMPLES]
    return merged


STOP_WAIT = 10.0  # seconds a stopped reader gets to finish the read it is in (a slow query's fetch)


def prefetched(batches: Iterator[Batch], depth: int = 4) -> Iterator[Batch]:
    """``batches`` read ahead by a thread of their own, up to ``depth`` batches: parsing (pyarrow,
    a database driver) overlaps with hashing the previous batch (numpy), which both run outside
    the GIL for the most part. An error in the reading thread is raised here, in order; stopping
    early stops the reader (which then closes the source itself, in its own thread)."""
    import queue
    import threading

    done = object()
    pipe: queue.Queue[Any] = queue.Queue(depth)
    stop = threading.Event()

    def put(value: Any) -> bool:
        while not stop.is_set():
            try:
                pipe.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for batch in batches:
                if not put(batch):
                    break
        except BaseException as exc:  # handed to the consumer, who raises it
            put(_Failed(exc))
            return
        finally:
            if stop.is_set() and hasattr(batches, "close"):
                batches.close()
        put(done)

    reader = threading.Thread(target=read, name="bloomctl-source", daemon=True)
    reader.start()
    try:
        while (value := pipe.get()) is not done:
            if isinstance(value, _Failed):
                raise value.error
            yield value
    finally:
        stop.set()
        if reader is not threading.current_thread():
            reader.join(STOP_WAIT)  # a stopped pass is over before another begins (sources reuse .stats)


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_COLUMN_NAME = re.compile(r"[\w .()\[\]/#%`-]{1,64}")


def header_names(names: list[str]) -> str | None:
    """A header's names for an error line, when they look like column names; None when they do not:
    a file that is not the export meant (a credentials file, say) never has its first line printed."""
    if len(names) <= 64 and all(_COLUMN_NAME.fullmatch(name) for name in names):
        return ", ".join(names)
    return None


NOT_SHOWN = "do not look like column names (not shown: is it the file meant?)"
