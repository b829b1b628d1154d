"""One bucket of a window: whether a key is one, how it differs from what the window makes, the plan of a new one."""

from __future__ import annotations

from bloomctl import backends
from bloomctl.backends import Backend
from bloomctl.backends.base import AnyPlan
from bloomctl.errors import StateConflict, UsageError
from bloomctl.server.client import RedisClient
from bloomctl.sizing.cuckoo import DEFAULT_BUCKET_SIZE, DEFAULT_MAX_ITERATIONS
from bloomctl.window.settings import WindowSpec


def holds(client: RedisClient, key: bytes, backend: Backend) -> bool:
    """Whether ``key`` holds a filter of ``backend`` (and so is a bucket the window may touch)."""
    try:
        return backends.for_key(client, key, "bucket") is backend
    except StateConflict:
        return False


def fitting_plan(
    spec: WindowSpec, backend: Backend, capacity: int, line: str | None
) -> tuple[AnyPlan | None, str | None]:
    """The plan of a new bucket of ``capacity`` as ``backend`` builds it; for an auto capacity
    beyond what the backend takes (a string's 512 MB, Redis 8's 2^30 items), the largest capacity
    it takes (at least the window's minimum); else None and why."""
    try:
        return backend.check_plan(spec.plan_for(capacity), line), None
    except UsageError as exc:
        problem = str(exc)
        if spec.capacity is not None:
            return None, problem
    best, low, high = None, spec.min_capacity, capacity - 1
    while low <= high:  # plans grow with the capacity, so a bisection finds the largest one the backend takes
        middle = (low + high) // 2
        try:
            best, low = backend.check_plan(spec.plan_for(middle), line), middle + 1
        except UsageError:
            high = middle - 1
    return (best, None) if best is not None else (None, problem)


def other_parameters(client: RedisClient, spec: WindowSpec, backend: Backend, key: bytes, line: str | None) -> str:
    """How the bucket at ``key`` differs from what the window makes ('' when it does not): a
    leftover of an earlier window of the same name, or one made by hand. Its size against a new
    bucket of its own capacity tells another error rate or bucket size; a fixed capacity is compared too."""
    state = backend.info(client, key)
    if state.kind == "cuckoo":
        for name, default in (("bucket_size", DEFAULT_BUCKET_SIZE), ("max_iterations", DEFAULT_MAX_ITERATIONS)):
            want, have = getattr(spec, name) or default, getattr(state, name, None)
            if have is not None and want != have:
                return f"{name.replace('_', ' ')} {have}; the window's is {want}"
    if state.filters != 1:
        return ""  # a grown filter's size tells nothing on its own
    capacity = spec.capacity if spec.capacity is not None else state.reserved_capacity
    try:
        expected = backend.check_plan(spec.plan_for(capacity), line)
    except UsageError:
        return ""
    if backend.size_bytes(expected) == state.size_bytes:
        return ""
    found = f"capacity {state.reserved_capacity:,}, {state.size_bytes:,} bytes"
    return f"{found}; a new bucket has capacity {expected.capacity:,}, {backend.size_bytes(expected):,} bytes"
