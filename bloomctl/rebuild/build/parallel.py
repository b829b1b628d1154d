"""A client build in several processes: each builds the bits of its part of the source, and the
parts are ORed (filters with the same layout merge by OR: a bit is set when any part set it).

Parts: for CSV every process reads the whole file and takes the items whose hash falls to it
(``take_share``): an item and all its repeats go to the same process, whatever the batch
boundaries, and every item to exactly one. For Parquet, process i reads row groups i, i+N, ...
For SQL, the rows whose ``split_column`` (cast to an integer) is i modulo N. The bits are exactly
those of a build in one process. The item count is the sum of the parts' counts: each part
counts as the server would within its part, so a false positive across parts (and, for SQL and
Parquet, an item repeated in rows of two parts) counts once per part; ``Build.settle`` checks
the sum against the bits. Each part also draws its share of the
verification sample (random keys: the merged sample is uniform over the whole source).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bloomctl.errors import SourceError
from bloomctl.sources.base import Batch, Source, SourceStats, is_arrow, merge_stats, prefetched

SHARE_SEED = 0x9E3779B97F4A7C15  # not RedisBloom's seed: which process takes an item


def take_share(items: Batch, index: int, parts: int) -> Batch:
    """The items of a batch that fall to process ``index`` of ``parts``, by a hash of the item."""
    import numpy as np

    from bloomctl.rebuild.build.items import buffers
    from bloomctl.rebuild.build.murmur import Blocks

    if len(items) == 0:
        return items
    data, offsets = buffers(items)
    mine = Blocks(data, offsets).hash(SHARE_SEED) % np.uint64(parts) == np.uint64(index)
    if is_arrow(items):
        import pyarrow as pa

        return items.filter(pa.array(mine))
    return [item for item, keep in zip(items, mine.tolist(), strict=True) if keep]


@dataclass
class Part:
    datas: list[Any]  # each member's bit array (numpy), as this part built it
    counts: list[int]
    stats: SourceStats
    sample_keys: Any
    sample: list[bytes]


def build_part(
    source: Source,
    share: tuple[int, int] | None,
    backend: str,
    layouts: Sequence[Any],
    names: Sequence[str],
    batch: int,
    sample_size: int,
    seed: int | None,
) -> Part:
    """One process's work: its part of the source (with ``share``, the items of the whole source
    that ``take_share`` gives it) into fresh bit arrays."""
    from bloomctl.rebuild.build import tune_allocator
    from bloomctl.rebuild.build.client import Build
    from bloomctl.rebuild.sampling import KeyedReservoir

    tune_allocator()
    build = Build(backend, layouts, names)
    sample = KeyedReservoir(sample_size, seed)
    batches = source.fast_batches(batch)
    if share is not None:
        batches = (take_share(items, *share) for items in batches)
    kept = 0
    for items, prepared in prefetched((items, build.prepare(items)) for items in batches):
        sample.feed(items)
        build.apply(prepared)
        kept += len(items)
    stats = source.stats
    stats.items = kept
    chosen = sample.items  # cuts the pool to the sample: the keys read next are the chosen items'
    return Part(
        [array.data for array in build.arrays], [array.count for array in build.arrays], stats, sample.keys, chosen
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
                (
                    part,
                    (index, jobs) if source.shared_parse else None,
                    backend,
                    layouts,
                    names,
                    batch,
                    sample_size,
                    None if seed is None else seed + index,
                ),
            )
            for index, part in enumerate(parts)
        ]
        try:
            results = [job.get() for job in pending]
        except BaseException:
            pool.terminate()  # one part failed (or Ctrl-C): the others stop at once
            raise
    if source.shared_parse:
        seen = {(r.stats.rows, r.stats.blank, r.stats.bad_rows) for r in results}
        if len(seen) > 1:  # every process read the whole source: it changed while they read it
            raise SourceError("the %s jobs read different rows of the source (did it change during the build?)", jobs)
    return results, merge_stats([result.stats for result in results], source.shared_parse)
