"""The ``bloomctl`` command line: global options, the command tree, and the one place errors become exit codes."""

from __future__ import annotations

import atexit
import contextlib
import io
import itertools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import click

from bloomctl import __version__
from bloomctl.cli.context import AppContext
from bloomctl.cli.options import Number
from bloomctl.cli.output import Output
from bloomctl.cli.render import to_flags
from bloomctl.defaults import (
    CONFIG_ENV,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    DEFAULT_URL,
    MAX_TIMEOUT,
    PASSWORD_ENV,
    URL_ENV,
)
from bloomctl.errors import BloomctlError, ExitCode, Terminated, classify

# Help is --help only: -h is the host everywhere, as in redis-cli (`bloomctl -h` alone is help: it runs nothing).
CONTEXT_SETTINGS = {"help_option_names": ["--help"], "max_content_width": 100}


def _output(ctx: click.Context | None) -> Output:
    """The command's Output (log format, --format), or the defaults before one exists."""
    while ctx is not None:
        if isinstance(ctx.obj, AppContext):
            return ctx.obj.output
        ctx = ctx.parent
    return Output()


def _asks_for_json(args: list[str]) -> bool:
    """Whether the command line asks for ``--format json`` (read raw, for errors found before it)."""
    return "--format=json" in args or any(a == "--format" and b == "json" for a, b in itertools.pairwise(args))


def _raw_output(ctx: click.Context | None, args: list[str]) -> Output:
    """The command's Output; for an error found before the options were read, the log and output
    formats the raw command line asks for (``--log-format json``, ``--format json``)."""
    output = _output(ctx)
    if _asks_for_json(args):
        output.output_format = "json"
    if "--log-format=json" in args or any(a == "--log-format" and b == "json" for a, b in itertools.pairwise(args)):
        output.log_format = "json"
    return output


def _suggestion(ctx: click.Context, exc: BloomctlError) -> str:
    """For a filter name that does not exist: '; did you mean ...?' (a bounded look, best effort)."""
    key = getattr(exc, "filter_key", None)
    app = ctx.find_object(AppContext)
    if key is None or app is None:
        return ""
    from bloomctl.lifecycle.suggest import did_you_mean

    return did_you_mean(app.client, key)


def _fail(code: int, message: str, ctx: click.Context | None = None, kind: str = "error") -> NoReturn:
    output = _output(ctx or click.get_current_context(silent=True))
    trace = None
    if output.debug and sys.exc_info()[0] is not None:
        import traceback

        trace = traceback.format_exc()
        if output.log_format != "json":  # in JSON logs, a field of the error line
            print(trace, end="", file=sys.stderr)
    output.error(message, code, kind, traceback=trace)
    raise click.exceptions.Exit(code)


def _lock_note() -> str:
    """'; the filter's lock is released' when this run took one (an `info` holds none), and what
    it had already changed for good ('; the swap of 'users' completed and stands')."""
    lock = sys.modules.get("bloomctl.lifecycle.lock")  # not loaded: no lock was taken
    if lock is None:
        return ""
    done = "".join(f"; {what} and stands" for what in lock.DONE)
    return done + ("; the filter's lock is released" if lock.TAKEN[0] else "")


def _signal_line(exc: BaseException | None) -> str:
    return "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"


