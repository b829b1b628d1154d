"""What the tasks of a distributed build run: a picklable ``BuildSpec``, the ``Part`` each task builds, and their merge.

A task never connects to Redis. It gets the spec (the backend, the standbys' layouts read by the
driver, and the item recipe), turns Arrow record batches of its share of the data into a
``Part`` (the filter's bits as this share sets them, the items the share counted as the server
would, its row statistics and its share of the verification sample), and hands the part back.
Parts merge by OR: the merge is associative and commutative, so any tree of merges gives the bits
of one build over all the data. Counts add; an item in two shares is counted by both, which the
driver settles against the bits (``Build.settle``).

A part travels as an Arrow table (``to_arrow``/``from_arrow``): one row per chunk of at most
``CHUNK_BYTES`` of bits, far below Arrow's 2 GiB binary cell and small enough for an engine's
result limits, plus one row for the counts and one per sampled item.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from bloomctl.errors import UsageError
from bloomctl.sources.base import ItemFormatter, SourceStats, is_arrow, merge_stats

if TYPE_CHECKING:  # pragma: no cover - annotations only: pyarrow loads when a part is built
    import pyarrow as pa

CHUNK_BYTES = 32 << 20  # bits per Arrow row of a part


@dataclass
class Part:
    """A share of the data built into fresh bit arrays (numpy), one per member of the filter."""

    datas: list[Any]
    counts: list[int]  # items each member counted, as the server would within this share
    largest: list[int]  # the largest count any single share gave each member (the count policy's floor)
    stats: SourceStats
    sample_keys: Any  # the sample's random keys (numpy float64); the smallest win when parts merge
    sample: list[bytes]
    sample_size: int

    @property
    def nbytes(self) -> int:
        return sum(int(data.nbytes) for data in self.datas)


def merge(a: Part, b: Part) -> Part:
    """The part of both shares: bits ORed, counts added, samples joined (the smallest keys win,
    as if one reservoir had seen both). Neither input is changed."""
    import numpy as np

    _check_same(a, b)
    return _joined(a, b, [np.bitwise_or(x, y) for x, y in zip(a.datas, b.datas, strict=True)])


def merge_all(parts: Iterable[Part]) -> Part:
    """Every part merged, left to right, into the first one's arrays (the parts are the caller's
    to give up): memory for the merged part and the one arriving, no third copy."""
    import numpy as np

    merged: Part | None = None
    for part in parts:
        if merged is None:
            merged = part
            continue
        _check_same(merged, part)
        for mine, theirs in zip(merged.datas, part.datas, strict=True):
            np.bitwise_or(mine, theirs, out=mine)
        merged = _joined(merged, part, merged.datas)
    if merged is None:
        raise ValueError("no part to merge")
    return merged


def _check_same(a: Part, b: Part) -> None:
    if len(a.datas) != len(b.datas) or any(x.shape != y.shape for x, y in zip(a.datas, b.datas, strict=True)):
        raise ValueError("parts of different filters cannot be merged")


def _joined(a: Part, b: Part, datas: list[Any]) -> Part:
    """``datas`` (the two parts' bits ORed) with both parts' counts, statistics and samples."""
    import numpy as np

    size = max(a.sample_size, b.sample_size)
    keys = np.concatenate([a.sample_keys, b.sample_keys])
    pool = a.sample + b.sample
    if len(pool) > size:
        keep = np.argpartition(keys, size - 1)[:size] if size else np.empty(0, dtype=np.int64)
        keys, pool = keys[keep], [pool[i] for i in keep.tolist()]
    return Part(
        datas,
        [x + y for x, y in zip(a.counts, b.counts, strict=True)],
        [max(x, y) for x, y in zip(a.largest, b.largest, strict=True)],
        merge_stats([a.stats, b.stats], shared_parse=False),
        keys,
        pool,
        size,
    )


@dataclass(frozen=True)
class BuildSpec:
    """All a task needs to build its part: picklable, and without a connection or a secret.

    ``column``, ``template`` and ``prefix`` are the item recipe exactly as ``rebuild`` reads it
    from Parquet: text, binary and integer columns (integers as decimal digits), a row with a
    null or empty value in a column the recipe uses is blank (skipped and counted)."""

    backend: str  # "redisbloom" or "bitmap": the bit scheme
    layouts: tuple[Any, ...]  # each member's layout, read from its standby by the driver
    names: tuple[str, ...]  # each member's standby, for messages
    column: str | None = None
    template: str | None = None
    prefix: str | None = None
    sample_size: int = 0  # items each part keeps for the verification
    seed: int | None = None  # with a seed, part ``index`` draws its sample from ``seed + index``
    columns: tuple[str, ...] = field(default=())  # the columns the recipe reads (what a task selects)

    def new_part(self, index: int = 0) -> _Builder:
        return _Builder(self, index)

    def partial(self, batches: Iterable[Any], index: int = 0, *, onto: Part | None = None) -> Part:
        """The part of ``batches``: Arrow record batches or tables holding the recipe's columns
        (others are ignored), or binary arrays of finished items. ``index`` tells the tasks of
        one build apart where a seed is fixed. With ``onto``, the part of that part's share and
        these batches (``onto`` is not changed: a task an engine runs again gets the same input)."""
        builder = self.new_part(index)
        if onto is not None:
            builder.start_from(onto)
        for batch in batches:
            builder.add(batch)
        return builder.part()


class _Builder:
    """A part being built, batch by batch."""

    def __init__(self, spec: BuildSpec, index: int) -> None:
        from bloomctl.rebuild.build.client import Build
        from bloomctl.rebuild.sampling import KeyedReservoir

        self.spec = spec
        self.build = Build(spec.backend, spec.layouts, spec.names, checked=False)
        self.sample = KeyedReservoir(spec.sample_size, None if spec.seed is None else spec.seed + index)
        self.stats = SourceStats()
        self._recipe: tuple[Any, Any] | None = None  # (schema, formatter) of the last record batch

    def start_from(self, part: Part) -> None:
        """Go on from a copy of ``part``: its bits, counts, statistics and sample."""
        check_part(part, self.spec)
        for array, data, count in zip(self.build.arrays, part.datas, part.counts, strict=True):
            array.data[:] = data
            array.count = count
        self.stats = merge_stats([part.stats], shared_parse=False)
        self.sample.absorb(part.sample_keys, list(part.sample))

    def add(self, batch: Any) -> None:
        from bloomctl.sources.arrow_items import render

        if hasattr(batch, "schema") and hasattr(batch, "num_rows"):  # a record batch or a table
            schema = batch.schema
            if self._recipe is None or not self._recipe[0].equals(schema):
                self._recipe = (schema, self._formatter(schema))
            items, blank = render(batch, self._recipe[1], schema)
            self.stats.rows += batch.num_rows
            self.stats.blank += blank
        elif is_arrow(batch):  # items, ready
            items = batch
            self.stats.rows += len(items)
        else:
            raise TypeError(f"a part is built from Arrow record batches or arrays, not {type(batch).__name__}")
        self.stats.items += len(items)
        if len(items):
            self.sample.feed(items)
            self.build.add(items)

    def _formatter(self, schema: Any) -> ItemFormatter:
        from bloomctl.sources.arrow_items import formatter_for

        spec = self.spec
        return formatter_for(schema, spec.column, spec.template, spec.prefix)

    def part(self) -> Part:
        chosen = self.sample.items  # cuts the pool to the sample: the keys read next are the chosen items'
        counts = [array.count for array in self.build.arrays]
        return Part(
            [array.data for array in self.build.arrays],
            counts,
            list(counts),  # one sequential build: its count is what a server would count, a floor for the whole
            self.stats,
            self.sample.keys,
            chosen,
            self.spec.sample_size,
        )


# A part as an Arrow table: what engines move between tasks and to the driver.
_KINDS = ("bits", "counts", "sample")


def arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("kind", pa.string()),  # bits, counts or sample
            ("member", pa.int32()),  # bits: the member; else 0
            ("offset", pa.int64()),  # bits: the chunk's first byte
            ("data", pa.binary()),  # bits: the chunk; counts: JSON; sample: the item
            ("key", pa.float64()),  # sample: the item's random key
        ]
    )


def to_arrow(part: Part, chunk_bytes: int = CHUNK_BYTES) -> pa.Table:
    """``part`` as an Arrow table (see ``arrow_schema``)."""
    import pyarrow as pa

    return pa.Table.from_batches(list(arrow_batches(part, chunk_bytes)), schema=arrow_schema())


SAMPLE_ROWS = 4096  # sampled items per record batch


def arrow_batches(part: Part, chunk_bytes: int = CHUNK_BYTES) -> Iterator[pa.RecordBatch]:
    """``part`` as Arrow record batches: each chunk of bits in a batch of its own (at most
    ``chunk_bytes``), then the counts, then the sample."""
    import pyarrow as pa

    schema = arrow_schema()

    def batch(
        kinds: list[str], members: list[int], offsets: list[int], datas: list[Any], keys: list[Any]
    ) -> pa.RecordBatch:
        return pa.record_batch(
            [
                pa.array(kinds, pa.string()),
                pa.array(members, pa.int32()),
                pa.array(offsets, pa.int64()),
                pa.array(datas, pa.binary()),
                pa.array(keys, pa.float64()),
            ],
            schema=schema,
        )

    for member, data in enumerate(part.datas):
        raw = memoryview(data).cast("B")
        for start in range(0, max(len(raw), 1), chunk_bytes):
            yield batch(["bits"], [member], [start], [raw[start : start + chunk_bytes].tobytes()], [None])
    meta = {
        "counts": part.counts,
        "largest": part.largest,
        "stats": part.stats.as_dict(),
        "sample_size": part.sample_size,
        "sizes": [int(data.nbytes) for data in part.datas],
    }
    yield batch(["counts"], [0], [0], [json.dumps(meta).encode()], [None])
    keys = [float(key) for key in part.sample_keys]
    for start in range(0, len(part.sample), SAMPLE_ROWS):
        rows = len(part.sample[start : start + SAMPLE_ROWS])
        yield batch(
            ["sample"] * rows,
            [0] * rows,
            [0] * rows,
            part.sample[start : start + SAMPLE_ROWS],
            keys[start : start + rows],
        )


def from_arrow(table: Any) -> Part:
    """The part an Arrow table holds (``to_arrow``'s, or the rows of several parts' tables: those
    are merged). Checks that the chunks of every member tile it exactly once per part."""
    rows = zip(
        table.column("kind").to_pylist(),
        table.column("member").to_pylist(),
        table.column("offset").to_pylist(),
        (value.as_buffer() for value in table.column("data")),
        table.column("key").to_pylist(),
        strict=True,
    )
    return merge_all(parts_of(rows))


def parts_of(rows: Iterable[tuple[str, int, int, Any, Any]]) -> Iterator[Part]:
    """The parts in a stream of rows (kind, member, offset, data, key), each as soon as its last
    row has gone by: its bits rows, then its counts row, then its sample rows."""
    import numpy as np

    bits: list[tuple[int, int, Any]] = []
    meta: dict[str, Any] | None = None
    sample: list[bytes] = []
    keys: list[float] = []
    for kind, member, offset, data, key in rows:
        if kind not in _KINDS:
            raise ValueError(f"a part's row has the unknown kind {kind!r}")
        if kind == "bits":
            if meta is not None:  # the next part begins
                yield _assemble(meta, bits, keys, sample, np)
                meta, bits, sample, keys = None, [], [], []
            bits.append((member, offset, data))
        elif kind == "counts":
            if meta is not None:
                raise ValueError("a part has two counts rows")
            meta = json.loads(bytes(data))
        else:
            if meta is None:
                raise ValueError("a part's sample arrived before its counts row")
            sample.append(bytes(data))
            keys.append(key)
    if meta is not None:
        yield _assemble(meta, bits, keys, sample, np)
    elif bits:
        raise ValueError("a part's rows arrived without its counts row")


def _assemble(
    meta: dict[str, Any], bits: Sequence[tuple[int, int, Any]], keys: list[float], sample: list[bytes], np: Any
) -> Part:
    sizes = meta["sizes"]
    arrays = [np.zeros(size, dtype=np.uint8) for size in sizes]
    chunks: list[list[tuple[int, int]]] = [[] for _ in sizes]
    for member, offset, data in bits:
        view = np.frombuffer(data, dtype=np.uint8)
        if not 0 <= member < len(sizes) or offset < 0 or offset + view.size > sizes[member]:
            raise ValueError("a part's bits fall outside its filter")
        arrays[member][offset : offset + view.size] = view
        chunks[member].append((offset, offset + view.size))
    for member, size in enumerate(sizes):  # every byte once: the chunks tile the member, end to end
        end = 0
        for begin, stop in sorted(chunks[member]):
            if begin != end:
                raise ValueError(f"a part's bits are incomplete or doubled at byte {begin:,} of member {member}")
            end = stop
        if end != size:
            raise ValueError(f"a part's bits are incomplete: member {member} ends at byte {end:,} of {size:,}")
    stats = meta["stats"]
    return Part(
        arrays,
        [int(count) for count in meta["counts"]],
        [int(count) for count in meta["largest"]],
        SourceStats(
            rows=stats["rows"],
            items=stats["items"],
            blank=stats["blank"],
            bad_rows=stats["bad_rows"],
            examples=list(stats["bad_row_examples"]),
        ),
        np.array(keys, dtype=np.float64),
        sample,
        int(meta["sample_size"]),
    )


def check_recipe(column: str | None, template: str | None, prefix: str | None) -> None:
    """The recipe on its own: a column or a template, not both (``ItemFormatter`` checks the rest
    against the data's columns)."""
    if column is not None and template is not None:
        raise UsageError("give a column or a template, not both")


def check_part(part: Any, spec: BuildSpec) -> Part:
    """What an engine handed back is a part of this filter: one array of the right size per
    member (a part of another build, or a lost chunk, is refused before any bit is uploaded)."""
    if not isinstance(part, Part):
        raise TypeError(f"the engine returned {type(part).__name__}, not a Part")
    sizes = [int(layout.nbytes) for layout in spec.layouts]
    if [int(data.nbytes) for data in part.datas] != sizes or len(part.counts) != len(sizes):
        raise ValueError(f"the engine's part does not fit this filter: {part.nbytes:,} bytes for {sum(sizes):,}")
    return part


class Engine(Protocol):
    """What runs a distributed build: ``build`` reads ``source`` on the engine's workers, builds
    one part per task with ``spec.partial`` and returns them merged."""

    name: str  # dask, spark

    @property
    def description(self) -> str:
        """Where it runs, for the log (no secrets)."""
        ...

    def build(self, spec: BuildSpec, source: Any) -> Part: ...
