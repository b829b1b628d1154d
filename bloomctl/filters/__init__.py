"""The application API: the objects an application holds to add and look up items.

``Filter`` and ``ShardedFilter`` (``open_filter`` picks one for a key) live in ``bloom``.
"""

from __future__ import annotations

from bloomctl.filters.bloom import Filter, ShardedFilter, open_filter

__all__ = ["Filter", "ShardedFilter", "open_filter"]