class BloomctlGroup(click.Group):
    def invoke(self, ctx: click.Context) -> object:  # the command's return value, which only Click reads
        try:
            return super().invoke(ctx)
        except BloomctlError as exc:
            _fail(classify(exc).exit_code, exc.render(to_flags) + _suggestion(ctx, exc), ctx)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM raised as Terminated
            _fail(classify(exc).exit_code, _signal_line(exc) + _lock_note(), ctx)
        except Exception as exc:
            failure = classify(exc)
            if not failure.redis_error:
                raise
            from bloomctl.server.connection import connection_error

            app = ctx.find_object(AppContext)
            settings = (app.in_use or app.settings) if app is not None else None
            if settings is None:
                _fail(failure.exit_code, f"{type(exc).__name__}: {exc}", ctx)
            _fail(failure.exit_code, connection_error(exc, settings).render(to_flags), ctx)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and not ctx.resilient_parsing:  # `bloomctl` alone: a short usage, not an error
            click.echo(ctx.get_usage())
            click.echo(f"Commands: {', '.join(self.list_commands(ctx))}")
            click.echo("Try 'bloomctl --help' for the options, 'bloomctl COMMAND --help' for a command's.")
            ctx.exit(0)
        return super().parse_args(ctx, args)

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> object:
        """Click's own handling, except that every error is one line: ``bloomctl: error: ...``."""
        if not standalone_mode:
            return super().main(args, prog_name, standalone_mode=False, **extra)
        given = sys.argv[1:] if args is None else list(args)
        if quiet_stdout(self, global_options_first(self, given)):
            return _held_unless_failed(lambda: self._main(args, given, prog_name, **extra))
        return self._main(args, given, prog_name, **extra)

    def _main(self, args: Sequence[str] | None, given: list[str], prog_name: str | None, **extra: Any) -> object:
        process_main = _is_process_main(args)
        dangling = _dangling(self, given)
        if dangling == "-h" and _command_at(self, given[:-1]) is None:
            args = [*given[:-1], "--help"]  # `bloomctl -h` without a command runs nothing: help, as expected
        elif dangling is not None:  # never help, never the command's name taken as its value
            what = "the server's host, as in redis-cli" if dangling == "-h" else "a global option"
            _raw_output(None, given).error(f"{dangling} is {what}: give it a value (help is --help)", ExitCode.USAGE)
            sys.exit(ExitCode.USAGE)
        else:
            args = global_options_first(self, given)
        lock = sys.modules.get("bloomctl.lifecycle.lock")  # (not imported at start-up: a run that locks loads it)
        if lock is not None:
            lock.TAKEN[0] = False  # this invocation's own: what its message after a signal may say
            lock.DONE.clear()
        previous = _catch_signals()
        _open_closed_streams()
        try:
            code = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            _raw_output(exc.ctx, given).error(f"{exc.format_message()}{hint}", ExitCode.USAGE)
            sys.exit(ExitCode.USAGE)
        except click.exceptions.Exit:
            raise
        except click.ClickException as exc:
            _raw_output(None, given).error(exc.format_message(), exc.exit_code)
            sys.exit(exc.exit_code)
        except click.Abort as exc:  # Click's reading of a signal outside the command (closing the client, say)
            cause = exc.__cause__ or exc.__context__
            code = ExitCode.TERMINATED if isinstance(cause, Terminated) else ExitCode.INTERRUPTED
            _raw_output(None, given).error(_signal_line(cause) + _lock_note(), code)
            sys.exit(code)
        except Exception as exc:  # a bug: the traceback for the report, then one line
            import traceback

            output = _raw_output(click.get_current_context(silent=True), given)
            if output.log_format != "json":
                traceback.print_exc(file=sys.stderr)
            message = f"{type(exc).__name__}: {exc} (please report this)"
            output.error(message, ExitCode.INTERNAL, kind="internal error", traceback=traceback.format_exc())
            sys.exit(ExitCode.INTERNAL)
        finally:
            if process_main:  # kept until the process ends: a signal now exits 143/130 with its line
                _finished[0] = True
                atexit.register(_ignore_signals)
            else:
                _restore_signals(previous)
        code = code if isinstance(code, int) else ExitCode.OK
        if _stopping[0] and process_main:
            _exit_now(code)
        sys.exit(code)


DATA_COMMANDS = {("dump",), ("functions", "source"), ("config", "schema")}  # stdout is what they make


