"""The one loop over declared filters: each reached through its profile's server, each failure its own.

check, apply, ``rebuild --all`` and the exporter all run an action on every declared filter.
``Fleet`` connects to each filter's profile, runs the action, and turns an error that
``errors.classify`` expects (bloomctl's own, the server's, a command line's) into that filter's
outcome, so that one filter's failure hides no other filter's result. Anything else is a bug and
is raised. Outcomes are yielded as each filter ends: a caller logs or records one before the
next filter is asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from bloomctl.declared.config import Declared
from bloomctl.errors import Failure, classify
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient

T = TypeVar("T")
Connect = Callable[[str], tuple[RedisClient, ServerInfo]]  # a profile's name -> its client and server
Action = Callable[[RedisClient, ServerInfo, Declared], T]
Log = Callable[[str, dict[str, Any], str], None]  # (message, fields, level): a loop's log lines
REASON_LENGTH = 200  # characters of an error's line in a report


def no_log(_message: str, _fields: dict[str, Any], _level: str) -> None:
    return None


def reason(failure: Failure) -> str:
    """A failure's one line, short enough for a report's line."""
    return failure.line[:REASON_LENGTH]


@dataclass
class Outcome(Generic[T]):
    """What came of one filter: the action's value, or its failure."""

    decl: Declared
    value: T | None = None
    failure: Failure | None = None
    reached: bool = True  # False: the profile's server was not reached, and the action never ran


def _failure(exc: Exception) -> Failure:
    """The failure of one filter, or the exception again when it is a bug."""
    failure = classify(exc)
    if not failure.expected:
        raise exc
    return failure


def attempt(action: Action[T], client: RedisClient, server: ServerInfo, decl: Declared) -> Outcome[T]:
    """The action on one filter whose server is reached."""
    try:
        return Outcome(decl, action(client, server, decl))
    except Exception as exc:
        return Outcome(decl, failure=_failure(exc))


@dataclass
class Turn:
    """One profile's filters, with its server, or why it was not reached."""

    profile: str
    decls: list[Declared]
    began: float  # time.monotonic() before the connection was opened
    client: RedisClient | None = None
    server: ServerInfo | None = None
    failure: Failure | None = None

    def each(self, action: Action[T]) -> Iterator[Outcome[T]]:
        """The action on each of the profile's filters (none runs when the server was not reached)."""
        for decl in self.decls:
            if self.client is None or self.server is None:
                yield Outcome(decl, failure=self.failure, reached=False)
            else:
                yield attempt(action, self.client, self.server, decl)


class Fleet:
    """Declared filters and the way to reach each one's server."""

    def __init__(self, decls: Iterable[Declared], connect: Connect) -> None:
        self.decls = list(decls)
        self.connect = connect

    def each(self, action: Action[T], decls: Iterable[Declared] | None = None) -> Iterator[Outcome[T]]:
        """The action on each filter (or those ``decls``) in the file's order. The profile is
        asked for each filter: ``connect`` keeps a connection it opened, and a server that did not
        answer is asked again for the next filter, since a long run's server may be back."""
        for decl in self.decls if decls is None else decls:
            try:
                client, server = self.connect(decl.profile)
            except Exception as exc:
                yield Outcome(decl, failure=_failure(exc), reached=False)
                continue
            yield attempt(action, client, server, decl)

    def by_profile(self) -> Iterator[Turn]:
        """Each profile in the order the file first names it, connected once, with its filters."""
        for profile in dict.fromkeys(d.profile for d in self.decls):
            turn = Turn(profile, [d for d in self.decls if d.profile == profile], time.monotonic())
            try:
                turn.client, turn.server = self.connect(profile)
            except Exception as exc:
                turn.failure = _failure(exc)
            yield turn
