"""Every line bloomctl writes to stderr, in one place: log lines, warnings and the error line.

Text log lines start with a UTC timestamp; with ``--log-format json`` every stderr line is one
JSON object, the error included (``level: error`` with its exit code). With ``--format json`` a
failed command also prints a JSON error object on stdout, where a script reads the result.
``--quiet`` silences log lines and warnings (never the error), and holds stdout back unless the
command fails (``bloomctl.cli.quiet_stdout``); ``-v`` adds the debug lines.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from bloomctl.cli.hints import Hints

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


@dataclass
class Output:
    quiet: bool = False
    log_format: str = "text"
    verbose: int = 0
    debug: bool = False
    output_format: str | None = None  # the command's --format, once known
    # how `bloomctl ...` commands in messages reach the server in use (bloomctl.cli.hints)
    hints: Callable[[], Hints] | None = None

    def log(self, message: str, fields: dict[str, Any] | None = None, level: str = "info") -> None:
        """One line on stderr (a log line, a warning): nothing with --quiet, debug lines only with -v."""
        if self.quiet and level != "error":
            return
        if level == "debug" and not (self.verbose or self.debug):
            return
        self._line(self.hinted(message), {**(fields or {})}, level)

    def warn(self, message: str, fields: dict[str, Any] | None = None) -> None:
        self.log(message, fields, "warning")

    def error(self, message: str, exit_code: int, kind: str = "error", traceback: str | None = None) -> None:
        """The one error line (never silenced), and the JSON error object on stdout with --format json;
        a traceback (``--debug``, an internal error) is a field of the JSON log line."""
        message = self.hinted(message)
        fields: dict[str, Any] = {"exit_code": int(exit_code)}
        if traceback and self.log_format == "json":
            fields["traceback"] = traceback
        self._line(message, fields, "error", prefix=f"bloomctl: {kind}: ")
        if self.output_format == "json":
            click.echo(json.dumps({"error": {"message": message, "exit_code": int(exit_code), "kind": kind}}))

    def hinted(self, message: str) -> str:
        """The message with its `` `bloomctl ...` `` commands on the server in use."""
        if self.hints is None or "`bloomctl " not in message:
            return message
        return self.hints().rewrite(message)

    def _line(self, message: str, fields: dict[str, Any], level: str, prefix: str = "") -> None:
        if self.log_format == "json":
            record = {"time": timestamp(), "level": level, "message": message, **fields}
            click.echo(json.dumps(record, default=str), err=True)
        elif prefix:
            click.echo(f"{prefix}{message}", err=True)
        else:
            label = "" if level == "info" else f"{level}: "
            click.echo(f"{timestamp()} {label}{message}", err=True)


def timestamp() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def no_color() -> bool:
    """NO_COLOR (https://no-color.org), set to anything: no colour and no bold either."""
    return bool(os.environ.get("NO_COLOR"))


_DEFAULT = Output()


def current() -> Output:
    """The running command's Output (the defaults outside a command: the library's own use)."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        output = getattr(ctx.obj, "output", None)
        if isinstance(output, Output):
            return output
        ctx = ctx.parent
    return _DEFAULT


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()
