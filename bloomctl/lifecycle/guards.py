"""The guards of a swap, as one value: what a swap checks before it replaces the active filter.

``SwapGuards`` is built once where a swap is asked for (the keywords of ``lifecycle.swap``, a
rebuild's options, a restore's) and handed to every step that checks or applies it: the shrink
guard, the recipe guard, and how long the replaced filter is kept for a rollback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bloomctl.defaults import DEFAULT_KEEP_OLD_SECONDS, DEFAULT_MIN_RATIO, MAX_KEEP_OLD_SECONDS
from bloomctl.errors import UsageError


@dataclass(frozen=True)
class SwapGuards:
    """What a swap checks and keeps. The numbers are checked where each is used (``check`` does
    both at once for a caller that must refuse them before anything is written)."""

    min_ratio: float = DEFAULT_MIN_RATIO  # the standby must hold this share of the active filter's items
    allow_shrink: bool = False  # swap a standby below ``min_ratio`` all the same
    allow_recipe_change: bool = False  # swap in items built otherwise than the active filter's
    keep_old_seconds: float = DEFAULT_KEEP_OLD_SECONDS  # the replaced filter is kept this long; 0 unlinks it

    def check(self) -> None:
        """Both numbers in their ranges, else a UsageError."""
        to_keep_ms(self.keep_old_seconds)
        check_min_ratio(self.min_ratio)


DEFAULT_GUARDS = SwapGuards()


def to_keep_ms(seconds: float) -> int:
    """Milliseconds for PEXPIRE: a positive keep never rounds down to 0 (which would unlink)."""
    if not 0 <= seconds <= MAX_KEEP_OLD_SECONDS or seconds != seconds:
        raise UsageError("`keep_old` must be between 0 and %s seconds, got %s", MAX_KEEP_OLD_SECONDS, seconds)
    return math.ceil(seconds * 1000)


def check_min_ratio(min_ratio: float) -> float:
    """The shrink guard's threshold: a number >= 0 (a NaN would make every comparison false, and
    the guard would let anything through)."""
    if not (isinstance(min_ratio, int | float) and math.isfinite(min_ratio) and min_ratio >= 0):
        raise UsageError("`min_ratio` must be a number of at least 0, got %r", min_ratio)
    return float(min_ratio)
