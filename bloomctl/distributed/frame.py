"""An engine's DataFrame as a rebuild's source.

The engine's workers read it to build the bits (``Engine.build``); the driver reads it only where
a rebuild must read the source itself: ``verify_all``'s second pass, and the server path a
scaling filter falls back to when its items outgrow one sub-filter. Items are built from its
columns by the Parquet rules (``bloomctl.sources.arrow_items``): text, binary and integer
columns, a null or empty value is blank.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from bloomctl.errors import UsageError
from bloomctl.sources.arrow_items import formatter_for, render
from bloomctl.sources.base import Batch, ItemFormatter, SourceStats, item_list

_PARAMETERS = re.compile(r"[;?&](token|password|secret|key|access_key|secret_key)=[^;&\s'\"]*", re.I)


def shown(text: str) -> str:
    """A URL, or a message that quotes one, as it may be shown: user and password removed from
    every ``scheme://user:password@`` and the value of every secret parameter (Spark Connect's
    ``;token=``, ``?password=``) replaced by ``***``."""
    text = re.sub(r"(://)[^/@\s'\"]*@", r"\1***@", text)
    return _PARAMETERS.sub(lambda m: m.group(0).split("=", 1)[0] + "=***", text)


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class FrameSource:
    """Items from ``column`` (or ``template`` over several columns, with ``prefix``: the recipe,
    which ``frame_source`` of each engine passes on as it is given) of an engine's DataFrame. ``schema`` is its Arrow schema, ``rows`` counts its rows (on the engine), and
    ``read`` yields its record batches on the driver."""

    engine_readable = True
    rewindable = True  # the engine reads it again
    shared_parse = False

    def __init__(
        self,
        description: str,
        schema: Any,
        rows: Callable[[], int],
        read: Callable[[list[str]], Iterator[Any]],
        *,
        column: str | None = None,
        template: str | None = None,
        prefix: str | None = None,
        frame: Any = None,
    ) -> None:
        self._description = description
        self.frame = frame  # the engine's own DataFrame, which its workers read
        self.schema = schema
        self._rows, self._read = rows, read
        self.column, self.template, self.prefix = column, template, prefix
        self.stats = SourceStats()

    @property
    def description(self) -> str:
        return self._description

    def formatter(self) -> ItemFormatter:
        return formatter_for(self.schema, self.column, self.template, self.prefix)

    @property
    def columns(self) -> list[str]:
        """The columns the recipe reads, in the frame's order (what the tasks select)."""
        fmt = self.formatter()
        return [self.schema.names[i] for i in sorted(set(fmt.indexes or [fmt.index]))]

    def preflight(self) -> None:
        self.formatter()

    def count(self) -> int:
        return int(self._rows())

    def batches(self, size: int) -> Iterator[list[bytes]]:
        for batch in self.fast_batches(size):
            yield item_list(batch)

    def fast_batches(self, size: int) -> Iterator[Batch]:
        """The items, read on the driver through the engine (slower than the workers' build:
        only a verification of every item or the server path read this way)."""
        self.stats = SourceStats()
        fmt = self.formatter()
        for batch in self._read(self.columns):
            for piece in batch.to_batches(max_chunksize=size) if hasattr(batch, "to_batches") else [batch]:
                items, blank = render(piece, fmt, self.schema)  # the columns by name
                self.stats.rows += piece.num_rows
                self.stats.blank += blank
                self.stats.items += len(items)
                if len(items):
                    yield items

    def part(self, index: int, parts: int, split_column: str | None = None) -> FrameSource:
        raise UsageError("a DataFrame is shared out by its engine: leave out `jobs`")
