"""Typed exceptions of the library and the exit code each one maps to at the CLI edge.

The library raises these; only ``bloomctl.cli`` turns them into a message on stderr and
an exit code. The codes are a public interface documented in docs/commands.md.

Messages name the library's parameters in backticks (`` `capacity` ``, `` `allow_shrink` ``):
a Python caller reads the keyword to pass, and the CLI shows the matching flag (``--capacity``).
Text that comes from elsewhere (a key name, a file name, a server's own error) is never written
into the message itself but passed as a value (``UsageError("`template` %r: %s", template, exc)``),
so the CLI's translation of the template cannot touch it.

``classify`` reads any exception (these, redis-py's, a signal) the one way every command and
every loop over declared filters reads it: its exit code, and whether the server is behind it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    OK = 0
    CHECK_FAILED = 1  # a threshold check failed (fill-ratio over --max)
    USAGE = 2  # bad option or value (Click uses 2 too)
    CONNECTION = 3  # cannot reach or talk to the server (refused, auth, timeout, server error)
    UNSUPPORTED = 4  # the server lacks what the command needs (no BF.* commands, no SCANDUMP)
    CONFLICT = 5  # the keys are not in the state the command needs (exists, missing, wrong type)
    LOCKED = 6  # another bloomctl process holds the filter's lock
    VERIFY_FAILED = 7  # a verification step found a missing item
    SOURCE = 8  # the data source is unreadable or malformed
    MISSING_EXTRA = 9  # an optional dependency is not installed: the message names the extra
    INTERNAL = 70  # a bug: please report it
    INTERRUPTED = 130  # Ctrl-C (SIGINT)
    TERMINATED = 143  # SIGTERM (what systemd, Kubernetes and `timeout` send)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that the same cleanup runs (the lock is
    released, an unfinished standby marked), then exit 143."""


class BloomctlError(Exception):
    """Base class: every error the library raises on purpose.

    ``message`` is the text, or with ``values`` a %-template for them (``%s``, ``%r``; ``%%`` for a
    percent sign).
    """

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, *values: object) -> None:
        self.template = message
        self.values = values
        super().__init__(message % values if values else message)

    def __reduce__(self) -> tuple[Any, ...]:  # across processes (a parallel build), values stay apart
        return (type(self), (self.template, *self.values))

    def render(self, translate: Callable[[str], str]) -> str:
        """The message with ``translate`` applied to the template only (never to the values)."""
        template = translate(self.template)
        return template % self.values if self.values else template


class UsageError(BloomctlError):
    """An argument or option value is invalid."""

    exit_code = ExitCode.USAGE


class ConnectionFailed(BloomctlError):
    """The server cannot be reached, refused the credentials, timed out or answered an error."""

    exit_code = ExitCode.CONNECTION


class OutOfMemory(ConnectionFailed):
    """The server refused a write for memory (maxmemory with noeviction, or the machine's)."""


class UnsupportedServer(BloomctlError):
    """The server lacks the commands a step needs."""

    exit_code = ExitCode.UNSUPPORTED


class StateConflict(BloomctlError):
    """The keys are not in the state the command needs."""

    exit_code = ExitCode.CONFLICT


class KeyMissing(StateConflict):
    """A key the command needs does not exist."""

    filter_key: bytes | None = None  # the filter name the user gave (the CLI may suggest close ones)


class MadeMeanwhile(StateConflict):
    """A first build (``only_if_missing``) found, under the lock, the filter made meanwhile by
    another run: nothing was built."""


class WrongType(StateConflict):
    """A key exists but holds something other than a Bloom filter."""


class LockHeld(BloomctlError):
    """Another process holds the filter's lock."""

    exit_code = ExitCode.LOCKED


class VerifyFailed(BloomctlError):
    """A verification found items that should be present but are not."""

    exit_code = ExitCode.VERIFY_FAILED


class SourceError(BloomctlError):
    """The data source could not be read."""

    exit_code = ExitCode.SOURCE


class MissingExtra(BloomctlError):
    """An optional dependency is not installed, or does not import: the message says which, and
    the ``pip install`` of the extra that brings it (``bloomctl.extras`` words them)."""

    exit_code = ExitCode.MISSING_EXTRA

    def __init__(self, message: str, *values: object, extra: str | None = None, install: str | None = None) -> None:
        super().__init__(message, *values)
        self.extra = extra  # the extra of redis-bloomctl that installs it; None: a module no extra ships
        self.install = install  # the command that installs it, for reports that show a fix apart

    def __reduce__(self) -> tuple[Any, ...]:  # the extra crosses processes too
        return (type(self), (self.template, *self.values), {"extra": self.extra, "install": self.install})


# --- what any exception means: one classifier for the library and the command line -------------


@dataclass(frozen=True)
class Failure:
    """What an exception means to bloomctl: the exit code it ends a command with, and what kind
    of trouble it is. ``classify`` makes it; nothing else decides these."""

    exception: BaseException = field(compare=False)
    exit_code: int
    expected: bool  # a failure bloomctl reports as a result; anything else is a bug, raised
    redis_error: bool  # redis-py raised it: the server refused a command, or did not answer
    unreachable: bool  # the server did not answer: nothing more can be asked of it now
    out_of_memory: bool  # the server refused a write for memory

    @property
    def line(self) -> str:
        return first_line(self.exception)


def classify(exc: BaseException) -> Failure:
    """The one reading of an exception: bloomctl's own errors carry their code; a signal ends with
    130 or 143; an exception carrying its own ``exit_code`` (the command line's usage errors) keeps
    it; redis-py's are the server's (3); anything else is a bug (70)."""
    redis_error = is_redis_error(exc)
    carried = getattr(exc, "exit_code", None)
    return Failure(
        exception=exc,
        exit_code=_exit_code(exc, redis_error),
        expected=isinstance(exc, BloomctlError) or redis_error or isinstance(carried, int),
        redis_error=redis_error,
        unreachable=_unreachable(exc, redis_error),
        out_of_memory=is_out_of_memory(exc),
    )


def _exit_code(exc: BaseException, redis_error: bool) -> int:
    if isinstance(exc, BloomctlError):
        return int(exc.exit_code)
    if isinstance(exc, Terminated):
        return int(ExitCode.TERMINATED)
    if isinstance(exc, KeyboardInterrupt):
        return int(ExitCode.INTERRUPTED)
    carried = getattr(exc, "exit_code", None)
    if isinstance(carried, int):
        return int(carried)
    if redis_error:
        return int(ExitCode.CONNECTION)
    return int(ExitCode.INTERNAL)


def _unreachable(exc: BaseException, redis_error: bool) -> bool:
    """A server that did not answer: refused, lost or timed out (ours: any connection failure)."""
    if isinstance(exc, BloomctlError):
        return exc.exit_code == ExitCode.CONNECTION
    if not redis_error:
        return False
    import redis  # already loaded: it raised the exception

    return isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError)


def is_redis_error(exc: BaseException) -> bool:
    """An exception of redis-py's (asked without importing redis: ``--help`` never loads it)."""
    return type(exc).__module__.split(".")[0] == "redis"


def is_out_of_memory(exc: BaseException) -> bool:
    """A write refused for memory: redis-py's OutOfMemoryError, or a script or pipeline reply
    that carries Redis's OOM error."""
    return type(exc).__name__ == "OutOfMemoryError" or "command not allowed when used memory" in str(exc)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none."""
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__
