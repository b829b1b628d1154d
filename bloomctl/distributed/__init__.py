"""Distributed builds: the bits computed by an engine the team already runs (Dask, Spark).

The seam is engine-neutral. The driver runs an ordinary rebuild (``rebuild``): preflight, the
lock, the standbys reserved as ``loading``, then, instead of reading the source itself, it hands
an ``Engine`` a picklable ``BuildSpec`` (the backend, the standbys' layouts, the item recipe).
The engine's tasks turn Arrow record batches into ``Part`` values with ``spec.partial`` (pure:
a task never connects to Redis), the parts ``merge`` by OR, and the driver takes the merged part
through the same steps as any client build: the count settled against the bits, the upload,
the verification, the marks and the guarded swap, and the same ``RebuildReport``.

``bloomctl.distributed.dask.build`` and ``bloomctl.distributed.spark.build`` take a DataFrame;
an engine of your own implements ``Engine.build(spec, source) -> Part`` and calls ``run``.
Engines are extras (``[dask]``, ``[spark]``), loaded only when used.
"""

from __future__ import annotations

from bloomctl.defaults import ENGINES
from bloomctl.distributed.frame import FrameSource
from bloomctl.distributed.job import run
from bloomctl.errors import UsageError
from bloomctl.rebuild.build.spec import BuildSpec, Engine, Part, from_arrow, merge, merge_all, to_arrow

__all__ = [
    "ENGINES",
    "BuildSpec",
    "Engine",
    "FrameSource",
    "Part",
    "from_arrow",
    "merge",
    "merge_all",
    "open_engine",
    "run",
    "to_arrow",
]


def open_engine(
    name: str,
    *,
    scheduler: str | None = None,
    spark_master: str | None = None,
    spark_remote: str | None = None,
    slots: int | None = None,
) -> Engine:
    """The engine the command line names, with where it runs."""
    if name == "dask":
        if spark_master or spark_remote:
            raise UsageError("`spark_master` and `spark_remote` go with `engine` spark")
        from bloomctl.distributed.dask import DaskEngine

        return DaskEngine(scheduler=scheduler, slots=slots)
    if name == "spark":
        if scheduler:
            raise UsageError("`scheduler` goes with `engine` dask")
        from bloomctl.distributed.spark import SparkEngine

        return SparkEngine(master=spark_master, remote=spark_remote, slots=slots)
    raise UsageError("unknown engine %r: use %s", name, " or ".join(ENGINES))
