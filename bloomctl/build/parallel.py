"""A client build in several processes: each builds the bits of its part of the source, and the
parts are ORed (filters with the same layout merge by OR: a bit is set when any part set it).

Parts: every N-th batch of a CSV file (each process parses the whole file, cheap next to
hashing), every N-th row group of Parquet files, or the rows of a SQL query whose integer
``split_column`` is i modulo N. The bits are exactly those of a build in one process. The item
count is the sum of the parts' counts: each part counts as the server would within its part, so
an item repeated in two parts, or a false positive across parts, is counted once per part.
Each part also draws its share of the verification sample (random keys: the merged sample is
uniform over the whole source).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bloomctl.sources.base import Source, SourceStats, merge_stats, prefetched


@dataclass
class Part:
    datas: list[Any]  # each member's bit array (numpy), as this part built it
    counts: list[int]
    stats: SourceStats
    sample_keys: Any
    sample: list[bytes]


def build_part(
    source: Source,
    backend: str,
    layouts: Sequence[Any],
    names: Sequence[str],
    batch: int,
    sample_size: int,
    seed: int | None,
) -> Part:
    """One process's work: its part of the source into fresh bit arrays."""
    from bloomctl.build import tune_allocator
    from bloomctl.build.client import Build
    from bloomctl.sampling import KeyedReservoir

    tune_allocator()
    build = Build(backend, layouts, names)
    sample = KeyedReservoir(sample_size, seed)
    for items, prepared in prefetched((items, build.prepare(items)) for items in source.fast_batches(batch)):
        sample.feed(items)
        build.apply(prepared)
    chosen = sample.items
    return Part(
        [array.data for array in build.arrays],
        [array.count for array in build.arrays],
        source.stats,
        sample.keys,
        chosen,
    )


def build_parts(
    source: Source,
    backend: str,
    layouts: Sequence[Any],
    names: Sequence[str],
    *,
    jobs: int,
    split_column: str | None,
    batch: int,
    sample_size: int,
    seed: int | None,
) -> tuple[list[Part], SourceStats]:
    """Build the ``jobs`` parts in as many processes (started fresh: no lock thread or open
    connection is copied into them). Returns every part and the source's merged statistics."""
    parts = [source.part(index, jobs, split_column) for index in range(jobs)]
    context = multiprocessing.get_context("spawn")
    with context.Pool(jobs) as pool:
        pending = [
            pool.apply_async(
                build_part,
                (part, backend, layouts, names, batch, sample_size, None if seed is None else seed + index),
            )
            for index, part in enumerate(parts)
        ]
        try:
            results = [job.get() for job in pending]
        except BaseException:
            pool.terminate()  # one part failed (or Ctrl-C): the others stop at once
            raise
    return results, merge_stats([result.stats for result in results], source.shared_parse)
