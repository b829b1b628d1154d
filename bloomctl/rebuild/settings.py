"""What each step of a rebuild takes of its options: resolved once, by the preflight, handed down.

``RebuildOptions`` is the one public input. The plan step takes a ``PlanRequest``, the load and
the catch-up a ``LoadSettings``, the verification a ``VerifySettings``, the cut-over its
``SwapGuards``, and the run itself (the lock, a dry run) its ``RunControls``: each step gets
only its own value, and none reads the whole bag.
"""

from __future__ import annotations

from dataclasses import dataclass

from bloomctl.lifecycle.guards import SwapGuards
from bloomctl.rebuild.options import RebuildOptions


@dataclass(frozen=True)
class PlanRequest:
    """The new filter's parameters as asked; None takes the active filter's, else the default."""

    capacity: int | str | None  # a number, "auto", or None
    headroom: float
    error_rate: float | None
    expansion: int | None
    nonscaling: bool
    filter_type: str | None  # bloom or cuckoo
    bucket_size: int | None
    max_iterations: int | None
    fingerprint_bits: int | None
    backend: str
    shards: int | None
    client_build: bool  # the options ask for a client build, which a cuckoo filter refuses

    @classmethod
    def of(cls, options: RebuildOptions) -> PlanRequest:
        return cls(
            capacity=options.capacity,
            headroom=options.headroom,
            error_rate=options.error_rate,
            expansion=options.expansion,
            nonscaling=options.nonscaling,
            filter_type=options.filter_type,
            bucket_size=options.bucket_size,
            max_iterations=options.max_iterations,
            fingerprint_bits=options.fingerprint_bits,
            backend=options.backend,
            shards=options.shards,
            client_build=options.build == "client" or options.jobs > 1,
        )


@dataclass(frozen=True)
class LoadSettings:
    """How the items go into the standbys: the load, in the client or on the server, and the catch-up."""

    batch: int  # items per add command: the options', else the backend's
    max_rate: float | None  # items per second, at most, on the server path
    window: int  # batches in flight
    build: str  # where the bits are computed: auto, client or server
    client_memory: int
    jobs: int
    split_column: str | None
    since_column: str | None
    catchup_skew: float
    sample: int  # items kept for the verification; 0 when every item is verified, or none
    seed: int | None

    @classmethod
    def of(cls, options: RebuildOptions, batch: int) -> LoadSettings:
        return cls(
            batch=batch,
            max_rate=options.max_rate,
            window=options.window,
            build=options.build,
            client_memory=options.client_memory,
            jobs=options.jobs,
            split_column=options.split_column,
            since_column=options.since_column,
            catchup_skew=options.catchup_skew,
            sample=0 if options.verify_all else options.verify_sample,
            seed=options.seed,
        )


@dataclass(frozen=True)
class VerifySettings:
    """What the verification checks: every item, in a second pass over the source, else the load's sample."""

    every: bool
    window: int  # batches of lookups in flight

    @classmethod
    def of(cls, options: RebuildOptions) -> VerifySettings:
        return cls(every=options.verify_all, window=options.window)


@dataclass(frozen=True)
class RunControls:
    """How the run itself goes: under the filter's lock, or as a dry run that writes nothing."""

    dry_run: bool
    swap: bool  # cut over once verified
    force: bool  # skip the free-memory checks
    lock_wait: float
    lock_ttl_ms: int

    @classmethod
    def of(cls, options: RebuildOptions) -> RunControls:
        return cls(
            dry_run=options.dry_run,
            swap=options.swap,
            force=options.force,
            lock_wait=options.lock_wait,
            lock_ttl_ms=options.lock_ttl_ms,
        )


def swap_guards(options: RebuildOptions) -> SwapGuards:
    """The guards the cut-over applies (and the recipe check before the load)."""
    return SwapGuards(
        min_ratio=options.min_ratio,
        allow_shrink=options.allow_shrink,
        allow_recipe_change=options.allow_recipe_change,
        keep_old_seconds=options.keep_old,
    )
