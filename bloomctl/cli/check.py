"""``bloomctl check`` (the CI gate over the declared filters) and ``bloomctl apply`` (create what is missing)."""

from __future__ import annotations

from typing import Any

import click

from bloomctl.cli.context import AppContext
from bloomctl.cli.options import format_option
from bloomctl.cli.output import current
from bloomctl.cli.render import emit_json, to_flags
from bloomctl.errors import ExitCode


@click.command("check")
@click.argument("names", nargs=-1)
@format_option("text", "json", "junit", "github")
@click.option(
    "--output",
    "-o",
    "output_file",
    metavar="FILE",
    help="Write the report to FILE (renamed into place: never half written) instead of stdout; a JUnit "
    "report for the CI to show, say.",
)
@click.option(
    "--no-server-checks", is_flag=True, help="Leave out the server's own checks (persistence, eviction, memory)."
)
@click.pass_obj
def check_command(
    app: AppContext, names: tuple[str, ...], output_format: str, output_file: str | None, no_server_checks: bool
) -> None:
    """Check every filter of bloomctl.toml (or those NAMES) against the server: the CI gate.

    For each filter: it exists; its parameters and item recipe are those declared (drift);
    its fill and false-positive rate are within its own thresholds. For each server: doctor's
    checks (persistence, eviction policy, room to rebuild the largest filter). Every problem is
    reported in one run, each with what resolves it. Exit 0 when all pass (warnings pass too),
    1 when a check fails, 5 when a filter is missing, 3 when a server does not answer.

    \b
    Formats: text; json; junit (one test suite per filter, one test case per check); github
    (::error and ::warning annotations at the declaration's line, for GitHub Actions).

    \b
    Examples:
      bloomctl check
      bloomctl --config deploy/bloomctl.toml check users skus --format json
      bloomctl check --format junit -o reports/bloomctl.xml
      bloomctl check --format github        # in a GitHub Actions step
    """
    from bloomctl.declared.check import render, run

    config = app.config
    if output_file:
        from bloomctl.cli.metrics import check_writable

        check_writable(output_file, "--output")
    report = run(config, app.connect_profile, list(names), server_checks=not no_server_checks)
    text = render(report, output_format)
    if output_file:
        from bloomctl.cli.metrics import write_atomically

        write_atomically(output_file, text, "--output")
    else:
        click.echo(text, nl=False)
    code = report.exit_code
    if code != ExitCode.OK:
        counts = report.counts()
        current().log(
            f"check: {counts['fail']} failed, {counts['error']} error(s), {counts['warn']} warning(s)",
            {"exit_code": int(code)},
            level="error" if code != ExitCode.CHECK_FAILED else "warning",
        )
        raise click.exceptions.Exit(code)


SYMBOLS = {"create": "+", "rotate": "+", "drift": "~", "unchanged": "=", "conflict": "!", "invalid": "!", "error": "!"}


