"""``bloomctl config validate|schema``: the application's file of filters (docs/config.md)."""

from __future__ import annotations

import json

import click

from bloomctl.cli.context import AppContext
from bloomctl.cli.options import format_option
from bloomctl.cli.render import emit_json
from bloomctl.errors import MissingExtra, UsageError


@click.group("config")
def config_group() -> None:
    """Check bloomctl.toml, the file that declares an application's filters, or print its JSON Schema.

    \b
    Examples:
      bloomctl config validate
      bloomctl --config deploy/bloomctl.toml config validate --format json
      bloomctl config schema > bloomctl.schema.json
    """


@config_group.command("validate")
@click.argument("path", required=False)
@format_option("text", "json")
@click.pass_obj
def validate_command(app: AppContext, path: str | None, output_format: str) -> None:
    """Check the file (PATH, else --config, $BLOOMCTL_CONFIG or ./bloomctl.toml): every problem, each
    with its line, on stdout; exit 2 when there is any. Connects to nothing.

    Unknown keys are refused (with the closest known one), and so are secrets: a profile names a
    password_file or password_env, a SQL source the variable that holds its database URL. A
    filter whose rebuild needs what this machine lacks (its SQL driver, when that variable is
    set; pyarrow for Parquet; numpy for rebuild.build = "client") is a line naming the extra to
    install: exit 9.
    """
    from bloomctl.declared import config
    from bloomctl.declared.declarations import extras_of

    found = config.find(path or app.config_path)
    if found is None:
        raise UsageError(
            "no config file: give PATH or --config, set $%s, or run where bloomctl.toml is", config.CONFIG_ENV
        )
    try:
        loaded = config.load(found)
    except config.ConfigError as exc:
        if output_format == "json":
            problems = [{"line": line, "problem": text} for line, text in exc.problems]
            emit_json({"config": found, "valid": False, "problems": problems})
        else:
            click.echo("\n".join(exc.lines()))
        raise UsageError("%s: %d problem(s)", found, len(exc.problems)) from None
    filters = list(loaded.filters.values())
    missing = {d.name: problem for d in filters if (problem := extras_of(d).missing) is not None}
    if output_format == "json":
        emit_json(
            {
                "config": found,
                "valid": True,
                "profiles": sorted(loaded.profiles),
                "filters": [
                    {
                        "name": d.name,
                        "key": d.key,
                        "type": d.kind,
                        "profile": d.profile,
                        "line": d.line,
                        "missing_extra": _missing_extra(missing.get(d.name)),
                    }
                    for d in filters
                ],
            }
        )
    else:
        click.echo(f"{found}: valid: {len(loaded.profiles)} profile(s), {len(filters)} filter(s)")
        for decl in filters:
            source = next((k for k in ("csv", "parquet", "sql") if k in decl.source), None)
            fed = f"from its {source} source" if source else "fed by the application"
            key = f" (key {decl.key})" if decl.key != decl.name else ""
            click.echo(f"  {decl.name}{key}: {decl.kind}, {fed}, profile {decl.profile}")
        for decl in filters:  # as the file's problems are shown: where, then what
            if decl.name in missing:
                click.echo(f"{found}:{decl.line}: filters.{decl.name}: {missing[decl.name]}")
    if missing:
        raise MissingExtra("%s: %d filter(s) need what is not installed here", found, len(missing))


def _missing_extra(problem: MissingExtra | None) -> dict[str, str | None] | None:
    if problem is None:
        return None
    return {"extra": problem.extra, "message": str(problem), "install": problem.install}


@config_group.command("schema")
def schema_command() -> None:
    """Print the file's JSON Schema (draft 2020-12), for an editor to check bloomctl.toml as you type.

    \b
    Examples:
      bloomctl config schema > bloomctl.schema.json
      # Taplo / Even Better TOML (VS Code): first line of bloomctl.toml
      #:schema ./bloomctl.schema.json
    """
    from bloomctl.declared.schema import json_schema

    click.echo(json.dumps(json_schema(), indent=2))
