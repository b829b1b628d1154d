"""bloomctl: the lifecycle of Bloom filters kept in Redis.

The package is a library first; ``bloomctl.cli`` is a thin Click adapter over it. The public
names below load lazily (PEP 562), so ``import bloomctl`` and ``bloomctl --help`` stay fast:

    from bloomctl import Filter, ShardedFilter, WindowedFilter, open_filter, plan, connect, settings_from

See docs/python-api.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# name -> the module that defines it
_PUBLIC = {
    "Filter": "bloomctl.filters.bloom",
    "ShardedFilter": "bloomctl.filters.bloom",
    "open_filter": "bloomctl.filters.bloom",
    "WindowedFilter": "bloomctl.filters.windowed",
    "plan": "bloomctl.sizing.bloom",
    "Plan": "bloomctl.sizing.bloom",
    "connect": "bloomctl.server.connection",
    "settings_from": "bloomctl.server.connection",
    "detect": "bloomctl.server.capabilities",
    "KeyFamily": "bloomctl.keys",
    "FilterLock": "bloomctl.lifecycle.lock",
    "RebuildOptions": "bloomctl.rebuild",
    "open_source": "bloomctl.sources",
    "BloomctlError": "bloomctl.errors",
    "ExitCode": "bloomctl.errors",
}

__all__ = [  # noqa: RUF022 - in the order of _PUBLIC
    "__version__",
    "Filter",
    "ShardedFilter",
    "open_filter",
    "WindowedFilter",
    "plan",
    "Plan",
    "connect",
    "settings_from",
    "detect",
    "KeyFamily",
    "FilterLock",
    "RebuildOptions",
    "open_source",
    "BloomctlError",
    "ExitCode",
]

if TYPE_CHECKING:  # pragma: no cover - what the lazy names are, for type checkers and editors
    from bloomctl.errors import BloomctlError, ExitCode
    from bloomctl.filters.bloom import Filter, ShardedFilter, open_filter
    from bloomctl.filters.windowed import WindowedFilter
    from bloomctl.keys import KeyFamily
    from bloomctl.lifecycle.lock import FilterLock
    from bloomctl.rebuild import RebuildOptions
    from bloomctl.server.capabilities import detect
    from bloomctl.server.connection import connect, settings_from
    from bloomctl.sizing.bloom import Plan, plan
    from bloomctl.sources import open_source


# Every lazy name is declared above for type checkers, so only a misspelt one meets this annotation:
# object makes a type checker flag it where Any would let it through.
def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'bloomctl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
