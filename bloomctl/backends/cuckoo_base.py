"""What both cuckoo filter backends share: inserts that never create the filter, deletes, the
full check, and a dumped filter's parameters.

A cuckoo filter stores a fingerprint of each item in one of two buckets, so an item can be
deleted again. Adds are inserts of one copy per call (CF.INSERT, never CF.INSERTNX): an item added
twice is there twice, and deleting it once leaves one. A rebuild inserts each distinct source item
once. The backends are RedisBloom's CF.* commands (``cuckoo_redisbloom``) and the function
library's module-free filter (``cuckoo_lua``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bloomctl.backends.base import AnyPlan, Backend, in_range
from bloomctl.errors import StateConflict, UsageError
from bloomctl.keys import to_display
from bloomctl.server.client import RedisClient
from bloomctl.sizing.cuckoo import REDISBLOOM, CuckooPlan, cuckoo_plan


def info_fields(raw: Any) -> dict[str, Any]:
    """CF.INFO, or the module-free filter's answer of the same form (a flat list, or a dict with
    RESP3), as text keys."""
    if isinstance(raw, dict):
        return {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in raw.items()}
    return {(raw[i].decode() if isinstance(raw[i], bytes) else str(raw[i])): raw[i + 1] for i in range(0, len(raw), 2)}


def engine_plan(plan: Any, engine: str) -> CuckooPlan:
    """``plan`` when it is a cuckoo plan for ``engine``, else a UsageError."""
    if not isinstance(plan, CuckooPlan):
        raise UsageError("a cuckoo filter needs a cuckoo plan (`bucket_size`, `max_iterations`), not a Bloom filter's")
    if plan.engine != engine:
        raise UsageError("the plan is for the %s engine, this backend is %s", plan.engine, engine)
    return plan


def count_inserted(reply: Sequence[Any], expected: int) -> int | str:
    """CF.INSERT answers 1 (True with RESP3) per item inserted, -1 (False) where no slot was found."""
    added = reply.count(1)
    if len(reply) == expected and added == expected:
        return added
    errors = [flag for flag in reply if isinstance(flag, Exception)]
    if errors:
        return str(errors[0])
    if len(reply) != expected:
        return f"{len(reply)} results for a batch of {expected}"
    return f"the filter is full: no room for {expected - added:,} of {expected:,} items"


def _member_ok(member: dict[str, Any]) -> bool:
    return (
        in_range(member.get("buckets"), 1)
        and in_range(member.get("bucket_size"), 1, 255)
        and in_range(member.get("max_iterations"), 1, 65535)
        and member.get("fingerprint_bits") in (8, 16, 32)
        and in_range(member.get("deletes", 0), 0)
    )


class CuckooBackend(Backend):
    """What both cuckoo backends share: adds that never create the filter, deletes, and the full check."""

    kind = "cuckoo"
    engine = REDISBLOOM
    shardable = False
    removes_items = True
    counts_copies = True
    logs_dual_writes = True  # the application's writes during a rebuild go through the library's cf_dual
    client_buildable = False
    # A batch's worst case is every insert relocating MAXITERATIONS times (a filter at its full load):
    # measured per item and per iteration (RedisBloom 2.8: 7.2 us an item at 500 iterations; the
    # module-free filter: 0.2 ms), so that even then one command stays near 20 ms.
    BUDGET_US = 20_000
    ITEM_US, ITERATION_US = 0.4, 0.015

    def batch_for(self, plan: AnyPlan) -> int:
        if not isinstance(plan, CuckooPlan):
            return self.batch_size
        worst = self.ITEM_US + plan.max_iterations * self.ITERATION_US
        return max(50, min(self.batch_size, int(self.BUDGET_US / worst)))

    def count_added(self, reply: Sequence[Any], expected: int) -> int | str:
        return count_inserted(reply, expected)

    def madd(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        """Insert one copy of each item; a filter that has no room for one of them is an error
        (the others were inserted)."""
        if not items:
            return []
        reply = self.call_add(client, key, items)
        added = count_inserted(list(reply), len(items))
        if isinstance(added, str):
            raise StateConflict(
                "the cuckoo filter %r has no room (%s): rebuild it with a larger `capacity`", to_display(key), added
            )
        return [True] * len(items)

    def call_add(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[int | Exception]:
        return client.execute_command(*self.madd_command(client, key, items))

    def expansion_for(self, expansion: int | None, nonscaling: bool, recorded: str | None = None) -> int | None:
        from bloomctl.sizing.cuckoo import DEFAULT_CUCKOO_EXPANSION, MAX_CUCKOO_EXPANSION

        if nonscaling and expansion is not None:
            raise UsageError("`expansion` and `nonscaling` exclude each other")
        if not self.grows:
            if expansion is not None:
                raise UsageError("%s filters do not grow: leave out `expansion`", self.name)
            return None
        if nonscaling:
            return None
        if expansion is not None:
            if not 1 <= expansion <= MAX_CUCKOO_EXPANSION:
                raise UsageError("`expansion` must be from 1 to %s, got %r", f"{MAX_CUCKOO_EXPANSION:,}", expansion)
            return expansion
        if recorded == "nonscaling":
            return None
        return int(recorded) if recorded else DEFAULT_CUCKOO_EXPANSION

    def mdelete(self, client: RedisClient, key: bytes, items: Sequence[bytes | str]) -> list[bool]:
        """Remove one copy of each item; False where its fingerprint was not there. Deleting an item
        that was never added can remove another item's fingerprint (a false negative)."""
        raise NotImplementedError

    def count(self, client: RedisClient, key: bytes, item: bytes | str) -> int:
        raise NotImplementedError

    # --- dump and restore --------------------------------------------------------------------

    def dump_changed(self, key: bytes) -> StateConflict:
        return StateConflict(
            "the cuckoo filter %r was written to while it was dumped (an insert moves other fingerprints, so the "
            "dump might miss some): dump it again when its writers pause",
            to_display(key),
        )

    def dump_member_ok(self, member: dict[str, Any]) -> bool:
        return _member_ok(member)

    def dumped_fingerprint_bits(self, member: dict[str, Any]) -> int | None:
        """The fingerprint size a dumped member's plan is given; None: the engine's only one."""
        return None

    def dumped_plan(self, member: dict[str, Any]) -> CuckooPlan:
        """The plan a dumped member was built with (for its metadata, and an empty one's reserve)."""
        return cuckoo_plan(
            int(member["buckets"]) * int(member["bucket_size"]),
            bucket_size=int(member["bucket_size"]),
            max_iterations=int(member["max_iterations"]),
            expansion=member["expansion"],
            engine=self.engine,
            fingerprint_bits=self.dumped_fingerprint_bits(member),
            error_rate=None,
        )

    def reserved_error_rate(self, member: dict[str, Any]) -> float:
        """The error rate at the load the filter fills to, as the planner reckons it."""
        return self.dumped_plan(member).error_rate

    def restore_plan(self, member: dict[str, Any], error_rate: float, expansion: int | None) -> AnyPlan:
        """A cuckoo member carries every parameter of its own: the dump's are not needed."""
        return self.dumped_plan(member)
