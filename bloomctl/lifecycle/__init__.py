"""The lifecycle of one filter or a sharded one: reserve, describe, swap, rollback, under a lock.

``front`` is the front door (any filter, with lock and guards); ``single`` and ``sharded`` are the
steps for one filter and for every member; ``metadata``, ``lock``, ``manifest``, ``routing`` and
``standby`` are the companions those steps keep beside the filter; ``fill`` measures it.

``bloomctl.lifecycle.swap`` and the other front-door names stay reachable here, loaded on first
use, for code written as ``from bloomctl import lifecycle``.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    front = importlib.import_module("bloomctl.lifecycle.front")
    try:
        return getattr(front, name)
    except AttributeError:
        raise AttributeError(f"module 'bloomctl.lifecycle' has no attribute {name!r}") from None
