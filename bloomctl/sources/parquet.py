"""Parquet files (one file, or a directory of them) as a source, read with pyarrow.

Items are built as from a CSV row: one column (text, binary or an integer, written as decimal
digits), or a template over several, with an optional prefix. A null or empty value is blank
(skipped and counted). Other column types are refused up front: their text form would be a
choice bloomctl should not make for you (build the item in the export, or use ``template``
over text columns).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from bloomctl import extras
from bloomctl.errors import SourceError, UsageError
from bloomctl.sources.arrow_items import formatter_for, render
from bloomctl.sources.base import Batch, ItemFormatter, SourceStats, item_list

if TYPE_CHECKING:  # pragma: no cover - annotations only: pyarrow loads when the files are read
    import pyarrow as pa


class ParquetSource:
    """Items from one column of a Parquet file or of every ``*.parquet`` file under a directory."""

    rewindable = True

    def __init__(
        self, path: str, *, column: str | None = None, template: str | None = None, prefix: str | None = None
    ) -> None:
        extras.require(extras.PARQUET)
        self.path = path
        self.column, self.template, self.prefix = column, template, prefix
        self.stats = SourceStats()
        self.share: tuple[int, int] | None = None  # (index, parts): this part's row groups only
        self.listing: tuple[Any, ...] | None = None  # the files and row groups the parts were cut from

    @property
    def description(self) -> str:
        return f"Parquet {self.path}"

    def _files(self) -> list[tuple[str, Any]]:
        """Each file and its reader (``pyarrow.parquet.ParquetFile``), in path order. Not
        ``pyarrow.dataset``: importing it imports pandas wherever that is installed (0.24 s)."""
        import pyarrow.parquet as pq

        if not os.path.exists(self.path):
            raise SourceError("cannot read %s: no such file or directory", self.path)
        paths = [self.path]
        if os.path.isdir(self.path):  # the *.parquet files only (a README or _SUCCESS beside them is fine)
            paths = sorted(
                os.path.join(root, name)
                for root, dirs, names in os.walk(self.path)
                for name in names
                if name.endswith(".parquet")
                and not name.startswith((".", "_"))
                and not any(
                    part.startswith((".", "_"))
                    for part in os.path.relpath(root, self.path).split(os.sep)
                    if part != "."
                )
            )
            if not paths:
                raise SourceError("cannot read %s: no *.parquet file in this directory", self.path)
        opened = []
        for path in paths:
            try:
                opened.append((path, pq.ParquetFile(path)))
            except Exception as exc:  # pyarrow's ArrowInvalid and OSError: not Parquet, unreadable
                raise SourceError("cannot read %s: %s", self.path, str(exc).splitlines()[0]) from None
        return opened

    @staticmethod
    def _schema(files: list[tuple[str, Any]]) -> pa.Schema:
        """The first file's schema: the one the recipe is checked against (as a dataset's would be)."""
        return files[0][1].schema_arrow

    def _formatter(self, schema: Any) -> ItemFormatter:
        return formatter_for(schema, self.column, self.template, self.prefix, "Parquet column")

    shared_parse = False  # each part reads its own row groups

    def part(self, index: int, parts: int, split_column: str | None = None) -> ParquetSource:
        """A reader of row groups ``index``, ``index + parts``, ... of all the files (in path order)
        for process ``index`` of ``parts``: each row group is read by one process only. An item
        repeated in row groups of two parts is counted by both (the build's count policy)."""
        if split_column is not None:
            raise UsageError("`split_column` splits SQL sources; Parquet files are shared out by row group")
        if self.listing is None:  # read once, for every part: each job checks it reads the same files
            self.listing = _listing(_row_groups(self._files()))
        part = ParquetSource(self.path, column=self.column, template=self.template, prefix=self.prefix)
        part.share, part.listing = (index, parts), self.listing
        return part

    def preflight(self) -> None:
        self._formatter(self._schema(self._files()))

    def count(self) -> int:
        return sum(int(reader.metadata.num_rows) for _path, reader in self._files())

    def batches(self, size: int) -> Iterator[list[bytes]]:
        for batch in self.fast_batches(size):
            yield item_list(batch)

    def fast_batches(self, size: int) -> Iterator[Batch]:
        self.stats = SourceStats()
        files = self._files()
        schema = self._schema(files)
        fmt = self._formatter(schema)
        names = [schema.names[i] for i in sorted(set(fmt.indexes or [fmt.index]))]
        try:
            for batch in self._scan(files, names, size):
                items, blank = render(batch, fmt, schema)
                self.stats.rows += batch.num_rows
                self.stats.blank += blank
                self.stats.items += len(items)
                if len(items):
                    yield items
        except (UsageError, SourceError):
            raise
        except Exception as exc:  # a damaged file part-way
            raise SourceError("cannot read %s: %s", self.path, str(exc).splitlines()[0]) from None

    def _scan(self, files: list[tuple[str, Any]], names: list[str], size: int) -> Iterator[Any]:
        groups = _row_groups(files)
        if self.share is not None:
            if _listing(groups) != self.listing:  # a file came, went or changed since the parts were cut
                raise SourceError("the Parquet files at %s changed while the jobs read them", self.path)
            index, parts = self.share
            groups = groups[index::parts]
        for _path, reader, group, _rows in groups:
            yield from reader.iter_batches(batch_size=size, row_groups=[group], columns=names)


def _row_groups(files: list[tuple[str, Any]]) -> list[tuple[str, Any, int, int]]:
    """Every row group of every file, in path order (the order of a read in one process): its
    file, the file's reader, its index in the file and its rows."""
    return [
        (path, reader, group, int(reader.metadata.row_group(group).num_rows))
        for path, reader in files
        for group in range(reader.metadata.num_row_groups)
    ]


def _listing(groups: list[tuple[str, Any, int, int]]) -> tuple[Any, ...]:
    """What the parts are cut from: each row group's file (and its size) and rows."""
    return tuple((path, os.path.getsize(path), group, rows) for path, _reader, group, rows in groups)