def quiet_stdout(group: click.Group, args: list[str]) -> bool:
    """Whether ``--quiet`` holds back stdout: nothing there unless the command fails (cron mails
    every line). Not where a machine format was asked for (`--format json`: the caller reads it)
    nor for a command whose stdout is its product (`dump`, `functions source`, `config schema`)."""
    words = args[: args.index("--")] if "--" in args else args
    index = _command_at(group, args)
    if index is None or "--help" in words:
        return False
    leading = args[:index]  # the global options, where global_options_first put them (not a value like --prefix -q)
    known = _options(group.params)
    if not any(
        w == "--quiet" or (w.startswith("-") and not w.startswith("--") and "q" in _flags(w, known)) for w in leading
    ):
        return False
    for at, word in enumerate(words):
        value = word.split("=", 1)[1] if word.startswith("--format=") else None
        if word == "--format" and at + 1 < len(words):
            value = words[at + 1]
        if value is not None and value not in ("text", "table"):
            return False
    command = group.commands[args[index]]
    sub = args[index + 1] if index + 1 < len(args) else None
    named = (args[index], sub) if isinstance(command, click.Group) else (args[index],)
    return named not in DATA_COMMANDS


def _flags(word: str, options: dict[str, bool]) -> str:
    """The letters of a bundle of short options before any value: `-qhHOST` is q and h."""
    letters = ""
    for letter in word[1:]:
        letters += letter
        if options.get(f"-{letter}"):  # it takes a value: the rest of the word is that value
            break
    return letters


def _held_unless_failed(run: Callable[[], object]) -> NoReturn:
    """Runs ``run`` (which exits) with stdout held: written out only when it exits non-zero."""
    real, held = sys.stdout, io.StringIO()
    sys.stdout = held
    code: str | int | None = 0
    try:
        run()
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.stdout = real
    if code not in (0, None):
        real.write(held.getvalue())
        real.flush()
    sys.exit(code)


def global_options_first(group: click.Group, args: list[str]) -> list[str]:
    """``args`` with the global options given after the command moved before it (`bloomctl info
    users --url URL`, `fill-ratio users -h HOST`), as kubectl and redis-cli take them anywhere.
    An option the command (or one of its subcommands) defines itself stays the command's."""
    known = _options(group.params)
    index = _command_at(group, args)
    if index is None:
        return args
    command = group.commands[args[index]]
    own = _options(_all_params(command))
    moved: list[str] = []
    kept: list[str] = []
    rest = index + 1
    while rest < len(args):
        word = args[rest]
        if word == "--":
            kept += args[rest:]
            break
        taken = _taken(args, rest, own) or 0
        if taken:  # the command's own option (and its value, which may look like an option)
            kept += args[rest : rest + taken]
        elif taken := _taken(args, rest, known):
            moved += args[rest : rest + taken]
        else:
            kept.append(word)
            taken = 1
        rest += taken
    return [*args[:index], *moved, args[index], *kept]


def _command_at(group: click.Group, args: list[str]) -> int | None:
    """Where the command's name stands in ``args`` (after the global options), or None."""
    known = _options(group.params)
    index = 0
    while index < len(args) and args[index].startswith("-") and args[index] != "--":
        taken = _taken(args, index, known)
        if taken == 0:  # an unknown option before the command: Click says so
            return None
        index += taken
    if index >= len(args) or args[index] not in group.commands:
        return None
    return index


def _dangling(group: click.Group, args: list[str]) -> str | None:
    """A global option that takes a value, last on the line without one (`info users -h`): its
    name; None otherwise (after `--` every word is an argument)."""
    if not args or "--" in args or (args[-1].startswith("--") and "=" in args[-1]):
        return None
    last = args[-1]
    index = _command_at(group, args[:-1])
    if index is not None:
        own = _options(_all_params(group.commands[args[index]]))
        if last in own:
            return None
    return last if _options(group.params).get(last) is True else None


def _all_params(command: click.Command) -> list[click.Parameter]:
    params = list(command.params)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            params += _all_params(sub)
    return params


def _options(params: list[click.Parameter]) -> dict[str, bool]:
    """Each option's names, and whether it takes a value."""
    names: dict[str, bool] = {}
    for param in params:
        if isinstance(param, click.Option):
            takes = not (param.is_flag or param.count)
            for name in (*param.opts, *param.secondary_opts):
                names[name] = takes
    return names


