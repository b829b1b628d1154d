"""A reader that hammers one key from its own connection while the test swaps filters under it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Hammer(threading.Thread):
    """Calls ``probe(client)`` in a loop; counts calls, errors and answers that ``ok`` rejects."""

    def __init__(self, client: Any, probe: Callable[[Any], Any], ok: Callable[[Any], bool]) -> None:
        super().__init__(daemon=True)
        self.client, self.probe, self.ok = client, probe, ok
        self.stop_event = threading.Event()
        self.calls = 0
        self.bad: list[Any] = []

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                answer = self.probe(self.client)
            except Exception as exc:  # every error counts as a failure
                self.bad.append(exc)
            else:
                if not self.ok(answer):
                    self.bad.append(answer)
            self.calls += 1

    def wait_for_calls(self, count: int, timeout: float = 10.0) -> None:
        """Block until the reader has made more than ``count`` calls (or ``timeout`` passed): on a busy
        machine the writer's loop can otherwise outrun a reader that the scheduler starves."""
        deadline = time.monotonic() + timeout
        while self.calls <= count and self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.001)

    def __enter__(self) -> Hammer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.join(10)
