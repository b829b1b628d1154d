"""``bloomctl apply``: create what bloomctl.toml declares and the server lacks; the plan and its outcome."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from bloomctl.cli.confirm import ask, confirmer
from bloomctl.cli.context import AppContext
from bloomctl.cli.options import Number, format_option, yes_option
from bloomctl.cli.render import emit_json, to_flags
from bloomctl.defaults import MAX_LOCK_WAIT_SECONDS
from bloomctl.errors import BloomctlError, ExitCode

if TYPE_CHECKING:  # pragma: no cover - the library loads when the command runs (start-up time)
    from bloomctl.declared.apply import Applied
    from bloomctl.rebuild import RebuildReport
    from bloomctl.server.capabilities import ServerInfo
    from bloomctl.server.client import RedisClient

SYMBOLS = {"create": "+", "rotate": "+", "drift": "~", "unchanged": "=", "conflict": "!", "invalid": "!", "error": "!"}


@click.command("apply")
@click.argument("names", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Print what would be created; change nothing.")
@click.option(
    "--lock-wait",
    metavar="SECONDS",
    type=Number(min=0, max=MAX_LOCK_WAIT_SECONDS),
    default=600,
    show_default=True,
    help="A filter another run is making (another apply, a rebuild): wait this long for it, once the "
    "others are made, then report it made by that run (or make it, if that run failed); 0 does not wait.",
)
@yes_option
@format_option("text", "json")
@click.pass_obj
def apply_command(
    app: AppContext, names: tuple[str, ...], dry_run: bool, lock_wait: float, yes: bool, output_format: str
) -> None:
    """Create what bloomctl.toml declares and the server lacks (or those NAMES); never delete or resize.

    Prints a plan first: + to create (a filter with a source by its first rebuild, never empty;
    one the application feeds by a reserve; a window by its settings and first buckets), ~ for
    drift (reported with the command that resolves it, usually a rebuild: apply changes no live
    filter), = unchanged, ! a key that holds something else. Then creates, one at a time.
    Asks on a terminal before it creates anything, naming what (unless --yes; never without a
    terminal). Two runs at once make each filter once: a filter another run is making is put off,
    then waited for (--lock-wait) and reported as made by it. Exit 0 when everything missing was
    created, by this run or another (drift alone exits 0: `bloomctl check` is the gate), 5 when a
    key holds something else, 6 when another run still held a filter after --lock-wait, else the
    first failed creation's code.

    \b
    Examples:
      bloomctl apply --dry-run
      bloomctl --config deploy/bloomctl.toml apply --yes
      bloomctl apply dedupe
    """
    from bloomctl.cli.progress import run_one
    from bloomctl.declared import apply
    from bloomctl.declared.rebuild_all import Run

    def build(
        client: RedisClient, server: ServerInfo, key: str, source: dict[str, Any], options: dict[str, Any]
    ) -> RebuildReport:
        return run_one(app, client, server, key, source, options, Run(key))

    def run(dry_run: bool) -> Applied:
        return apply.run(
            app.config,
            app.connect_profile,
            list(names),
            dry_run=dry_run,
            build=build,
            log=app.output.log,
            describe=_failure_message,
            lock_wait=lock_wait,
        )

    if not dry_run and confirmer(yes) is not None:  # on a terminal: the plan first, as terraform shows it
        wanted = [c.decl.name for c in run(True).changes if c.action in ("create", "rotate")]
        if wanted:
            ask(yes, f"Create {len(wanted)} declared filter(s): {', '.join(wanted)}?")
    applied = run(dry_run)
    if output_format == "json":
        emit_json(applied.as_dict())
    else:
        _render_plan(applied)
    code = applied.exit_code
    if code != ExitCode.OK:
        raise click.exceptions.Exit(code)


def _failure_message(exc: BaseException) -> str:
    """A failed creation's error as the command line says it."""
    if isinstance(exc, click.ClickException):
        return exc.format_message()
    if isinstance(exc, BloomctlError):
        return to_flags(str(exc))
    return str(exc)


def _render_plan(applied: Applied) -> None:
    changes, created, dry_run = applied.changes, applied.created, applied.dry_run
    width = max((len(c.decl.name) for c in changes), default=4)
    for change in changes:
        decl = change.decl
        key = f"  (key {decl.key!r})" if decl.key != decl.name else ""
        click.echo(f"{SYMBOLS[change.action]} {decl.name:<{width}}  {change.action}: {change.detail}{key}")
        if change.fix:
            click.echo(f"  {'':<{width}}  resolve: {change.fix}")
        made = created.get(decl.name)
        if made is not None:
            verdict = made.text if made.done else f"FAILED (exit {made.exit_code}): {made.text}"
            click.echo(f"  {'':<{width}}  -> {verdict}")
            if made.held_by:
                click.echo(f"  {'':<{width}}     (another run held it at first: {made.held_by})")
    wanted = sum(c.action in ("create", "rotate") for c in changes)
    drifted = sum(c.action == "drift" for c in changes)
    conflicts = sum(c.action in ("conflict", "invalid", "error") for c in changes)
    if dry_run:
        head = f"dry run: {wanted} to create, nothing changed"
    else:
        done = sum(1 for made in created.values() if made.done)
        elsewhere = sum(1 for made in created.values() if made.elsewhere)
        head = f"{done} of {wanted} created" + (f" ({elsewhere} by another run)" if elsewhere else "")
    click.echo(f"\n{head}; {drifted} drifted (apply changes no live filter); {conflicts} cannot be applied")
