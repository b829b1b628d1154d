"""Typed exceptions of the library and the exit code each one maps to at the CLI edge.

The library raises these; only ``bloomctl.cli`` turns them into a message on stderr and
an exit code. The codes are a public interface documented in docs/commands.md.

Messages name the library's parameters in backticks (`` `capacity` ``, `` `allow_shrink` ``):
a Python caller reads the keyword to pass, and the CLI shows the matching flag (``--capacity``).
Text that comes from elsewhere (a key name, a file name, a server's own error) is never written
into the message itself but passed as a value (``UsageError("`template` %r: %s", template, exc)``),
so the CLI's translation of the template cannot touch it.
"""

from __future__ import annotations

from collections.abc import Callable
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
