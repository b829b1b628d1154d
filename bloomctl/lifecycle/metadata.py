"""Metadata: the hash beside every filter (``{KEY}:meta``) that records how it was made.

It holds what the server does not report (the error rate asked for, the creation time, the
bloomctl version) and, for a standby, the state of the rebuild writing it: a standby marked
``loading`` or ``failed`` is never swapped in.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from bloomctl import __version__
from bloomctl.errors import StateConflict
from bloomctl.keys import to_display
from bloomctl.server.client import RedisClient
from bloomctl.sizing.bloom import Plan
from bloomctl.sizing.cuckoo import CuckooPlan

# A rebuild marks its standby "loading" until verified, "failed" when verification found a miss,
# then "verified" (or "loaded" when verification was turned off).
LOADING, FAILED, VERIFIED, LOADED = "loading", "failed", "verified", "loaded"
INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM stopped the rebuild
UNFINISHED = (LOADING, FAILED, INTERRUPTED)

# Set a standby's state only if its metadata still carries this run's generation.
MARK_LUA = """
if redis.call('HGET', KEYS[1], 'generation') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
return 1
"""


RECIPE = "recipe"  # how a rebuild built its items: JSON of the source's kind, column, template and prefix


def recipe_field(recipe: dict[str, object]) -> str:
    return json.dumps(recipe, sort_keys=True, separators=(",", ":"))


def describe_recipe(field: str) -> str:
    """A recorded recipe as a person reads it: ``csv, column email, prefix 'user:'``."""
    try:
        recipe = json.loads(field)
    except ValueError:
        return repr(field)
    if not isinstance(recipe, dict):
        return repr(field)
    parts = [str(recipe.get("source", "?"))]
    parts += [f"{name} {recipe[name]!r}" for name in ("column", "template", "prefix") if recipe.get(name) is not None]
    return ", ".join(parts)


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


SCHEMA = 1  # the metadata's layout: written as the "schema" field, shown typed in JSON output


def typed(meta: dict[str, str]) -> dict[str, object]:
    """The metadata as JSON shows it: numbers as numbers, the recipe as an object, the schema as an
    integer (a hash stores only text; fields bloomctl does not know stay text)."""
    out: dict[str, object] = {}
    for name, text in meta.items():
        value: object = text
        try:
            if name in ("capacity", "schema", "bucket_size", "max_iterations", "fingerprint_bits") or (
                name == "expansion" and text.isdigit()
            ):
                value = int(text)
            elif name == "error_rate":
                value = float(text)
            elif name == RECIPE:
                value = json.loads(text)
        except ValueError:
            value = text  # damaged: shown as it is
        out[name] = value
    out.setdefault("schema", 0)  # written before the schema field existed (bloomctl 0.1)
    return out


def metadata_for(plan: Plan | CuckooPlan, backend: str) -> dict[str, str]:
    """What the metadata records of a new filter: its parameters (a cuckoo filter's bucket size,
    MAXITERATIONS and fingerprint size too) and who made it when. A cuckoo filter's error rate is
    its false-positive rate at the load it fills to."""
    meta = {
        "schema": str(SCHEMA),
        "error_rate": repr(plan.error_rate),
        "capacity": str(plan.capacity),
        "expansion": str(plan.expansion) if plan.scaling else "nonscaling",
        "backend": backend,
        "created_at": now_utc(),
        "created_by": f"bloomctl {__version__}",
    }
    if isinstance(plan, CuckooPlan):
        meta.update(
            type="cuckoo",
            bucket_size=str(plan.bucket_size),
            max_iterations=str(plan.max_iterations),
            fingerprint_bits=str(plan.fingerprint_bits),
        )
    return meta


CREATE_HASH_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""


def create_hash(client: RedisClient, key: bytes, mapping: dict[str, str] | dict[str, str | bytes]) -> bool:
    """Write a hash in one step where ``key`` does not exist yet (no reader sees half of it);
    False when it exists."""
    fields = [part for pair in mapping.items() for part in pair]
    return bool(client.register_script(CREATE_HASH_LUA)(keys=[key], args=fields))


def read_metadata(client: RedisClient, meta_key: bytes) -> dict[str, str]:
    problem = foreign_companion(client, meta_key, "metadata")
    if problem is not None:
        raise StateConflict("%r " + problem + ": move that key away (or delete it) first", to_display(meta_key))
    raw = client.hgetall(meta_key)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in raw.items()}


def mark_state(client: RedisClient, meta_key: bytes, generation: str, state: str) -> bool:
    """Set ``state`` in a standby's metadata if it still belongs to ``generation``; False otherwise."""
    return bool(client.register_script(MARK_LUA)(keys=[meta_key], args=[generation, state]))


def foreign_companion(client: RedisClient, key: bytes, role: str) -> str | None:
    """What is wrong with a companion key bloomctl is about to overwrite, move or delete (None:
    nothing; absent is fine). Metadata must be a hash bloomctl wrote (``created_by``), a lock a
    string: anything else belongs to someone else and is never touched."""
    kind = client.type(key)
    kind = kind if isinstance(kind, bytes) else str(kind).encode()
    if kind == b"none":
        return None
    if role == "metadata":
        if kind != b"hash":
            return f"holds a {kind.decode(errors='replace')}, not bloomctl metadata"
        written_by = client.hget(key, "created_by")
        for _again in range(3):
            # another run replacing its own metadata (deleted, then written whole) between two
            # reads: read both again; absent is fine (not MULTI: least-privilege users lack it)
            if written_by is not None:
                break
            kind = client.type(key)
            kind = kind if isinstance(kind, bytes) else str(kind).encode()
            if kind == b"none":
                return None
            if kind != b"hash":
                return f"holds a {kind.decode(errors='replace')}, not bloomctl metadata"
            written_by = client.hget(key, "created_by")
        if written_by is None or not written_by.startswith(b"bloomctl "):  # every bloomctl has written it
            return "is a hash bloomctl did not write (its created_by field is not 'bloomctl <version>')"
    elif role == "lock" and kind != b"string":
        return f"holds a {kind.decode(errors='replace')}, not a bloomctl lock"
    return None


def check_companions(client: RedisClient, keys: list[tuple[bytes, str]]) -> None:
    """Refuse (exit 5, the key named) when a companion key holds someone else's data."""
    for key, role in keys:
        problem = foreign_companion(client, key, role)
        if problem is not None:
            raise StateConflict(
                "%r " + problem + ": bloomctl keeps its %s there; move that key away (or delete it) first",
                to_display(key),
                role,
            )
