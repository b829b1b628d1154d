"""The calendar of a window: period lengths, the bucket grid and its labels, the server's clock.

Buckets start at whole multiples of the period since the Unix epoch; periods of whole weeks start
on a Monday. A bucket's label is its start in UTC: ``YYYY-MM-DD`` for periods of whole days, else
``YYYY-MM-DDTHH``. The same arithmetic runs in ``window.lua``; docs/windows.md has the details.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from bloomctl.errors import UsageError
from bloomctl.server.client import RedisClient
from bloomctl.server.topology import node_client

HOUR, DAY, WEEK = 3600, 86_400, 7 * 86_400
MONDAY = 4 * DAY  # 1970-01-01 was a Thursday: weeks start 4 days later
MAX_PERIOD = 366 * DAY
LABEL_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H")
_PERIOD = re.compile(r"^\s*([1-9][0-9]*)\s*([hdw])\s*$", re.I)
_UNITS = {"h": HOUR, "d": DAY, "w": WEEK}


def parse_period(text: str | int) -> int:
    """``1h``, ``6h``, ``1d``, ``7d``, ``30d`` or ``2w`` as seconds (whole hours, up to 366 days)."""
    if isinstance(text, int) and not isinstance(text, bool):
        seconds = text
    else:
        match = _PERIOD.match(str(text))
        if not match:
            raise UsageError("`period` %r is not a period (examples: 1h, 6h, 1d, 7d, 30d, 2w)", text)
        seconds = int(match.group(1)) * _UNITS[match.group(2).lower()]
    if seconds % HOUR or not HOUR <= seconds <= MAX_PERIOD:
        raise UsageError("`period` must be whole hours, from 1h to 366d, got %r", text)
    return seconds


def format_period(seconds: int) -> str:
    for unit, size in (("w", WEEK), ("d", DAY), ("h", HOUR)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"  # pragma: no cover - periods are whole hours


def grid_offset(period: int) -> int:
    """Where the grid of ``period`` starts after the epoch: a Monday for whole weeks, else 0."""
    return MONDAY if period % WEEK == 0 else 0


def bucket_index(period: int, unix_seconds: float) -> int:
    return math.floor((unix_seconds - grid_offset(period)) / period)


def bucket_start(period: int, index: int) -> int:
    return grid_offset(period) + index * period


def bucket_label(period: int, index: int) -> str:
    moment = datetime.fromtimestamp(bucket_start(period, index), UTC)
    return moment.strftime(LABEL_FORMATS[0] if period % DAY == 0 else LABEL_FORMATS[1])


def label_index(period: int, label: str) -> int | None:
    """The bucket ``label`` names on the grid of ``period`` (None: it names none)."""
    for pattern in LABEL_FORMATS:
        try:
            moment = datetime.strptime(label, pattern).replace(tzinfo=UTC)
        except ValueError:
            continue
        index = bucket_index(period, moment.timestamp())
        return index if bucket_label(period, index) == label else None
    return None


def iso(unix_seconds: float | None) -> str | None:
    if unix_seconds is None:
        return None
    return datetime.fromtimestamp(unix_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def server_time(client: RedisClient, key: bytes) -> float:
    """Now, by the clock of the server that holds ``key``, the clock the window functions read too."""
    seconds, micros = node_client(client, key).time()
    return seconds + micros / 1e6
