"""``bloomctl dump``, ``restore`` and ``copy``: filters that move between servers (docs/dump-format.md)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import click

from bloomctl.cli.confirm import confirmer
from bloomctl.cli.context import AppContext
from bloomctl.cli.options import F, format_option, swap_guard_options, yes_option
from bloomctl.cli.output import current
from bloomctl.cli.render import emit_json
from bloomctl.errors import SourceError, UsageError, is_redis_error

TO_PASSWORD_ENV = "BLOOMCTL_TO_PASSWORD"


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()


def stdin_is_tty() -> bool:
    return sys.stdin.isatty()


def _log(message: str, fields: dict[str, Any]) -> None:
    current().log(message, fields)


@click.command("dump")
@click.argument("key")
@click.option(
    "--output",
    "-o",
    "output",
    metavar="FILE",
    default="-",
    show_default=True,
    help="Where to write the dump; - is stdout.",
)
@click.option("--overwrite", is_flag=True, help="Replace FILE when it exists (written aside, then renamed over it).")
@click.pass_obj
def dump_command(app: AppContext, key: str, output: str, overwrite: bool) -> None:
    """Write the filter KEY (one filter, or every shard of a sharded one) to a portable file.

    The file holds the filter's bits as the server stores them (BF.SCANDUMP's chunks, or the
    bitmap backend's string), with a header (backend, parameters, item count, the server it came
    from) and checksums; `bloomctl restore` loads it on any server of the same backend, RedisBloom
    2.x and Redis 8 alike. Memory stays constant however big the filter. A FILE is written aside
    and renamed into place when complete: a failed dump leaves no partial file.

    \b
    Examples:
      bloomctl dump users -o users.bfdump
      bloomctl dump users | gzip > users.bfdump.gz
      bloomctl --url redis://backup-host:6379 dump 'bf:{users}' -o - | bloomctl restore 'bf:{users}' --swap
    """
    from bloomctl.transfer import dump as transfer
    from bloomctl.transfer import dumpfile

    if output == "-" and stdout_is_tty():
        raise UsageError("the dump is binary: give `--output FILE`, or redirect stdout to a file or a pipe")
    target = Path(output)
    if output != "-" and target.exists() and not overwrite:
        raise UsageError("%s exists: pass --overwrite to replace it", output)
    dump = transfer.read_filter(app.client, app.server, key)
    if output == "-":
        stream = sys.stdout.buffer
        try:
            chunks, size = dumpfile.write(stream, dump.header, dump.chunks)
            stream.flush()
        except BrokenPipeError:
            raise UsageError(
                "stdout was closed before the dump was complete (a broken pipe): it is incomplete"
            ) from None
    else:
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        try:
            with open(partial, "wb") as out:
                chunks, size = dumpfile.write(out, dump.header, dump.chunks)
                out.flush()
                os.fsync(out.fileno())
            os.replace(partial, target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                partial.unlink()
            raise UsageError("cannot write %s: %s", output, exc.strerror or str(exc)) from None
        except BaseException:
            with contextlib.suppress(OSError):
                partial.unlink()
            raise
    header = dump.header
    _log(
        f"dumped {header['key']!r} ({header['backend']}, {header['items']:,} items"
        + (f", {header['shards']} shards" if header["shards"] else "")
        + f", {chunks} chunks, {size:,} bytes) to {'stdout' if output == '-' else output}",
        {"phase": "dump", "items": header["items"], "chunks": chunks, "bytes": size},
    )


def _restore_options(f: F) -> F:
    f = yes_option(f)
    f = click.option(
        "--dry-run",
        is_flag=True,
        help="Read and check the whole dump (every checksum) and the target (keys, lock, memory); write nothing.",
    )(f)
    f = click.option(
        "--force", is_flag=True, help="Restore even if the standby is bigger than the server's free memory."
    )(f)
    f = swap_guard_options(f)
    return click.option(
        "--swap",
        is_flag=True,
        help="Swap the restored standby in (the swap's guards apply; asks first on a terminal, unless --yes).",
    )(f)


def _restore_arguments(guards: dict[str, Any]) -> dict[str, Any]:
    """The options of `_restore_options` as `transfer.restore` takes them."""
    arguments = dict(guards)
    arguments["keep_old_seconds"] = arguments.pop("keep_old")
    yes = arguments.pop("yes")
    arguments["confirm"] = confirmer(yes) if arguments["swap"] and not arguments["dry_run"] else None
    return arguments


def _read_chunks(reader: Any) -> Iterator[Any]:
    yield from reader.chunks()


@click.command("restore")
@click.argument("key")
@click.option(
    "--input", "-i", "input_path", metavar="FILE", default="-", show_default=True, help="The dump; - is stdin."
)
@_restore_options
@format_option("text", "json")
@click.pass_obj
def restore_command(app: AppContext, key: str, input_path: str, output_format: str, **guards: Any) -> None:
    """Load a dump (from `bloomctl dump`) into the standby of KEY; with --swap, swap it in.

    Every chunk's checksum is checked as it arrives and the file's SHA-256 at its end; the loaded
    filter is checked against the dump's header (items, size) before it becomes the standby. A
    corrupt or truncated file, a dump of another backend than KEY's, or a server that cannot load
    it stops the restore with one line: the active filter is never touched. The filter comes back
    as it was when dumped: items added since are not in it (the swap's --min-ratio guard applies);
    a rebuild from the source catches up.

    \b
    Examples:
      bloomctl restore users -i users.bfdump                 # the standby; then `bloomctl swap users`
      bloomctl restore users -i users.bfdump --dry-run       # is the file whole? would it load?
      bloomctl restore users -i users.bfdump --swap --keep-old 7200
      gunzip -c users.bfdump.gz | bloomctl restore users --swap --yes
    """
    from bloomctl.transfer import dumpfile
    from bloomctl.transfer import restore as transfer

    if input_path == "-":
        if stdin_is_tty():
            raise UsageError("give `--input FILE`, or pipe a dump into stdin")
        stream: IO[bytes] = sys.stdin.buffer
        name = "the dump on stdin"
    else:
        try:
            stream = open(input_path, "rb")  # noqa: SIM115  (closed below)
        except OSError as exc:
            raise SourceError("cannot read %s: %s", input_path, exc.strerror or str(exc)) from None
        name = input_path
    try:
        reader = dumpfile.Reader(stream, name)
        report = transfer.restore(
            app.client,
            app.server,
            key,
            reader.header,
            _read_chunks(reader),
            **_restore_arguments(guards),
            events=_log,
        )
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    _show(report, output_format, app.next_step("swap", report.key))


@click.command("copy")
@click.argument("key")
@click.option(
    "--to", "to_url", required=True, metavar="URL", help="The server to copy to (redis://, rediss://, host:port)."
)
@click.option("--to-key", metavar="NAME", help="The filter's name there [default: KEY].")
@click.option(
    "--to-password-file",
    metavar="PATH",
    help=f"The target's password, when its URL carries none (else ${TO_PASSWORD_ENV}).",
)
@_restore_options
@format_option("text", "json")
@click.pass_obj
def copy_command(
    app: AppContext,
    key: str,
    to_url: str,
    to_key: str | None,
    to_password_file: str | None,
    output_format: str,
    **guards: Any,
) -> None:
    """Copy the filter KEY to another server (as --to-key), chunk by chunk, in constant memory.

    The same as `dump` piped into `restore` on the target: the copy lands in the target's standby
    and, with --swap, is swapped in there under the target's guards. The source is only read.

    \b
    Examples:
      bloomctl --url redis://old-host:6379 copy users --to redis://new-host:6379 --swap
      bloomctl copy users --to redis://new-host:6379 --dry-run
      bloomctl copy users --to redis://127.0.0.1:6380 --to-key 'bf:{users}'
    """
    from bloomctl.defaults import PASSWORD_ENV
    from bloomctl.server.capabilities import detect
    from bloomctl.server.connection import connect, connection_error, settings_from
    from bloomctl.transfer import copy as transfer

    settings = settings_from(
        to_url,
        password_file=to_password_file,
        environ={PASSWORD_ENV: os.environ.get(TO_PASSWORD_ENV, "")},
        connect_timeout=app.settings.connect_timeout,
        timeout=app.settings.timeout,
    )
    from bloomctl.cli.hints import server_hints

    dump = transfer.read_filter(app.client, app.server, key)  # the source first: its errors name the source
    target = None
    password_var = TO_PASSWORD_ENV if os.environ.get(TO_PASSWORD_ENV) else None
    # from here every printed `bloomctl ...` is about the target: a swap, a standby to move away
    app.hints_override = server_hints(settings, password_file=to_password_file, password_var=password_var)
    try:
        target = connect(settings, password_env=TO_PASSWORD_ENV, password_option="to_password_file")
        report = transfer.restore(
            target,
            detect(target),
            to_key or key,
            dump.header,
            _source_errors(dump.chunks, app.settings),
            **_restore_arguments(guards),
            events=_log,
        )
    except Exception as exc:
        if not is_redis_error(exc):
            raise
        raise connection_error(
            exc, settings, password_env=TO_PASSWORD_ENV, password_option="to_password_file"
        ) from None
    finally:
        if target is not None:
            target.close()
    _show(report, output_format, app.next_step("swap", report.key), to=settings.redacted_url)


def _source_errors(chunks: Iterator[Any], settings: Any) -> Iterator[Any]:
    """The source's chunks; a redis error while reading them names the source, not the target."""
    from bloomctl.server.connection import connection_error

    try:
        yield from chunks
    except Exception as exc:
        if not is_redis_error(exc):
            raise
        raise connection_error(exc, settings) from None


def _show(report: Any, output_format: str, swap: str, to: str | None = None) -> None:
    """The outcome; ``swap``: the command that swaps the restored standby in, on its server."""
    if output_format == "json":
        emit_json({**report.as_dict(), **({"to": to} if to else {})})
        return
    where = f" on {to}" if to else ""
    if report.dry_run:
        standbys = report.standbys[0] if len(report.standbys) == 1 else f"{len(report.standbys)} shard standbys"
        click.echo(
            f"dry run: the dump of {report.items:,} items ({report.chunks} chunks, {report.bytes:,} bytes) checks out; "
            f"it would be restored into {standbys!r}{where}; nothing written"
        )
        return
    if report.swapped:
        message = f"restored and swapped: {report.key!r}{where} now holds {report.items:,} items"
        if not report.replaced_active:
            message += " (there was no previous filter)"
    else:
        standbys = report.standbys[0] if len(report.standbys) == 1 else f"{len(report.standbys)} shard standbys"
        message = f"restored: {report.items:,} items into {standbys!r}{where}; {swap} swaps it in"
    click.echo(message)
    if report.note:
        current().warn(report.note)
