"""'Did you mean ...?' for a filter name that does not exist: the closest filter names on the server.

A production keyspace may hold millions of keys, so the look is bounded: one SCAN over at most
``SCAN_LIMIT`` keys (the filters' own type when the server can filter by type), and whatever is
found in that budget. Companion keys (standby, old, ...) are never suggested. Best effort: any
error (an ACL user without SCAN, a Cluster node down) means no suggestion, never a failure.
"""

from __future__ import annotations

import difflib
import itertools

from bloomctl.client import RedisClient
from bloomctl.errors import BloomctlError
from bloomctl.keys import to_bytes, to_display

SCAN_LIMIT = 10_000  # keys looked at, at most (SCAN COUNT 1000: about ten round trips per node)
MODULE_TYPE = "MBbloom--"  # what TYPE says of a RedisBloom filter
COMPANION_SUFFIXES = (":standby", ":old")


def did_you_mean(client: RedisClient, key: str | bytes) -> str:
    """``; did you mean 'users'?`` or ``''``."""
    try:
        found = similar_filters(client, key)
    except Exception:
        return ""
    if not found:
        return ""
    return "; did you mean " + " or ".join(repr(name) for name in found) + "?"


def similar_filters(client: RedisClient, key: str | bytes, limit: int = SCAN_LIMIT) -> list[str]:
    """Up to three existing filter names close to ``key``, closest first."""
    from bloomctl import backends

    wanted = to_display(key)
    names: set[str] = set()
    for kind in (MODULE_TYPE, "string"):  # RedisBloom filters, then bitmap ones (strings with a header)
        scanned = client.scan_iter(count=1000, _type=kind)
        names.update(to_display(k) for k in itertools.islice(scanned, limit))
    candidates = [name for name in names if name != wanted and not _companion(name)]
    close = difflib.get_close_matches(wanted, candidates, n=6, cutoff=0.75)
    filters = []
    for name in close:
        try:
            backends.for_key(client, to_bytes(name))
        except BloomctlError:  # a plain string, since deleted...: not a filter
            continue
        filters.append(name)
    return filters[:3]


def _companion(name: str) -> bool:
    """A standby or old filter of some filter (bloomctl's companion names): never suggested."""
    return name.endswith(COMPANION_SUFFIXES)
