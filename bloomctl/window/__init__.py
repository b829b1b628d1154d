"""Time-windowed filters: a bucket per period, the last ``keep`` looked up together.

For "seen recently" and de-duplication. One module per job: ``periods`` (the bucket grid and its
labels, the server's clock), ``settings`` (the window's hash, read and checked; a new window
planned), ``buckets`` (one bucket: is a key one, how it differs, the plan of a new one),
``creation``, ``rotation`` and ``info`` (which also finds the buckets past their capacity). The application's side, ``WindowedFilter``, is in
``bloomctl.filters.windowed``.

The names below load on first use (PEP 562), for code written as ``from bloomctl import window``
and ``window.rotate(...)``; docs/windows.md describes windows.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# name -> the module that defines it
_PUBLIC = {
    "HOUR": "bloomctl.window.periods",
    "DAY": "bloomctl.window.periods",
    "WEEK": "bloomctl.window.periods",
    "MONDAY": "bloomctl.window.periods",
    "MAX_PERIOD": "bloomctl.window.periods",
    "parse_period": "bloomctl.window.periods",
    "format_period": "bloomctl.window.periods",
    "server_time": "bloomctl.window.periods",
    "MAX_KEEP": "bloomctl.window.settings",
    "DEFAULT_AHEAD": "bloomctl.window.settings",
    "MARK": "bloomctl.window.settings",
    "WindowSpec": "bloomctl.window.settings",
    "read_window": "bloomctl.window.settings",
    "check_settings": "bloomctl.window.settings",
    "new_window": "bloomctl.window.settings",
    "fitting_plan": "bloomctl.window.buckets",
    "other_parameters": "bloomctl.window.buckets",
    "aliases": "bloomctl.window.creation",
    "create": "bloomctl.window.creation",
    "STRAY_LOOKBACK": "bloomctl.window.rotation",
    "BucketAction": "bloomctl.window.rotation",
    "RotateReport": "bloomctl.window.rotation",
    "plan_capacity": "bloomctl.window.rotation",
    "rotate": "bloomctl.window.rotation",
    "BucketInfo": "bloomctl.window.info",
    "WindowInfo": "bloomctl.window.info",
    "describe": "bloomctl.window.info",
    "overfilled": "bloomctl.window.info",
    "above_plan": "bloomctl.window.info",
    "overfill_warning": "bloomctl.window.info",
    # The class lived here before the application API got its own room; old imports keep working.
    "WindowedFilter": "bloomctl.filters.windowed",
}

__all__ = [  # noqa: RUF022 - in the order of _PUBLIC
    "HOUR",
    "DAY",
    "WEEK",
    "MONDAY",
    "MAX_PERIOD",
    "parse_period",
    "format_period",
    "server_time",
    "MAX_KEEP",
    "DEFAULT_AHEAD",
    "MARK",
    "WindowSpec",
    "read_window",
    "check_settings",
    "new_window",
    "fitting_plan",
    "other_parameters",
    "aliases",
    "create",
    "STRAY_LOOKBACK",
    "BucketAction",
    "RotateReport",
    "plan_capacity",
    "rotate",
    "BucketInfo",
    "WindowInfo",
    "describe",
    "overfilled",
    "above_plan",
    "overfill_warning",
    "WindowedFilter",
]

if TYPE_CHECKING:  # pragma: no cover - what the lazy names are, for type checkers and editors
    from bloomctl.filters.windowed import WindowedFilter
    from bloomctl.window.buckets import fitting_plan, other_parameters
    from bloomctl.window.creation import aliases, create
    from bloomctl.window.info import BucketInfo, WindowInfo, above_plan, describe, overfill_warning, overfilled
    from bloomctl.window.periods import DAY, HOUR, MAX_PERIOD, MONDAY, WEEK, format_period, parse_period, server_time
    from bloomctl.window.rotation import STRAY_LOOKBACK, BucketAction, RotateReport, plan_capacity, rotate
    from bloomctl.window.settings import (
        DEFAULT_AHEAD,
        MARK,
        MAX_KEEP,
        WindowSpec,
        check_settings,
        new_window,
        read_window,
    )


# Every lazy name is declared above for type checkers, so only a misspelt one meets this annotation:
# object makes a type checker flag it where Any would let it through.
def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'bloomctl.window' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
