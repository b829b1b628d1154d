"""Next-step commands as the user can paste them: on the server and the config file this run used.

A hint that leaves out the ``--url`` the run was given acts, when followed, on whatever server
$BLOOMCTL_URL or the default names: another one (`copy --to URL` printed `bloomctl swap KEY`,
which swapped on the source). So every printed ``bloomctl ...`` carries the connection and config
options of the server it is about: the command line's, a config profile's, a copy's target. The
URL's password is left out: it comes from where it came (the password file, a variable handed
on as $BLOOMCTL_PASSWORD), or the line says where to give it; and a hint for a server without a
password empties $BLOOMCTL_PASSWORD, which this shell may hold for another server.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bloomctl.defaults import PASSWORD_ENV

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from bloomctl.server.connection import ConnectionSettings

# The connection options a hint repeats, as main() names them, and their flags.
FLAGS = {
    "cluster": ("--cluster", "--no-cluster"),
    "password_file": ("--password-file",),
    "tls_ca": ("--tls-ca",),
    "tls_cert": ("--tls-cert",),
    "tls_key": ("--tls-key",),
}

# "`bloomctl " opening a command in a message (at its start, or after a space or parenthesis: not
# inside a key name), not already followed by a connection or config option
_COMMAND = re.compile(r"(?:(?<=^)|(?<=[\s(]))`bloomctl (?!--url |--config )")


@dataclass(frozen=True)
class Hints:
    """How a printed command reaches one server: its options, the variables put before it, and
    what follows it (where a password left out must be given)."""

    words: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    note: str = ""

    @property
    def prefix(self) -> str:
        """The variables put before the command (``BLOOMCTL_PASSWORD="$VAR" ``)."""
        return "".join(f"{name}={value} " for name, value in self.env.items())

    def command(self, *args: str) -> str:
        """`` `bloomctl ARGS` `` quoted for a POSIX shell, in backticks, and the note after them."""
        return f"`{self.prefix}{shlex.join(['bloomctl', *self.words, *args])}`{self.note}"

    def rewrite(self, text: str) -> str:
        """A message's `` `bloomctl ...` `` commands with this server's options (and the note once)."""
        if not (self.words or self.env) or "`bloomctl " not in text:
            return text
        inserted = shlex.join(self.words) + " " if self.words else ""
        rewritten, count = _COMMAND.subn(f"`{self.prefix}bloomctl {inserted}".replace("\\", "\\\\"), text)
        return rewritten + (self.note if count else "")


def command_line_hints(given: Mapping[str, Any], url: str, config: str | None = None) -> Hints:
    """For the server of the command line: ``--url`` (the resolved URL without its password) when
    a URL, host or port was given there, the other connection options given there, and
    ``--config`` when it was given. The environment is this shell's: nothing to hand on."""
    from bloomctl.server.connection import url_has_secret, url_without_secrets

    words: list[str] = []
    addressed = any(name in given for name in ("url", "host", "port"))
    if addressed:
        words += ["--url", url_without_secrets(url)]
    for name, flags in FLAGS.items():
        value = given.get(name)
        if value is None:
            continue
        if len(flags) == 2:
            words.append(flags[0] if value else flags[1])
        else:
            words += [flags[0], str(value)]
    if config is not None:
        words += ["--config", config]
    return Hints(words, {}, password_note() if addressed and url_has_secret(url) else "")


def server_hints(
    settings: ConnectionSettings, *, password_file: str | None = None, password_var: str | None = None
) -> Hints:
    """For another server than the command line's (a config profile's, a copy's target): ``--url``
    without its password, the cluster and TLS options, and the password where it came from: a
    file (``password_file``, or the profile's), a variable (the profile's ``$VAR``, or
    ``password_var``) handed on as $BLOOMCTL_PASSWORD; with none, $BLOOMCTL_PASSWORD emptied."""
    from bloomctl.server.connection import url_has_secret, url_without_secrets

    words = ["--url", url_without_secrets(settings.url)]
    if settings.cluster is not None:
        words.append("--cluster" if settings.cluster else "--no-cluster")
    for flag, path in (
        ("--tls-ca", settings.tls_ca),
        ("--tls-cert", settings.tls_cert),
        ("--tls-key", settings.tls_key),
    ):
        if path:
            words += [flag, path]
    env: dict[str, str] = {}
    source = settings.password_from or (f"${password_var}" if password_var else None)
    if url_has_secret(settings.url):
        return Hints(words, env, password_note())
    if password_file:
        words += ["--password-file", password_file]
    elif source and source.startswith("$"):
        if source != f"${PASSWORD_ENV}":
            env[PASSWORD_ENV] = f'"{source}"'
    elif source:
        words += ["--password-file", source]
    elif os.environ.get(PASSWORD_ENV):  # this shell's password is another server's: never send it there
        env[PASSWORD_ENV] = ""
    return Hints(words, env)


def password_note() -> str:
    """What follows a command whose URL held a password (left out): where to give it instead."""
    return f" (with the URL's password in ${PASSWORD_ENV})"