def _taken(args: list[str], at: int, options: dict[str, bool]) -> int:
    """How many words the option at ``args[at]`` takes (itself and its value), or 0 when it is
    none of ``options``: ``--url=U``, ``--url U``, ``-hHOST``, ``-h HOST``, ``--quiet``."""
    word = args[at]
    if not word.startswith("-") or word == "-":
        return 0
    name = word.split("=", 1)[0] if word.startswith("--") else word
    if name in options:
        return 2 if options[name] and "=" not in word and at + 1 < len(args) else 1
    if word.startswith("--"):
        return 0
    for index, letter in enumerate(word[1:], start=1):  # bundled short flags: -vv, -qv, -qhHOST
        takes = options.get(f"-{letter}")
        if takes is None:
            return 0
        if takes:  # the rest of the word is its value, else the next word
            return 1 if index + 1 < len(word) else (2 if at + 1 < len(args) else 1)
    return 1


def _is_process_main(args: Sequence[str] | None) -> bool:
    """Whether this is the process's own command line (not a caller's in-process invocation)."""
    return args is None or list(args) == sys.argv[1:]


def _exit_now(code: int) -> NoReturn:
    """After a signal, once the cleanup has run and the error line is out: end the process without
    the interpreter's finalization, during which a reader thread still inside a C extension
    (pyarrow's CSV reader) crashed it now and then (SIGSEGV: exit -11 instead of 130)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _open_closed_streams() -> None:
    """A stream the caller closed (`<&-`, `>&-`) is None in Python: read it as empty, write it to
    nowhere, rather than fail with a traceback on the first use."""
    for name, mode in (("stdin", "r"), ("stdout", "w"), ("stderr", "w")):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, mode, encoding="utf-8"))  # noqa: SIM115 (kept open until exit)


_stopping = [0]  # signals received: the first stops the command, the cleanup runs to its end
_finished = [False]  # the command has run: a signal now only ends the process, with its line


def _on_signal(signum: int, _frame: Any) -> None:
    """SIGINT and SIGTERM: cancel running database queries (they would run on in the server),
    then raise in the main thread, so every cleanup runs (the lock released, an unfinished standby
    marked). A second signal during that cleanup is ignored (a double Ctrl-C left the lock held);
    a third quits at once (the lock then expires by itself)."""
    import signal

    code = ExitCode.TERMINATED if signum == signal.SIGTERM else ExitCode.INTERRUPTED
    if _finished[0]:  # the command has run and said so: end now, saying what stands
        what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
        _raw_output(None, sys.argv[1:]).error(f"{what} after the command had finished" + _lock_note(), code)
        _exit_now(code)
    _stopping[0] += 1
    if _stopping[0] == 2:
        _output(click.get_current_context(silent=True)).warn("stopping: releasing the lock (once more to quit at once)")
        return
    if _stopping[0] > 2:
        os._exit(code)
    base = sys.modules.get("bloomctl.sources.base")
    if base is not None:
        base.cancel_running()
    if signum == signal.SIGTERM:
        raise Terminated()
    raise KeyboardInterrupt()


def _ignore_signals() -> None:
    """An exit handler, registered once the command has run (so it runs before the others): past
    the exit handlers the interpreter puts back the default handlers, under which a signal would
    kill the process with no line (exit -15). The command has run and said so: a signal now
    changes nothing, and is ignored."""
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def _catch_signals() -> dict[int, Any]:
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    _stopping[0] = 0
    _finished[0] = False
    return {signum: signal.signal(signum, _on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}


def _restore_signals(previous: dict[int, Any]) -> None:
    """Put back the caller's handlers; not once a signal came (the process is exiting on it: a
    second one must not kill it half-way through its exit, and change its exit code)."""
    import signal

    if _stopping[0]:  # ignored from here to the exit (Python's own shutdown would restore the defaults)
        for signum in previous:
            signal.signal(signum, signal.SIG_IGN)
        return
    for signum, handler in previous.items():
        signal.signal(signum, handler)


@click.group(cls=BloomctlGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "-V", "--version", prog_name="bloomctl")
@click.option(
    "--url",
    "-u",
    metavar="URL",
    help=f"redis://[user:pass@]host:port/db, rediss:// (TLS), unix:///path, or just host:port. "
    f"[env: {URL_ENV}; default: {DEFAULT_URL}]",
)
@click.option("--host", "-h", metavar="HOST", help="The server's host, replacing the URL's (like redis-cli -h).")
@click.option(
    "--port", "-p", type=click.IntRange(1, 65535), help="The server's port, replacing the URL's (like redis-cli -p)."
)
@click.option(
    "--cluster/--no-cluster", default=None, help="Talk to a Redis Cluster (default: detected from the server)."
)
@click.option(
    "--password-file",
    type=click.Path(dir_okay=False),
    help=f"Read the password from this file (when the URL has none). [env: {PASSWORD_ENV} holds the password itself]",
)
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False), help="CA certificate for rediss://.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="Client certificate for rediss://.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="Client key for rediss://.")
@click.option(
    "--connect-timeout",
    type=Number(min=0, min_open=True, max=MAX_TIMEOUT),
    default=DEFAULT_CONNECT_TIMEOUT,
    show_default=True,
    help="Seconds to wait for a connection.",
)
@click.option(
    "--timeout",
    type=Number(min=0, min_open=True, max=MAX_TIMEOUT),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds to wait for a reply.",
)
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="Nothing on stdout unless the command fails, no log lines or warnings on stderr (errors still print); "
    "a --format json asked for, and dump's stdout, still print. For cron.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="stderr lines: text with a UTC timestamp, or one JSON object each (errors included); with json, "
    "the command's result is one JSON line on stdout too (unless --format says otherwise).",
)
@click.option("--verbose", "-v", count=True, help="More log lines (the steps' details).")
@click.option("--debug", is_flag=True, help="Also print the Python traceback of an error.")
@click.option(
    "--config",
    metavar="PATH",
    envvar=CONFIG_ENV,
    help=f"The application's filters (bloomctl.toml: docs/config.md) for check, apply, exporter and rebuild NAME "
    f"[env: {CONFIG_ENV}; default: ./bloomctl.toml when it exists].",
)
@click.pass_context
def main(
    ctx: click.Context,
    quiet: bool,
    log_format: str,
    verbose: int,
    debug: bool,
    config: str | None,
    **connection: Any,
) -> None:
    """Run the lifecycle of Bloom filters kept in Redis: plan, reserve, inspect, check and swap.

    \b
    Exit codes: 0 ok, 1 check failed, 2 usage, 3 connection/server, 4 unsupported server,
    5 state conflict (or a "no" at a prompt), 6 lock held, 7 verification failed, 8 source error,
    9 an optional dependency missing (the line names the extra), 70 internal error,
    130 interrupted, 143 terminated (SIGTERM).
    """
    given = {  # on the command line itself: these win over a config file's profiles
        name: connection[name]
        for name in (
            "url",
            "host",
            "port",
            "password_file",
            "cluster",
            "tls_ca",
            "tls_cert",
            "tls_key",
            "connect_timeout",
            "timeout",
        )
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
    }
    output = Output(quiet=quiet, log_format=log_format, verbose=verbose, debug=debug)
    app = AppContext(output, config=config, overrides=given, **connection)
    app.config_given = ctx.get_parameter_source("config") == click.core.ParameterSource.COMMANDLINE
    output.hints = app.hints
    ctx.obj = app
    ctx.call_on_close(app.close)


from bloomctl.cli import (  # noqa: E402  (commands register on `main`)
    apply,
    check,
    config,
    cutover,
    doctor,
    exporter,
    fill,
    filters,
    functions,
    plan,
    rebuild,
    transfer,
    window,
)

main.add_command(plan.plan_command)
main.add_command(filters.reserve_command)
main.add_command(filters.info_command)
main.add_command(fill.fill_ratio_command)
main.add_command(cutover.swap_command)
main.add_command(cutover.rollback_command)
main.add_command(rebuild.rebuild_command)
main.add_command(functions.functions_group)
main.add_command(transfer.dump_command)
main.add_command(transfer.restore_command)
main.add_command(transfer.copy_command)
main.add_command(window.window_group)
main.add_command(doctor.doctor_command)
main.add_command(config.config_group)
main.add_command(check.check_command)
main.add_command(apply.apply_command)
main.add_command(exporter.exporter_command)
