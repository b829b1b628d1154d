"""Lock: one bloomctl process at a time per filter.

``SET lock value NX PX ttl`` with a random token in the value; a thread renews the expiry while
the work runs, and release is compare-and-delete in Lua, so a process never deletes a lock that
expired and was taken by another. A holder that dies stops renewing, and its lock expires by
itself after ``ttl``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from datetime import UTC, datetime

from bloomctl.defaults import DEFAULT_LOCK_TTL_MS, MAX_LOCK_WAIT_SECONDS
from bloomctl.errors import LockHeld, StateConflict, UnsupportedServer, UsageError
from bloomctl.keys import KeyFamily, to_display
from bloomctl.lifecycle.metadata import check_companions
from bloomctl.server.client import RedisClient

RENEW_LUA = """
local value = redis.call('GET', KEYS[1])
if value and cjson.decode(value)['token'] == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

HELD_CHECK_SECONDS = 0.1  # at most 10 GETs a second: a taken lock stops the writer within 0.1 s
PROBE_LUA = "return redis.call('EXISTS', KEYS[1])"  # may this user run scripts on the filter's keys?

RELEASE_LUA = """
local value = redis.call('GET', KEYS[1])
if value and cjson.decode(value)['token'] == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def describe_holder(raw: bytes | None) -> str:
    if raw is None:
        return "nobody"
    try:
        holder = json.loads(raw)
        return f"{holder.get('command', 'bloomctl')} pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}"
    except (ValueError, AttributeError):
        return "another process (an unreadable lock value)"


TAKEN = [False]  # whether this process took a filter's lock (what a message after a signal may say)
# what this process changed for good (a swap, a rollback): a message after a signal says it stands
DONE: list[str] = []


class FilterLock:
    """A context manager: acquire on enter (or raise LockHeld), renew in the background, release on exit."""

    def __init__(
        self,
        client: RedisClient,
        key: str | bytes,
        *,
        command: str = "bloomctl",
        ttl_ms: int = DEFAULT_LOCK_TTL_MS,
        wait: float = 0,
    ) -> None:
        if not 0 <= wait <= MAX_LOCK_WAIT_SECONDS:  # NaN too: it would wait for ever
            raise UsageError("`lock_wait` must be 0 to %s seconds, got %r", MAX_LOCK_WAIT_SECONDS, wait)
        self.client = client
        self.wait = wait  # seconds to wait for a held lock before LockHeld (0: refuse at once)
        self.family = KeyFamily.of(key)
        self.lock_key = self.family.lock
        self.ttl_ms = ttl_ms
        self.token = secrets.token_hex(16)
        self.value = json.dumps(
            {
                "token": self.token,
                "command": command,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "since": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
        self.lost = threading.Event()
        self._valid_until = float("inf")  # not acquired yet: nothing to lose
        self._held_checked = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lock, or raise LockHeld naming its holder; with ``wait``, retry (every 0.05 s
        growing to 1 s) until the holder releases it or ``wait`` seconds have passed."""
        self._require_scripting()
        deadline = time.monotonic() + self.wait
        pause = 0.05
        while True:
            asked = time.monotonic()
            if self.client.set(self.lock_key, self.value, nx=True, px=self.ttl_ms):
                break
            check_companions(self.client, [(self.lock_key, "lock")])  # a hash there: not a lock at all
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._refuse()
            time.sleep(min(pause, remaining))  # the last try at the deadline itself
            pause = min(pause * 2, 1.0)
        self._valid_until = asked + self.ttl_ms / 1000
        TAKEN[0] = True
        self._thread = threading.Thread(target=self._renew, name="bloomctl-lock", daemon=True)
        self._thread.start()

    def _refuse(self) -> None:
        raw = self.client.get(self.lock_key)
        holder = describe_holder(raw) if raw is not None else "another run, which just released it"
        ttl = self.client.pttl(self.lock_key) if raw is not None else -2
        expiry = f"; it expires in {ttl / 1000:.0f}s unless renewed" if ttl and ttl > 0 else ""
        waited = f" (waited {self.wait:g}s)" if self.wait else " (--lock-wait SECONDS waits for it)"
        raise LockHeld("%r is locked by %s%s%s", to_display(self.family.active), holder, expiry, waited)

    def check_free(self, *, scripts: bool = False) -> None:
        """Read-only (a dry run): raises LockHeld, like ``acquire``, when the lock is held now; with
        ``scripts``, also what ``acquire`` checks first: that this user may run scripts."""
        check_companions(self.client, [(self.lock_key, "lock")])
        if self.client.exists(self.lock_key):
            self._refuse()
        if scripts:
            self._require_scripting()

    def _require_scripting(self) -> None:
        """The lock's renewal and release, and everything done under it (marks, the swap), are Lua
        scripts: a user without them (ACL -@scripting) is told now, before anything is written,
        not after a whole load."""
        import redis

        try:
            self.client.register_script(PROBE_LUA)(keys=[self.lock_key])
        except redis.exceptions.NoPermissionError as exc:
            raise UnsupportedServer(
                "this Redis user may not run Lua scripts (%s): bloomctl's lock, marks and swap are scripts; "
                "grant +@scripting (EVAL, EVALSHA, SCRIPT) on the filter's keys",
                str(exc).splitlines()[0],
            ) from None

    def _renew(self) -> None:
        script = self.client.register_script(RENEW_LUA)
        while not self._stop.wait(self.ttl_ms / 3000):
            asked = time.monotonic()  # the new expiry counts from before the request: never late
            try:
                if not script(keys=[self.lock_key], args=[self.token, self.ttl_ms]):
                    self.lost.set()
                    return
                self._valid_until = asked + self.ttl_ms / 1000
            except Exception:  # a transient error: try again before the lock expires
                continue

    def check(self) -> None:
        """Raise when the lock is lost: the renewal thread found it gone, or renewals kept failing
        (an unreachable server) until its expiry passed. The caller must stop."""
        if time.monotonic() >= self._valid_until:
            self.lost.set()
        if self.lost.is_set():
            raise StateConflict("lost the lock on %r (it expired): nothing swapped", to_display(self.family.active))

    def check_writing(self) -> None:
        """Before each write of a long run: ``check`` (local), and the server's word (``check_held``)
        at most every ``HELD_CHECK_SECONDS``: a writer whose lock was lost or taken stops at once,
        instead of writing on into the standby of the run that took it."""
        self.check()
        now = time.monotonic()
        if now - self._held_checked >= HELD_CHECK_SECONDS:
            self._held_checked = now
            self.check_held()

    def check_held(self) -> None:
        """Ask the server now (not the renewal thread's last look) whether the lock is still ours."""
        self.check()
        value = self.client.get(self.lock_key)
        if value is None or self.token.encode() not in value:
            self.lost.set()
            self.check()

    def release(self) -> None:
        """Best effort: a lock that cannot be released now (the node is gone) expires by itself, and
        an error here must not hide the one that ended the work."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with contextlib.suppress(Exception):
            self.client.register_script(RELEASE_LUA)(keys=[self.lock_key], args=[self.token])

    def release_confirmed(self, deadline: float) -> bool:
        """Release, retrying until the server answers or ``deadline`` (time.monotonic()) passes.

        After a command whose reply never came (a timeout), this settles its fate: a swap script
        still waiting in the server checks the lock's token, so once the release has run there, the
        script either ran before it or can no longer do anything. False: the server never answered."""
        self._stop.set()
        self.lost.set()  # from now on nothing may be written under this lock
        script = self.client.register_script(RELEASE_LUA)
        while True:
            try:
                script(keys=[self.lock_key], args=[self.token])
                return True
            except Exception:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.2)

    def __enter__(self) -> FilterLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
