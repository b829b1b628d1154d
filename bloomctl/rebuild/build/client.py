"""A client build of one filter, or of every member of a sharded one, fed batch by batch.

Items are routed to their member (``crc32 mod N``), hashed, and set in the member's bit array,
which counts them as the server would: by the native kernel where pip built it (one pass per
item, without the GIL), else by numpy (``kernel``). A RedisBloom link that would overflow its capacity ends
the build: a NONSCALING filter is full (the server would refuse the item too), a scaling one
would grow on the server, which this build does not do (``Overflow``: the caller takes the
server path). ``finish`` puts every member's bits into its standby.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from bloomctl import native as kernel
from bloomctl.defaults import COUNT_TOLERANCE
from bloomctl.errors import StateConflict
from bloomctl.keys import KeyFamily, to_display
from bloomctl.lifecycle.routing import route
from bloomctl.rebuild.build import bitmap, redisbloom
from bloomctl.rebuild.build.bits import BitArray, counted_by_the_server, estimated_items
from bloomctl.rebuild.build.items import buffers
from bloomctl.rebuild.loader import over_capacity
from bloomctl.server.client import RedisClient
from bloomctl.sources.base import item_list

if TYPE_CHECKING:  # pragma: no cover - annotations only
    pass

BATCH_OVERHEAD = 128 << 20  # working memory of one batch (positions, sort keys), on top of the bits
SCHEMES: dict[str, ModuleType] = {"redisbloom": redisbloom, "bitmap": bitmap}


class Overflow(Exception):
    """A scaling filter would have grown a second link on the server: build it there instead."""


def scheme_for(backend: str) -> ModuleType:
    return SCHEMES[backend]


def memory_needed(nbytes: Sequence[int], jobs: int = 1, *, engine: bool = False) -> int:
    """Peak client memory of a build: every member's bits (in every job too), one read-back copy
    while merging, and the working memory of a batch (per job). An engine's build holds two more
    copies of the whole filter on the driver: the parts merged so far, and the one arriving."""
    jobs_extra = (sum(nbytes) + BATCH_OVERHEAD) * (jobs if jobs > 1 else 0)
    engine_extra = 2 * sum(nbytes) if engine else 0
    return sum(nbytes) + max(nbytes, default=0) + BATCH_OVERHEAD + jobs_extra + engine_extra


class Build:
    """The bits of one filter, or of every member of a sharded one, from ``layouts`` (the
    standbys' own, read from the server). No server is needed to add items: parts of a source
    can be built in other processes and merged (``merge``)."""

    def __init__(
        self, backend: str, layouts: Sequence[Any], names: Sequence[str] = (), *, checked: bool = True
    ) -> None:
        self.backend = backend
        self.checked = checked  # False: a part of a distributed build, checked once merged (``settle``)
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
            if self.checked:
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

    def merge(self, datas: Sequence[Any], counts: Sequence[int]) -> None:
        """OR in another build's bits (a part of the source built elsewhere); the counts add up
        (``settle`` checks the sum once every part is in)."""
        for index, (data, count) in enumerate(zip(datas, counts, strict=True)):
            self.arrays[index].merge(data)
            self.arrays[index].count += count

    def settle(
        self, part_counts: Sequence[Sequence[int]], *, disjoint_items: bool, warn: Callable[[str], None]
    ) -> None:
        """Once every part is merged: the count each member records, and its capacity check.

        With ``disjoint_items`` (each item went to one part: CSV's share by hash) the sum stands.
        Otherwise an item in two parts was counted by both, and an inflated count makes the server
        take a filter for full: where the sum passes the estimate from the bits by more than the
        estimate's own noise (4 standard errors, and at least ``COUNT_TOLERANCE``), or passes the
        capacity where the estimate does not, the member
        records what the server would have counted adding that many distinct items (the estimate
        less its false positives), never less than its largest part's count; ``warn`` is told of
        each count replaced, before any capacity check can stop the build."""
        for index, array in enumerate(self.arrays):
            if disjoint_items:
                break  # the sums stand: no need to count the bits
            layout = self.layouts[index]
            estimate, error = estimated_items(array.data, layout.bits, layout.hashes)
            over = array.count > estimate + max(COUNT_TOLERANCE * estimate, 4 * error)
            # A sum past the capacity that the bits put within it: repeats must not fill the filter.
            # (Distinct items just past the capacity may pass as the estimate's noise allows: about
            # 1% at a few thousand items, far less at millions; the error rate is then barely above plan.)
            full = array.count > layout.capacity >= estimate
            if over or full:
                counted = round(counted_by_the_server(estimate, layout.bits, layout.hashes))
                settled = max(counted, max(counts[index] for counts in part_counts))
                warn(
                    f"{self.names[index]}: the parts counted {array.count:,} items, the bits hold about "
                    f"{estimate:,.0f} (items repeated across parts): the filter records {settled:,}"
                )
                array.count = settled
        for index in range(len(self.arrays)):
            self.check(index)


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
