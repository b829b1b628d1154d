"""One rule for asking: a command that replaces or creates what applications read asks on a terminal.

`swap`, `rollback`, `restore --swap`, `copy --swap`, `rebuild --swap`, `reserve`, `window create`
and `apply` ask before they change what applications read, unless ``--yes``. Without a terminal on
stdin (a pipe, cron, CI) they never ask: no one would answer, and a prompt would hang the job.
A "no" changes nothing and exits 5.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from bloomctl.lifecycle.front import Confirm


def stdin_is_tty() -> bool:
    return sys.stdin.isatty()


def confirmer(yes: bool) -> Confirm | None:
    """The question-asker for the library (a swap's, a rollback's), or None: --yes, or no terminal."""
    if yes or not stdin_is_tty():
        return None
    return lambda question: click.confirm(question, default=False, err=True)


def ask(yes: bool, question: str) -> None:
    """Ask ``question`` on a terminal (unless --yes); a "no" stops the command, nothing changed."""
    from bloomctl.lifecycle.front import NotConfirmed

    confirm = confirmer(yes)
    if confirm is not None and not confirm(question):
        raise NotConfirmed("not confirmed: nothing changed")
