"""A doctor check's verdict: a ``Finding`` with its level, and the finding of a check the user may not run."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from bloomctl.doctor.commands import acl_name, shown
from bloomctl.server.capabilities import _text

OK, INFO, WARNING, ERROR = "ok", "info", "warning", "error"
LEVELS = (OK, INFO, WARNING, ERROR)


@dataclass(frozen=True)
class Finding:
    check: str  # server, bloom, functions, persistence, eviction, memory, replication, cluster, keys, acl
    level: str  # ok | info | warning | error
    message: str
    detail: dict[str, Any] = field(default_factory=dict)
    fix: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "level": self.level,
            "message": self.message,
            "detail": self.detail,
            "fix": self.fix,
        }


def is_denied(exc: Exception) -> bool:
    """Whether the server refused a command for the user's ACL (NOPERM)."""
    from redis.exceptions import NoPermissionError

    return isinstance(exc, NoPermissionError) or "NOPERM" in str(exc)[:10]


def is_response_error(exc: Exception) -> bool:
    from redis.exceptions import ResponseError

    return isinstance(exc, ResponseError)


_REFUSED = re.compile(r"run the '([^']+)' command")


def not_allowed(check: str, what: str, command: str, exc: Exception) -> Finding:
    """The warning of a check the user may not run: which permission is missing (the command the
    server names, which may be another than the check's first: a library call made on the way)."""
    refused = _REFUSED.search(_text(exc))
    if refused and refused.group(1).lower() != acl_name(command):
        command = shown(refused.group(1))
    return Finding(
        check,
        WARNING,
        f"not allowed to read {what} ({command}): this check was skipped",
        {"command": command, "reason": _text(exc)},
        f"grant +{acl_name(command)} to check it, or run doctor as a user who may",
    )


def could_not(check: str, what: str, exc: Exception) -> Finding:
    """The warning of a check whose read failed for another reason than the user's rights."""
    return Finding(check, WARNING, f"could not read {what}: {_text(exc)}", {"reason": _text(exc)})
