"""Items from Arrow columns: the item recipe (column, template, prefix) applied to whole arrays.

Shared by every source read through Arrow (CSV, Parquet, ADBC). The columns arrive as binary
arrays; a null or empty value in any column the recipe uses makes the row blank: skipped, and
counted, as on the row-by-row paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bloomctl.errors import UsageError
from bloomctl.sources.arrow_values import binary_scalar, false_scalar, zero_of
from bloomctl.sources.base import ItemFormatter

if TYPE_CHECKING:  # pragma: no cover - annotations only: pyarrow loads when a batch is read
    import pyarrow as pa


def items_of(columns: list[Any], fmt: ItemFormatter) -> tuple[Any, int]:
    """The items of one batch (a binary array) and how many rows were blank. ``columns`` are the
    recipe's columns in its order (``fmt.indexes``, or the one ``fmt.index``)."""
    import pyarrow.compute as pc

    if fmt.template is None and not fmt.prefix and len(columns) == 1 and _none_blank(columns[0]):
        return _whole(columns[0]), 0  # most batches: the column is the items, as it is
    keep = None
    for column in columns:
        lengths = pc.binary_length(column)
        present = pc.fill_null(pc.greater(lengths, zero_of(lengths.type)), false_scalar())
        keep = present if keep is None else pc.and_(keep, present)
    kept_rows = pc.sum(keep).as_py() or 0 if len(columns[0]) else 0
    # Most batches have no blank: their columns are used as they are (a filter would copy them).
    kept = columns if kept_rows == len(columns[0]) else [column.filter(keep) for column in columns]
    blank = len(columns[0]) - kept_rows
    empty = binary_scalar(b"")
    if fmt.template is not None:
        pieces: list[Any] = []
        for literal, column in zip(fmt.literals, kept, strict=False):
            pieces += [binary_scalar(literal), column]
        pieces.append(binary_scalar(fmt.literals[-1]))
        items = pc.binary_join_element_wise(*pieces, empty)
    elif fmt.prefix:
        items = pc.binary_join_element_wise(binary_scalar(fmt.prefix), kept[0], empty)
    else:
        items = kept[0]
    return _whole(items), blank


def formatter_for(
    schema: Any, column: str | None, template: str | None, prefix: str | None, what: str = "column"
) -> ItemFormatter:
    """The item recipe over an Arrow schema, its columns checked: text, binary or integer
    (dictionary-encoded ones by their values). Other types are refused up front: their text form
    would be a choice bloomctl should not make for you."""
    import pyarrow as pa

    fmt = ItemFormatter(list(schema.names), column, template, prefix)
    for index in fmt.indexes or [fmt.index]:
        kind = schema.field(index).type
        if pa.types.is_dictionary(kind):  # pandas categoricals: judged by their values
            kind = kind.value_type
        if getattr(pa.types, "is_string_view", lambda _: False)(kind) or getattr(
            pa.types, "is_binary_view", lambda _: False
        )(kind):
            continue
        if not (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)
            or pa.types.is_integer(kind)
        ):
            raise UsageError(
                "%s %r has type %s: items are built from text, binary or integer columns",
                what,
                schema.names[index],
                str(kind),
            )
    return fmt


def render(batch: Any, fmt: ItemFormatter, schema: Any) -> tuple[Any, int]:
    """The items of a record batch (binary), and how many rows were blank."""
    return items_of([_as_binary(batch.column(schema.names[i])) for i in (fmt.indexes or [fmt.index])], fmt)


def _as_binary(column: pa.Array) -> pa.Array:
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):  # a column of a Table
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if pa.types.is_integer(column.type):
        column = column.cast(pa.string())  # decimal digits, as str() of the number
    return column.cast(pa.binary())  # one batch holds far less than the 2 GiB of 32-bit offsets


def _whole(items: pa.Array | pa.ChunkedArray) -> pa.Array:
    import pyarrow as pa

    return items.combine_chunks() if isinstance(items, pa.ChunkedArray) else items


def _none_blank(column: Any) -> bool:
    """Whether no value of a binary array is null or empty, read from its offsets with numpy (a
    tenth of what Arrow's compute calls cost per batch); False when that cannot be told so."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray) or column.null_count or len(column) == 0:
        return False
    if pa.types.is_binary(column.type) or pa.types.is_string(column.type):
        width = "<i4"
    elif pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type):
        width = "<i8"
    else:
        return False
    try:
        import numpy as np
    except ImportError:
        return False
    offsets = np.frombuffer(column.buffers()[1], dtype=width, count=column.offset + len(column) + 1)[column.offset :]
    return not bool((offsets[1:] == offsets[:-1]).any())
