"""The application API of a time-windowed filter: add to the current bucket, look up over the window.

Each call is one call of the function library, by the server's clock; ``bloomctl.window`` makes
and rotates the window's buckets.
"""

from __future__ import annotations

from bloomctl.errors import KeyMissing, StateConflict
from bloomctl.keys import to_bytes, to_display
from bloomctl.server.client import RedisClient


class WindowedFilter:
    """A time-windowed filter: ``add``/``madd`` into the current bucket, ``exists``/``mexists`` over
    the window, each one call of the function library (``bloomctl_window_add``, ``_exists``), by
    the server's clock. An add into a missing bucket raises KeyMissing: run ``bloomctl window rotate``.

    >>> seen = WindowedFilter(client, "dedupe")
    >>> if not seen.exists(event_id): process(event_id); seen.add(event_id)
    """

    def __init__(self, client: RedisClient, name: str | bytes) -> None:
        from bloomctl.backends.library import Library

        self.client, self.name = client, to_bytes(name)
        self.library = Library()

    def _call(self, op: str, items: list[bytes], read_only: bool) -> list[int]:
        import redis

        try:
            return list(self.library.call_keys(self.client, op, [self.name], *items, read_only=read_only))
        except redis.exceptions.ResponseError as exc:
            text = str(exc)
            if "does not exist" in text:
                raise KeyMissing("%s", text.removeprefix("ERR ")) from None
            if "window settings are" in text:  # incomplete or damaged settings
                raise StateConflict("%r holds damaged window settings", to_display(self.name)) from None
            if "does not hold a bloomctl window" in text:
                raise StateConflict("%r is not a bloomctl window", to_display(self.name)) from None
            if "window bucket" in text:  # a bucket's own error (another kind of value there, full...)
                raise StateConflict("%s", text.removeprefix("ERR ")) from None
            if "not found" in text:
                raise KeyMissing("window %r does not exist", to_display(self.name)) from None
            raise

    def madd(self, items: list[bytes | str]) -> list[bool]:
        """Add to the current bucket; True where the item was new to it."""
        if not items:
            return []
        flags = self._call("window_add", [to_bytes(i) for i in items], read_only=False)
        # -1: no slot (a cuckoo bucket); an error element or a short reply: BF.INSERT stopped at a full
        # non-scaling bucket, and the items after it were not added
        if len(flags) != len(items) or any(flag == -1 or isinstance(flag, Exception) for flag in flags):
            added = sum(1 for flag in flags if flag == 1)
            raise StateConflict(
                "the current bucket of window %r is full: %s of %s items added; plan a larger capacity (or let it grow)",
                to_display(self.name),
                f"{added:,}",
                f"{len(items):,}",
            )
        return [flag == 1 for flag in flags]

    def add(self, item: bytes | str) -> bool:
        return self.madd([item])[0]

    def mexists(self, items: list[bytes | str]) -> list[bool]:
        """Whether each item is in any bucket of the window (missing buckets count as empty)."""
        if not items:
            return []
        return [flag == 1 for flag in self._call("window_exists", [to_bytes(i) for i in items], read_only=True)]

    def exists(self, item: bytes | str) -> bool:
        return self.mexists([item])[0]

    def current_bucket(self, at: float | None = None) -> tuple[bytes, bool]:
        """The key of the bucket for ``at`` (now, by the server's clock, when None) and whether it exists."""
        args = [str(int(at))] if at is not None else []
        key, exists = self.library.call_keys(self.client, "window_bucket", [self.name], *args, read_only=True)
        return key, bool(exists)
