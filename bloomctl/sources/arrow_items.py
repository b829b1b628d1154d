"""Items from Arrow columns: the item recipe (column, template, prefix) applied to whole arrays.

Shared by every source read through Arrow (CSV, Parquet, ADBC). The columns arrive as binary
arrays; a null or empty value in any column the recipe uses makes the row blank: skipped, and
counted, as on the row-by-row paths.
"""

from __future__ import annotations

from typing import Any

from bloomctl.sources.base import ItemFormatter


def items_of(columns: list[Any], fmt: ItemFormatter) -> tuple[Any, int]:
    """The items of one batch (a binary array) and how many rows were blank. ``columns`` are the
    recipe's columns in its order (``fmt.indexes``, or the one ``fmt.index``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keep = None
    for column in columns:
        present = pc.fill_null(pc.greater(pc.binary_length(column), 0), False)
        keep = present if keep is None else pc.and_(keep, present)
    kept_rows = pc.sum(keep).as_py() or 0 if len(columns[0]) else 0
    # Most batches have no blank: their columns are used as they are (a filter would copy them).
    kept = columns if kept_rows == len(columns[0]) else [column.filter(keep) for column in columns]
    blank = len(columns[0]) - kept_rows
    empty = pa.scalar(b"", pa.binary())
    if fmt.template is not None:
        pieces: list[Any] = []
        for literal, column in zip(fmt.literals, kept, strict=False):
            pieces += [pa.scalar(literal, pa.binary()), column]
        pieces.append(pa.scalar(fmt.literals[-1], pa.binary()))
        items = pc.binary_join_element_wise(*pieces, empty)
    elif fmt.prefix:
        items = pc.binary_join_element_wise(pa.scalar(fmt.prefix, pa.binary()), kept[0], empty)
    else:
        items = kept[0]
    if isinstance(items, pa.ChunkedArray):
        items = items.combine_chunks()
    return items, blank
