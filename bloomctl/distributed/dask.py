"""Dask: the bits built by a ``dask.distributed`` cluster's workers, from a Dask DataFrame.

Each of ``slots`` chains of tasks (by default one per worker thread) builds one part: its first
task from its first partition, each next task from the part before and the next partition (a
copy: a task Dask runs again gets the same input). So there are as many parts as slots, not as
partitions (every part is the size of the whole filter), and the driver merges those few.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from bloomctl import extras
from bloomctl.distributed.frame import FrameSource, first_line, shown
from bloomctl.errors import ConnectionFailed, SourceError, UsageError
from bloomctl.rebuild.build.spec import BuildSpec, Part, merge_all
from bloomctl.rebuild.options import Events, RebuildReport

if TYPE_CHECKING:  # pragma: no cover - annotations only
    import pyarrow as pa

CONNECT_TIMEOUT = "10s"  # a scheduler that does not answer: one line, not a 30 s wait and a traceback


def _modules() -> tuple[Any, Any]:
    extras.require(extras.DASK)
    import dask
    import dask.dataframe as dd

    return dask, dd


def frame_source(frame: Any, *, description: str | None = None, **recipe: str | None) -> FrameSource:
    """A Dask DataFrame as a rebuild's source; its columns keep their Arrow types where it has them
    (``dd.read_parquet(..., dtype_backend="pyarrow")``)."""
    _modules()
    import pyarrow as pa

    schema = pa.Schema.from_pandas(frame._meta, preserve_index=False)

    def rows() -> int:
        return len(frame)

    def read(columns: list[str]) -> Iterator[Any]:
        for piece in frame[columns].to_delayed():
            yield _table(piece.compute())

    return FrameSource(
        description or f"Dask DataFrame of {frame.npartitions} partitions", schema, rows, read, frame=frame, **recipe
    )


def read_parquet(path: str, **recipe: Any) -> FrameSource:
    """Parquet files read by the Dask workers (a local path, or any URL fsspec reads: s3://, gs://)."""
    _dask, dd = _modules()
    try:
        frame = dd.read_parquet(path, dtype_backend="pyarrow", split_row_groups=True)  # a partition a row group
    except Exception as exc:  # no such path, not Parquet, a filesystem fsspec lacks
        raise SourceError("cannot read %s: %s", shown(path), shown(first_line(exc))) from None
    return frame_source(frame, description=f"Parquet {shown(path)} (read by Dask)", **recipe)


def _table(frame: Any) -> pa.Table:
    import pyarrow as pa

    return pa.Table.from_pandas(frame, preserve_index=False)


def _first(spec: BuildSpec, index: int, frame: Any) -> Part:
    return spec.partial([_table(frame)], index)


def _next(spec: BuildSpec, index: int, part: Part, frame: Any) -> Part:
    return spec.partial([_table(frame)], index, onto=part)  # index: the partition's, so each draws its own keys


class DaskEngine:
    """Builds on the cluster of ``client`` (a ``dask.distributed.Client``), or of the scheduler
    at ``scheduler`` (``tcp://host:8786``), or on Dask's default scheduler when neither is given."""

    name = "dask"

    def __init__(self, client: Any = None, *, scheduler: str | None = None, slots: int | None = None) -> None:
        self.client, self.scheduler, self.slots = client, scheduler, slots
        if slots is not None and slots < 1:
            raise UsageError("`slots` must be at least 1, got %s", slots)

    @property
    def description(self) -> str:
        return f"Dask ({shown(self.scheduler)})" if self.scheduler else "Dask"

    def _connect(self) -> None:
        """A client for ``scheduler``, made once (Dask's default from then on)."""
        if self.client is None and self.scheduler is not None:
            extras.require(extras.DASK_CLUSTER)
            from distributed import Client

            try:
                self.client = Client(self.scheduler, timeout=CONNECT_TIMEOUT)
            except (OSError, TimeoutError, ValueError) as exc:
                raise ConnectionFailed(
                    "cannot reach the Dask scheduler %s: %s", shown(self.scheduler), shown(first_line(exc))
                ) from None

    def _slots(self, client: Any, partitions: int) -> int:
        if self.slots is not None:
            wanted = self.slots
        elif client is not None:
            wanted = sum(client.nthreads().values()) or 1
        else:
            import os

            wanted = os.cpu_count() or 1
        return max(1, min(wanted, partitions))

    def read_parquet(self, path: str, **recipe: Any) -> FrameSource:
        self._connect()  # a client made here becomes Dask's default: the read runs on its cluster
        return read_parquet(path, **recipe)

    def build(self, spec: BuildSpec, source: Any) -> Part:
        dask, _dd = _modules()
        if not isinstance(source, FrameSource) or not hasattr(source.frame, "to_delayed"):
            raise UsageError("the Dask engine reads a Dask DataFrame")
        pieces = list(source.frame[source.columns].to_delayed())
        if not pieces:
            return spec.partial([])
        self._connect()
        client = self.client
        slots = self._slots(client, len(pieces))
        chains = []
        for slot in range(slots):
            part = dask.delayed(_first)(spec, slot, pieces[slot])
            for index in range(slot + slots, len(pieces), slots):
                part = dask.delayed(_next)(spec, index, part, pieces[index])
            chains.append(part)
        if client is None:
            return merge_all(dask.compute(*chains))
        from distributed import as_completed

        def arriving() -> Iterator[Part]:  # merged as they come: one part at a time here
            for future in as_completed(client.compute(chains)):
                part = future.result()
                future.release()
                yield part

        return merge_all(arriving())


def build(
    frame: Any,
    column: str | None = None,
    *,
    key: str,
    url: str | None = None,
    template: str | None = None,
    prefix: str | None = None,
    client: Any = None,
    scheduler: str | None = None,
    slots: int | None = None,
    redis: Any = None,
    events: Events | None = None,
    **options: Any,
) -> RebuildReport:
    """Rebuild the filter ``key`` from ``column`` (or ``template``, with ``prefix``) of the Dask
    DataFrame ``frame``, its bits built on the cluster of ``client`` (or ``scheduler``), then
    uploaded, verified and, with ``swap=True``, swapped in. ``redis`` is an open redis-py client
    (else ``url``); ``options`` are ``RebuildOptions``'. Returns the rebuild's report."""
    from bloomctl.distributed.job import run

    source = frame_source(frame, column=column, template=template, prefix=prefix)
    engine = DaskEngine(client, scheduler=scheduler, slots=slots)
    return run(source, engine, key=key, url=url, client=redis, events=events, **options)
