"""'Did you mean ...?' for a filter name that does not exist: the closest filter names on the server.

For the command line only (the library's Filter never pays for it). A production keyspace may
hold millions of keys, so the look is bounded: at most ``SCAN_CALLS`` SCAN calls of COUNT 1000
per primary and type (the filters' own type; strings for the bitmap backend), about 10,000 keys,
and whatever is found within that. Companion keys (standby, old) are never suggested. Best
effort: any error (an ACL user without SCAN, a Cluster node down) means no suggestion.
"""

from __future__ import annotations

import difflib

from bloomctl.errors import BloomctlError
from bloomctl.keys import to_bytes, to_display
from bloomctl.server.client import RedisClient

SCAN_CALLS = 10  # SCAN calls per primary and type, at most (COUNT 1000 each: about 10,000 keys looked at)
MODULE_TYPE = "MBbloom--"  # what TYPE says of a RedisBloom filter
COMPANION_SUFFIXES = (":standby", ":old")


def did_you_mean(client: RedisClient, key: str | bytes, names: set[str] | None = None) -> str:
    """``; did you mean 'users'?`` or ``''``. ``names``: key names already looked up (``key_names``),
    so that several missing keys cost one bounded look."""
    try:
        found = similar_filters(client, key, key_names(client) if names is None else names)
    except Exception:
        return ""
    if not found:
        return ""
    return "; did you mean " + " or ".join(repr(name) for name in found) + "?"


def key_names(client: RedisClient, calls: int = SCAN_CALLS) -> set[str]:
    """The names of the keys of a filter's type (RedisBloom's; strings for the bitmap backend) a
    bounded SCAN finds: at most ``calls`` calls of COUNT 1000 per primary and type."""
    from bloomctl.server.topology import primaries, scan_type

    names: set[str] = set()
    for node in primaries(client):
        for kind in (MODULE_TYPE, "string"):
            names.update(to_display(k) for k in scan_type(node, kind, count=1000, calls=calls))
    return names


def similar_filters(client: RedisClient, key: str | bytes, names: set[str]) -> list[str]:
    """Up to three filters among ``names`` close to ``key``, closest first."""
    from bloomctl import backends

    wanted = to_display(key)
    candidates = [name for name in names if name != wanted and not _companion(name)]
    close = difflib.get_close_matches(wanted, candidates, n=6, cutoff=0.75)
    filters = []
    for name in close:
        try:
            backends.for_key(client, to_bytes(name), "candidate")
        except BloomctlError:  # a plain string, since deleted...: not a filter
            continue
        filters.append(name)
    return filters[:3]


def _companion(name: str) -> bool:
    """A standby or old filter of some filter (bloomctl's companion names): never suggested."""
    return name.endswith(COMPANION_SUFFIXES)
