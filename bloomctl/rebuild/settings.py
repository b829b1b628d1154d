"""What each step of a rebuild takes of its options: resolved once, by the preflight, handed down.

``RebuildOptions`` is the one public input. The plan step takes a ``PlanRequest``, the load and
the catch-up a ``LoadSettings``, the verification a ``VerifySettings``, the cut-over its
``SwapGuards``, and the run itself (the lock, a dry run) its ``RunControls``: each step gets
only its own value, and none reads the whole bag.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

from bloomctl.lifecycle.guards import SwapGuards
from bloomctl.rebuild.options import RebuildOptions

T = TypeVar("T")


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
        return copied(
            cls, options, client_build=options.build == "client" or options.jobs > 1 or options.engine is not None
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
    engine: Any  # builds the bits on a cluster (an ``Engine``), or None

    @classmethod
    def of(cls, options: RebuildOptions, batch: int) -> LoadSettings:
        return copied(
            cls,
            options,
            batch=batch,
            sample=0 if options.verify_all else options.verify_sample,
            build="client" if options.engine is not None else options.build,  # an engine only builds bits
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
    only_if_missing: bool  # a first build: a filter made meanwhile is not built again
    lock_command: str

    @classmethod
    def of(cls, options: RebuildOptions) -> RunControls:
        return copied(cls, options)


def copied(cls: type[T], options: RebuildOptions, **computed: Any) -> T:
    """A settings value whose fields are the options of the same names, but for ``computed``."""
    named = {field.name: getattr(options, field.name) for field in fields(cls) if field.name not in computed}  # type: ignore[arg-type]
    return cls(**named, **computed)


def swap_guards(options: RebuildOptions) -> SwapGuards:
    """The guards the cut-over applies (and the recipe check before the load)."""
    return SwapGuards(
        min_ratio=options.min_ratio,
        allow_shrink=options.allow_shrink,
        allow_recipe_change=options.allow_recipe_change,
        keep_old_seconds=options.keep_old,
    )
