"""Metadata: the hash beside every filter (``{KEY}:meta``) that records how it was made.

It holds what the server does not report (the error rate asked for, the creation time, the
bloomctl version) and, for a standby, the state of the rebuild writing it: a standby marked
``loading`` or ``failed`` is never swapped in.
"""

from __future__ import annotations

from datetime import UTC, datetime

from bloomctl import __version__
from bloomctl.client import RedisClient
from bloomctl.planner import Plan

# A rebuild marks its standby "loading" until verified, "failed" when verification found a miss,
# then "verified" (or "loaded" when verification was turned off).
LOADING, FAILED, VERIFIED, LOADED = "loading", "failed", "verified", "loaded"
UNFINISHED = (LOADING, FAILED)

# Set a standby's state only if its metadata still carries this run's generation.
MARK_LUA = """
if redis.call('HGET', KEYS[1], 'generation') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
return 1
"""


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def metadata_for(plan: Plan, backend: str) -> dict[str, str]:
    return {
        "error_rate": repr(plan.error_rate),
        "capacity": str(plan.capacity),
        "expansion": str(plan.expansion) if plan.scaling else "nonscaling",
        "backend": backend,
        "created_at": now_utc(),
        "created_by": f"bloomctl {__version__}",
    }


def read_metadata(client: RedisClient, meta_key: bytes) -> dict[str, str]:
    raw = client.hgetall(meta_key)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in raw.items()}


def mark_state(client: RedisClient, meta_key: bytes, generation: str, state: str) -> bool:
    """Set ``state`` in a standby's metadata if it still belongs to ``generation``; False otherwise."""
    return bool(client.register_script(MARK_LUA)(keys=[meta_key], args=[generation, state]))
