"""``bloomctl functions``: install and check the server-side library of the bitmap backend."""

from __future__ import annotations

from typing import Any

import click

from bloomctl.cli.context import AppContext
from bloomctl.cli.options import format_option
from bloomctl.cli.output import current
from bloomctl.cli.render import emit_json
from bloomctl.errors import ExitCode, UnsupportedServer


@click.group("functions")
def functions_group() -> None:
    """The bitmap backend's server-side library (Redis Functions on Redis 7+, EVALSHA before).

    \b
    Examples:
      bloomctl functions install
      bloomctl functions status
      bloomctl functions source > bloomctl.lua && redis-cli FUNCTION LOAD REPLACE "$(cat bloomctl.lua)"
    """


def _status(app: AppContext) -> dict[str, Any]:
    from bloomctl.backends.bitmap import Bitmap

    return Bitmap().library_status(app.client)


def _print_status(status: dict[str, Any]) -> None:
    if status["mode"] != "functions":
        click.echo("mode script: this server has no Redis Functions; bloomctl loads its Lua with SCRIPT LOAD/EVALSHA")
        return
    for node in status["nodes"]:
        version = "-" if node["version"] is None else node["version"]
        click.echo(
            f"{node['node']} library bloomctl version {version} ({node['state']}, expected {status['expected_version']})"
        )


@functions_group.command("install")
@click.option("--force", is_flag=True, help="Replace even a newer library (from a newer bloomctl).")
@click.option("--dry-run", is_flag=True, help="Say what would be loaded on which primary; load nothing.")
@format_option("text", "json")
@click.pass_obj
def install_command(app: AppContext, force: bool, dry_run: bool, output_format: str) -> None:
    """Load (or replace) the library on every primary. Idempotent; never downgrades without --force.

    \b
    Examples:
      bloomctl functions install
      bloomctl functions install --dry-run
    """
    from bloomctl.backends.bitmap import Bitmap

    if dry_run:
        status = _status(app)
        newer = [n["node"] for n in status["nodes"] if n["state"] == "newer"]
        if newer and not force:
            raise UnsupportedServer(
                "a newer bloomctl installed the library on %s: a real install refuses it (upgrade bloomctl, or --force)",
                ", ".join(newer),
            )
        status["dry_run"] = True
        status["would_load"] = [n["node"] for n in status["nodes"] if n["state"] != "current"]
        if output_format == "json":
            emit_json(status)
            return
        _print_status(status)
        if status["mode"] != "functions":
            click.echo("dry run: nothing to install in script mode (loaded when needed); nothing changed")
        elif status["would_load"]:
            targets = ", ".join(status["would_load"])
            click.echo(f"dry run: would load version {status['expected_version']} on {targets}; nothing changed")
        else:
            click.echo("dry run: every primary has the current library; nothing to do")
        return
    Bitmap().install(app.client, force=force)
    status = _status(app)
    emit_json(status) if output_format == "json" else _print_status(status)


@functions_group.command("status")
@format_option("text", "json")
@click.pass_obj
def status_command(app: AppContext, output_format: str) -> None:
    """Show the library version on every primary; exit 1 when one is missing, outdated or newer.

    \b
    Example:
      bloomctl functions status --format json
    """
    status = _status(app)
    emit_json(status) if output_format == "json" else _print_status(status)
    if not status["ok"]:
        current().warn("the function library is not the current version on every node")
        raise click.exceptions.Exit(ExitCode.CHECK_FAILED)


@functions_group.command("source")
@click.option("--script", is_flag=True, help="The EVAL form (for servers without Functions) instead of the library.")
def source_command(script: bool) -> None:
    """Print the Lua source, for loading it with another tool or reading the hash scheme.

    \b
    Example:
      bloomctl functions source | redis-cli -x FUNCTION LOAD REPLACE
    """
    from bloomctl.backends.bitmap import functions_source, script_source

    click.echo(script_source() if script else functions_source(), nl=False)
