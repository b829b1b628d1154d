"""A client build in several processes: each builds the bits of its part of the source, and the
parts are ORed (filters with the same layout merge by OR: a bit is set when any part set it).

Parts: a CSV file is cut into byte ranges at record starts (``CsvSource.part``), process i reads
range i. Where it cannot be cut (gzip, a pipe, a small file) every process reads the whole file
and takes the items whose hash falls to it (``take_share``): an item and all its repeats go to
the same process, whatever the batch boundaries, and every item to exactly one. For Parquet,
process i reads row groups i, i+N, ... For SQL, the rows whose ``split_column`` (cast to an
integer) is i modulo N. The bits are exactly those of a build in one process. The item count is
the sum of the parts' counts: each part counts as the server would within its part, so a false
positive across parts (and, but for the hash share, an item repeated in rows of two parts)
counts once per part; ``Build.settle`` checks the sum against the bits. Each part also draws its
share of the verification sample (random keys: the merged sample is uniform over the whole
source). This process builds part 0 itself while the others start.

A source's bad rows are judged over the whole source, as one process reading it would: the
first row past ``skip_bad_rows`` in source order stops the build, with its own line.
"""

from __future__ import annotations

import copy
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
        from bloomctl.sources.arrow_values import bool_array

        return items.filter(bool_array(mine))
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
    """Build the ``jobs`` parts: part 0 in this process, the others in as many processes (started
    fresh: no lock thread or open connection is copied into them). Returns every part and the
    source's merged statistics. An error is the one a read of the whole source meets first."""
    parts = [source.part(index, jobs, split_column) for index in range(jobs)]
    shared = source.shared_parse
    calls = [
        (
            part,
            (index, jobs) if shared else None,
            backend,
            layouts,
            names,
            batch,
            sample_size,
            None if seed is None else seed + index,
        )
        for index, part in enumerate(parts)
    ]
    context = multiprocessing.get_context("spawn")
    failure: SourceError | None = None
    with context.Pool(jobs - 1) as pool:  # leaving the block stops whatever still runs (an error, Ctrl-C)
        pending = [pool.apply_async(build_part, call) for call in calls[1:]]
        results = [build_part(*calls[0])]
        for job in pending:
            try:
                results.append(job.get())
            except SourceError as exc:
                failure = exc
                break
    if shared:
        if failure is not None:
            raise failure
        seen = {(r.stats.rows, r.stats.blank, r.stats.bad_rows) for r in results}
        if len(seen) > 1:  # every process read the whole source: it changed while they read it
            raise SourceError("the %s jobs read different rows of the source (did it change during the build?)", jobs)
    else:
        _first_error(source, parts, results, failure, batch)
    return results, merge_stats([result.stats for result in results], shared)


def _first_error(
    source: Source, parts: list[Source], results: list[Part], failure: SourceError | None, batch: int
) -> None:
    """Raise what one process reading the parts in order would have raised first, if anything:
    each part tolerated ``skip_bad_rows`` bad rows of its own, the source tolerates that many in
    all. The part where the bad rows of the parts before it leave less is read again here, their
    count first, to stop at the right row (or at its own error, if that comes first)."""
    tolerance = getattr(source, "skip_bad_rows", None)  # sources without bad rows have no such setting
    before = 0  # bad rows in the parts before this one
    for index, part in enumerate(parts):
        if index == len(results):  # the part that raised ``failure``
            assert failure is not None
            if tolerance is None or before == 0:
                raise failure  # nothing before this part counts against it: its error is the first
        else:
            bad = results[index].stats.bad_rows
            if tolerance is None or before + bad <= tolerance:
                before += bad
                continue
        again = copy.copy(part)
        again.bad_rows_before = before  # type: ignore[attr-defined]  # a source with `skip_bad_rows` counts from here
        for _items in again.fast_batches(batch):
            pass
        if failure is not None:  # read again, it stopped nowhere: it changed since
            raise failure
        raise SourceError("the jobs found more than %s bad rows in all (`skip_bad_rows`)", tolerance)
