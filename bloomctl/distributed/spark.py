"""Spark: the bits built by Spark's executors, from a Spark DataFrame, with ``mapInArrow``.

The DataFrame's recipe columns are coalesced to ``slots`` partitions (no shuffle: each task reads
its input splits one after the other), so there are as many parts as slots, not as input splits:
every part is the size of the whole filter. Each task builds its part from the Arrow batches
Spark hands it and returns it as Arrow rows (``arrow_batches``: chunks of bits far below Arrow's
and Spark's limits); the driver collects them (``toArrow``) and merges. The executors need
bloomctl with its ``fast`` extra installed; they never connect to Redis.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from bloomctl import extras
from bloomctl.distributed.frame import FrameSource, first_line, shown
from bloomctl.errors import ConnectionFailed, MissingExtra, SourceError, UsageError
from bloomctl.rebuild.build.spec import BuildSpec, Part, arrow_batches, merge_all, parts_of
from bloomctl.rebuild.options import Events, RebuildReport

if TYPE_CHECKING:  # pragma: no cover - annotations only
    import pyarrow as pa
    from pyspark.sql import SparkSession

PART_SCHEMA = "kind string, member int, offset bigint, data binary, key double"  # ``spec.arrow_schema``'s
READ_ROWS = 65536  # rows per record batch where the driver reads the DataFrame itself


def _session_builder() -> SparkSession.Builder:
    extras.require(extras.SPARK)
    from pyspark.sql import SparkSession

    return SparkSession.builder


def frame_source(frame: Any, *, description: str | None = None, **recipe: str | None) -> FrameSource:
    """A Spark DataFrame as a rebuild's source, its schema as the executors' Arrow batches have it."""

    schema = frame.limit(0).toArrow().schema

    def rows() -> int:
        return int(frame.count())

    def read(columns: list[str]) -> Iterator[Any]:
        chosen = schema_of(schema, columns)
        rows: list[Any] = []
        for row in frame.select(*columns).toLocalIterator():
            rows.append(row)
            if len(rows) == READ_ROWS:
                yield _record_batch(rows, chosen)
                rows = []
        if rows:
            yield _record_batch(rows, chosen)

    return FrameSource(description or "Spark DataFrame", schema, rows, read, frame=frame, **recipe)


def schema_of(schema: pa.Schema, columns: list[str]) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([schema.field(name) for name in columns])


def _record_batch(rows: list[Any], schema: pa.Schema) -> pa.RecordBatch:
    import pyarrow as pa

    return pa.record_batch(
        [pa.array([row[i] for row in rows], field.type) for i, field in enumerate(schema)], schema=schema
    )


def _task(spec: BuildSpec) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """What each task runs: its batches into a part, the part out as Arrow rows."""

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        context = TaskContext.get()
        part = spec.partial(batches, context.partitionId() if context is not None else 0)
        yield from arrow_batches(part)

    return task


class SparkEngine:
    """Builds with the SparkSession ``spark``, or one made for ``master`` (``local[2]``,
    ``spark://host:7077``, ``yarn``) or for the Spark Connect server ``remote`` (``sc://host``)."""

    name = "spark"

    def __init__(
        self, spark: Any = None, *, master: str | None = None, remote: str | None = None, slots: int | None = None
    ) -> None:
        if master and remote:
            raise UsageError("give `spark_master` or `spark_remote`, not both")
        if slots is not None and slots < 1:
            raise UsageError("`slots` must be at least 1, got %s", slots)
        self.spark, self.master, self.remote, self.slots = spark, master, remote, slots

    @property
    def description(self) -> str:
        where = self.remote or self.master
        return f"Spark ({shown(where)})" if where else "Spark"

    def session(self) -> SparkSession:
        if self.spark is None:
            builder = _session_builder().appName("bloomctl")
            if self.remote:
                builder = builder.remote(self.remote)
            else:
                master = self.master or "local[*]"
                builder = builder.master(master)
                if master.startswith("local"):  # the workers run this interpreter, which has bloomctl
                    import os
                    import sys

                    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # what pyspark's context reads
            try:
                self.spark = builder.getOrCreate()
            except ImportError as exc:  # Spark Connect's grpcio: pyspark's own extra, not one of ours
                raise MissingExtra("%s (for Spark Connect: pip install 'pyspark[connect]')", first_line(exc)) from None
            except Exception as exc:  # a master or remote that is wrong or does not answer
                where = shown(self.remote or self.master or "local[*]")
                raise ConnectionFailed("cannot start Spark on %s: %s", where, shown(first_line(exc))) from None
        return self.spark

    def read_parquet(self, path: str, **recipe: Any) -> FrameSource:
        session = self.session()
        try:
            frame = session.read.parquet(path)
        except Exception as exc:  # AnalysisException: no such path, not Parquet
            raise SourceError("cannot read %s: %s", shown(path), shown(first_line(exc))) from None
        return frame_source(frame, description=f"Parquet {shown(path)} (read by Spark)", **recipe)

    def _slots(self, frame: Any) -> int:
        if self.slots is not None:
            return self.slots
        try:
            return max(1, int(frame.sparkSession.sparkContext.defaultParallelism))
        except Exception:  # Spark Connect has no SparkContext: the session's setting, else 2 per task slot unknown
            return max(1, int(frame.sparkSession.conf.get("spark.default.parallelism", "2")))

    def build(self, spec: BuildSpec, source: Any) -> Part:
        if not isinstance(source, FrameSource) or not hasattr(source.frame, "mapInArrow"):
            raise UsageError("the Spark engine reads a Spark DataFrame")
        frame = source.frame.select(*source.columns).coalesce(self._slots(source.frame))
        rows = frame.mapInArrow(_task(spec), PART_SCHEMA).toLocalIterator()  # a partition, a part, at a time
        parts = parts_of((row.kind, row.member, row.offset, row.data, row.key) for row in rows)
        first = next(parts, None)
        if first is None:  # no partition: an empty DataFrame
            return spec.partial([])
        return merge_all(itertools.chain([first], parts))


def build(
    frame: Any,
    column: str | None = None,
    *,
    key: str,
    url: str | None = None,
    template: str | None = None,
    prefix: str | None = None,
    slots: int | None = None,
    redis: Any = None,
    events: Events | None = None,
    **options: Any,
) -> RebuildReport:
    """Rebuild the filter ``key`` from ``column`` (or ``template``, with ``prefix``) of the Spark
    DataFrame ``frame``, its bits built by the executors, then uploaded, verified and, with
    ``swap=True``, swapped in. ``redis`` is an open redis-py client (else ``url``); ``options`` are
    ``RebuildOptions``'. Returns the rebuild's report."""
    from bloomctl.distributed.job import run

    source = frame_source(frame, column=column, template=template, prefix=prefix)
    engine = SparkEngine(frame.sparkSession, slots=slots)
    return run(source, engine, key=key, url=url, client=redis, events=events, **options)
