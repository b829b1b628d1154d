"""The application API: the objects an application holds to add and look up items.

``Filter`` and ``ShardedFilter`` (``open_filter`` picks one for a key) live in ``bloom``;
``WindowedFilter``, a time-windowed filter's, in ``windowed``. The names load on first use
(PEP 562), so a window's application does not load the other filters' code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# name -> the module that defines it
_PUBLIC = {
    "Filter": "bloomctl.filters.bloom",
    "ShardedFilter": "bloomctl.filters.bloom",
    "open_filter": "bloomctl.filters.bloom",
    "WindowedFilter": "bloomctl.filters.windowed",
}

__all__ = ["Filter", "ShardedFilter", "WindowedFilter", "open_filter"]

if TYPE_CHECKING:  # pragma: no cover - what the lazy names are, for type checkers and editors
    from bloomctl.filters.bloom import Filter, ShardedFilter, open_filter
    from bloomctl.filters.windowed import WindowedFilter


# Every lazy name is declared above for type checkers, so only a misspelt one meets this annotation:
# object makes a type checker flag it where Any would let it through.
def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'bloomctl.filters' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
