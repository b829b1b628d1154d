"""PostgreSQL's fast path: ``COPY (SELECT column FROM (query)) TO STDOUT`` read straight from libpq.

Twice the rows per second of the cursor path, for columns whose COPY text is exactly the bytes
the cursor path gives (text and integer types); anything else (booleans, timestamps, bytea ...)
keeps the cursor path. Errors propagate to the caller, which words them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from bloomctl.errors import SourceError
from bloomctl.sources.base import ItemFormatter, SourceStats, cancellable, dbapi_cancel

# PostgreSQL type OIDs whose COPY text form equals str() of the value psycopg returns:
# text, varchar, bpchar, name, int2, int4, int8, uuid.
COPY_SAFE_TYPES = frozenset({25, 1043, 1042, 19, 21, 23, 20, 2950})

_COPY_ESCAPES = {b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v", b"\\": b"\\"}
_COPY_ESCAPE = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|(.))", re.S)


def available(engine: Any, params: dict[str, Any], template: str | None) -> bool:
    """PostgreSQL through psycopg, without bound parameters or a template."""
    if params or template is not None:
        return False
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False
    return bool(engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg")


def copy_column(engine: Any, query: str, column: str | None, prefix: str | None) -> tuple[int, int, bytes] | None:
    """The item column's position, the query's width and the prefix, when COPY's text gives exactly
    the bytes the cursor path gives; None otherwise."""
    from sqlalchemy import text

    with engine.connect() as conn:
        result = conn.execute(text(f"SELECT * FROM ({query}) AS bloomctl_cols LIMIT 0"))
        names = list(result.keys())
        types = [description.type_code for description in result.cursor.description]
    fmt = ItemFormatter(names, column, None, prefix)
    if types[fmt.index] not in COPY_SAFE_TYPES:
        return None
    return fmt.index, len(names), fmt.prefix


def copy_batches(
    engine: Any, query: str, size: int, index: int, width: int, prefix: bytes, stats: SourceStats
) -> Iterator[list[bytes]]:
    """Items from COPY's text rows: one libpq call per row. The text format has one row per line,
    and a newline inside a value arrives as the escape ``\\n``, so raw newlines always separate rows.
    """
    import psycopg
    from psycopg import pq

    # Only the item's column travels: no splitting here, and fewer bytes from the server.
    from bloomctl.sources.adbc import positional
    from bloomctl.sources.urls import libpq_uri

    select = f"SELECT c{index} FROM ({query}) AS {positional(width)}"  # by position: names may repeat
    conninfo = libpq_uri(engine.url)
    # UTF8 whatever the URL or PGCLIENTENCODING say: items are stored as UTF-8, as on the cursor path
    with (
        psycopg.connect(conninfo, autocommit=True, client_encoding="UTF8") as raw,
        cancellable(dbapi_cancel(raw) or _nothing),
    ):
        pgconn = raw.pgconn
        pgconn.send_query(f"COPY ({select}) TO STDOUT".encode())
        result = pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_OUT:
            message = result.error_message if result is not None else b"no result"
            raise SourceError("COPY failed: %s", message.decode(errors="replace").strip())
        get, done = pgconn.get_copy_data, False
        while not done:
            rows: list[Any] = []  # bytes or memoryview, whichever libpq's wrapper gives
            append = rows.append
            for _ in range(size):  # the hot loop: one libpq call and one append per row
                nbytes, data = get(0)
                if nbytes < 0:
                    done = True
                    break
                append(data)
            if rows:
                yield from copy_items(rows, prefix, stats)
        while (result := pgconn.get_result()) is not None:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                raise SourceError("COPY failed: %s", result.error_message.decode(errors="replace").strip())


def _nothing() -> None:
    return None


def copy_items(rows: list[Any], prefix: bytes, stats: SourceStats) -> Iterator[list[bytes]]:
    """The items of a list of COPY rows (one value each, ending with a newline), counted in ``stats``."""
    body = b"".join(rows)[:-1]
    count = len(rows)
    values = body.split(b"\n")
    if b"\\" in body:
        values = [copy_unescape(v) if b"\\" in v else v for v in values]
    stats.rows += count
    items = [v for v in values if v] if b"" in values else values
    stats.blank += count - len(items)
    if prefix and items:
        items = (
            # C-speed prefixing when no value holds a newline: none does unless an escape made one
            (prefix + (b"\n" + prefix).join(items)).split(b"\n") if b"\\" not in body else [prefix + v for v in items]
        )
    stats.items += len(items)
    if items:
        yield items


def copy_unescape(field: bytes) -> bytes:
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
