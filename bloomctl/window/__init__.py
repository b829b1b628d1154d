"""Time-windowed filters: a bucket per period, rotation, lookups over the window.

The names of ``bloomctl.window`` (``create``, ``rotate``, ``describe``, ...) load on first use,
for code written as ``from bloomctl import window``.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    core = importlib.import_module("bloomctl.window.core")
    try:
        return getattr(core, name)
    except AttributeError:
        raise AttributeError(f"module 'bloomctl.window' has no attribute {name!r}") from None