@click.command("apply")
@click.argument("names", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Print what would be created; change nothing.")
@format_option("text", "json")
@click.pass_obj
def apply_command(app: AppContext, names: tuple[str, ...], dry_run: bool, output_format: str) -> None:
    """Create what bloomctl.toml declares and the server lacks (or those NAMES); never delete or resize.

    Prints a plan first: + to create (a filter with a source by its first rebuild, never empty;
    one the application feeds by a reserve; a window by its settings and first buckets), ~ for
    drift (reported with the command that resolves it, usually a rebuild: apply changes no live
    filter), = unchanged, ! a key that holds something else. Then creates, one at a time.
    Exit 0 when everything missing was created (drift alone exits 0: `bloomctl check` is the
    gate), 5 when a key holds something else, else the first failed creation's code.

    \b
    Examples:
      bloomctl apply --dry-run
      bloomctl --config deploy/bloomctl.toml apply
      bloomctl apply dedupe
    """
    from bloomctl.declared.apply import CONFLICT, CREATE, ERROR, INVALID, ROTATE, Change, change_for
    from bloomctl.declared.check import error_code, reason

    config = app.config
    decls = config.select(list(names))
    changes, codes = [], {}
    for decl in decls:
        try:
            client, server = app.connect_profile(decl.profile)
        except Exception as exc:  # this profile's server did not answer: the other filters are still planned
            codes[decl.name] = error_code(exc)
            changes.append(Change(decl, ERROR, f"profile {decl.profile!r}: {reason(exc)}"))
            continue
        try:
            changes.append(change_for(client, server, decl, config.path))
        except Exception as exc:  # (a command refused, say): this filter says why, the others go on
            codes[decl.name] = error_code(exc)
            changes.append(Change(decl, ERROR, reason(exc)))
    outcomes: dict[str, dict[str, Any]] = {}
    if not dry_run:
        for change in changes:
            if change.action in (CREATE, ROTATE):
                outcomes[change.decl.name] = outcome = _carry_out(app, change)
                codes[change.decl.name] = outcome["exit_code"]
    for change in changes:
        if change.action == CONFLICT:
            codes[change.decl.name] = ExitCode.CONFLICT
        elif change.action == INVALID:
            codes[change.decl.name] = ExitCode.USAGE
    # the first problem's code, in the file's order
    code = next((codes[c.decl.name] for c in changes if codes.get(c.decl.name)), ExitCode.OK)
    if output_format == "json":
        emit_json(
            {
                "config": config.path,
                "dry_run": dry_run,
                "changes": [
                    {**c.as_dict(), **({"result": outcomes[c.decl.name]} if c.decl.name in outcomes else {})}
                    for c in changes
                ],
                "exit_code": int(code),
            }
        )
    else:
        _render_plan(changes, outcomes, dry_run)
    if code != ExitCode.OK:
        raise click.exceptions.Exit(code)


def _carry_out(app: AppContext, change: Any) -> dict[str, Any]:
    """Make one missing filter (or window's buckets); its outcome, a failure included (the others go on)."""
    from bloomctl.cli.metrics import exit_code_of
    from bloomctl.declared import apply
    from bloomctl.errors import BloomctlError

    decl = change.decl
    client, server = app.connect_profile(decl.profile)
    current().log(f"apply: {decl.name}: {change.detail}", {"filter": decl.name, "action": change.action})
    try:
        if change.how == apply.RESERVE:
            result = apply.reserve(client, server, decl)
            done = "created" if result.created else "it exists already with these parameters"
        elif change.how == apply.WINDOW:
            report = apply.make_window(client, server, decl)
            made = sum(a.action == "created" for a in report.actions)
            done = f"window ready, {made} bucket(s) made"
        else:
            from bloomctl.cli.rebuild import run_declared

            rebuilt = run_declared(
                app, decl, {"swap": True}
            )  # (its first build: swapped in, whatever rebuild.swap says)
            done = f"built from its source: {rebuilt.source.items:,} items, swapped in"
    except BloomctlError as exc:
        message = to_flags(str(exc))
        current().log(f"apply: {decl.name}: {message}", {"filter": decl.name}, level="error")
        return {"done": False, "error": message, "exit_code": int(exc.exit_code)}
    except click.ClickException as exc:
        current().log(f"apply: {decl.name}: {exc.format_message()}", {"filter": decl.name}, level="error")
        return {"done": False, "error": exc.format_message(), "exit_code": int(exc.exit_code)}
    except Exception as exc:
        if not type(exc).__module__.startswith("redis"):
            raise
        current().log(f"apply: {decl.name}: {exc}", {"filter": decl.name}, level="error")
        return {"done": False, "error": str(exc), "exit_code": exit_code_of(exc)}
    return {"done": True, "message": done, "exit_code": 0}


def _render_plan(changes: list[Any], outcomes: dict[str, dict[str, Any]], dry_run: bool) -> None:
    width = max((len(c.decl.name) for c in changes), default=4)
    for change in changes:
        decl = change.decl
        key = f"  (key {decl.key!r})" if decl.key != decl.name else ""
        click.echo(f"{SYMBOLS[change.action]} {decl.name:<{width}}  {change.action}: {change.detail}{key}")
        if change.fix:
            click.echo(f"  {'':<{width}}  resolve: {change.fix}")
        outcome = outcomes.get(decl.name)
        if outcome is not None:
            verdict = (
                outcome.get("message")
                if outcome["done"]
                else f"FAILED (exit {outcome['exit_code']}): {outcome['error']}"
            )
            click.echo(f"  {'':<{width}}  -> {verdict}")
    wanted = sum(c.action in ("create", "rotate") for c in changes)
    drifted = sum(c.action == "drift" for c in changes)
    conflicts = sum(c.action in ("conflict", "invalid", "error") for c in changes)
    if dry_run:
        head = f"dry run: {wanted} to create, nothing changed"
    else:
        done = sum(1 for o in outcomes.values() if o["done"])
        head = f"{done} of {wanted} created"
    click.echo(f"\n{head}; {drifted} drifted (apply changes no live filter); {conflicts} cannot be applied")
