"""A client build of one filter, or of every member of a sharded one, fed batch by batch.

Items are routed to their member (``crc32 mod N``), hashed, and set in the member's bit array,
which counts them as the server would: by the native kernel where pip built it (one pass per
item, without the GIL), else by numpy (``kernel``). A RedisBloom link that would overflow its capacity ends
the build: a NONSCALING filter is full (the server would refuse the item too), a scaling one
would grow on the server, which this build does not do (``Overflow``: the caller takes the
server path). ``finish`` puts every member's bits into its standby.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from bloomctl import native as kernel
from bloomctl.errors import StateConflict
from bloomctl.keys import KeyFamily, to_display
from bloomctl.lifecycle.routing import route
from bloomctl.rebuild.build import bitmap, redisbloom
from bloomctl.rebuild.build.bits import BitArray
from bloomctl.rebuild.build.items import buffers
from bloomctl.rebuild.loader import over_capacity
from bloomctl.server.client import RedisClient
from bloomctl.sources.base import item_list

BATCH_OVERHEAD = 128 << 20  # working memory of one batch (positions, sort keys), on top of the bits
SCHEMES: dict[str, ModuleType] = {"redisbloom": redisbloom, "bitmap": bitmap}


class Overflow(Exception):
    """A scaling filter would have grown a second link on the server: build it there instead."""


def scheme_for(backend: str) -> ModuleType:
    return SCHEMES[backend]


def memory_needed(nbytes: Sequence[int], jobs: int = 1) -> int:
    """Peak client memory of a build: every member's bits (in every job too), one read-back copy
    while merging, and the working memory of a batch (per job)."""
    jobs_extra = (sum(nbytes) + BATCH_OVERHEAD) * (jobs if jobs > 1 else 0)
    return sum(nbytes) + max(nbytes, default=0) + BATCH_OVERHEAD + jobs_extra


class Build:
    """The bits of one filter, or of every member of a sharded one, from ``layouts`` (the
    standbys' own, read from the server). No server is needed to add items: parts of a source
    can be built in other processes and merged (``merge``)."""

    def __init__(self, backend: str, layouts: Sequence[Any], names: Sequence[str] = ()) -> None:
        self.backend = backend
        self.scheme = scheme_for(backend)
        self.layouts = list(layouts)
        self.arrays: list[BitArray] = [self.scheme.new_array(layout) for layout in self.layouts]
        self.names = list(names) or [f"shard {i}" for i in range(len(self.layouts))]
        self.native = kernel.native()

    @property
    def count(self) -> int:
        return sum(array.count for array in self.arrays)

    def add(self, batch: Any) -> None:
        self.apply(self.prepare(batch))

    def prepare(self, batch: Any) -> list[tuple[int, Any]]:
        """A batch's items, member by member, made ready in the reading thread while ``apply``
        sets the previous batch's bits: their buffers for the kernel, their positions for numpy
        (which leaves the GIL while it hashes)."""
        if len(self.arrays) == 1:
            groups = [(0, batch)]
        else:
            groups = [(i, group) for i, group in enumerate(route(item_list(batch), len(self.arrays))) if group]
        if self.native is not None:
            return [(i, buffers(group)) for i, group in groups]
        return [(i, self.scheme.positions(self.layouts[i], group)) for i, group in groups]

    def apply(self, prepared: list[tuple[int, Any]]) -> None:
        """Set the bits of a prepared batch, in order, counting as the server would."""
        for index, work in prepared:
            array = self.arrays[index]
            if self.native is not None:
                data, offsets = work
                array.count += self.scheme.native_add(self.native, self.layouts[index], array.data, data, offsets)
            else:
                array.add(work)
            self.check(index)

    def check(self, index: int) -> None:
        """A RedisBloom link holds ``capacity`` items: past that, as the server would, refuse
        (NONSCALING) or hand over to the server path (the server would grow a sub-filter)."""
        layout, array = self.layouts[index], self.arrays[index]
        if array.count <= layout.capacity:
            return
        if self.scheme is not redisbloom:  # a bitmap filter never grows
            raise over_capacity(self.names[index], array.count, layout.capacity)
        if layout.nonscaling:
            raise StateConflict(
                "writing to %r failed: non scaling filter is full: the filter reached its capacity "
                "(raise `capacity` or `headroom`)",
                self.names[index],
            )
        raise Overflow(
            f"{self.names[index]!r}: more than {layout.capacity:,} distinct items, so the filter grows a sub-filter"
        )

    def merge(self, datas: Sequence[Any], counts: Sequence[int]) -> list[str]:
        """OR in another build's bits (a part of the source built elsewhere). Counts add up, but
        an item in two parts is counted by both: where the sum passes what the bits hold by more
        than ``COUNT_TOLERANCE``, the count is the bits' estimate instead (an inflated count would
        make the server take the filter for full). Returns a warning per count replaced."""
        warnings = []
        for index, (data, count) in enumerate(zip(datas, counts, strict=True)):
            array = self.arrays[index]
            array.merge(data)
            array.count += count
            estimate = estimated_items(array.data, self.layouts[index].bits, self.layouts[index].hashes)
            if array.count > estimate * (1 + COUNT_TOLERANCE):
                warnings.append(
                    f"{self.names[index]}: the parts counted {array.count:,} items, the bits hold about "
                    f"{estimate:,.0f} (items repeated across parts): the filter records {round(estimate):,}"
                )
                array.count = round(estimate)
            self.check(index)
        return warnings


COUNT_TOLERANCE = 0.01  # the estimate is within 0.003% of the true count at 10M distinct items


@functools.cache
def _popcounts() -> Any:
    """The set bits of every byte value."""
    import numpy as np

    return np.array([bin(value).count("1") for value in range(256)], dtype=np.uint8)


def estimated_items(data: Any, bits: int, hashes: int) -> float:
    """Distinct items a Bloom filter of ``bits`` and ``hashes`` holds, from its set bits X:
    n = -(m/k) ln(1 - X/m) (Swamidass and Baldi); infinite when every bit is set."""
    import numpy as np

    set_bits = int(_popcounts()[data].sum(dtype=np.int64))
    if set_bits >= bits:
        return math.inf
    return -(bits / hashes) * math.log1p(-set_bits / bits)


class ClientBuild(Build):
    """A ``Build`` for the standbys of ``families`` on a server, which ``finish`` fills."""

    def __init__(self, client: RedisClient, backend: str, families: Sequence[KeyFamily]) -> None:
        self.client = client
        self.families = list(families)
        scheme = scheme_for(backend)
        layouts = [scheme.read_layout(client, family.standby) for family in self.families]
        super().__init__(backend, layouts, [to_display(family.standby) for family in self.families])

    def finish(self, generation: str, check: Callable[[], None]) -> int:
        """Put every member's bits into its standby; returns the bytes uploaded."""
        sent = 0
        for family, layout, array in zip(self.families, self.layouts, self.arrays, strict=True):
            sent += self.scheme.finish(self.client, family, layout, array, generation, check)
        return sent
