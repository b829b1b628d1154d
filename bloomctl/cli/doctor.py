"""``bloomctl doctor``: check the server and the user's rights before trusting filters to them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from bloomctl.cli.context import AppContext
from bloomctl.cli.options import format_option
from bloomctl.cli.render import emit_json
from bloomctl.errors import ExitCode

if TYPE_CHECKING:  # pragma: no cover - the library loads when the command runs (start-up time)
    from bloomctl.doctor.report import Report

MARKS = {"ok": "ok   ", "info": "info ", "warning": "WARN ", "error": "ERROR"}
SECTIONS = (
    ("server", "Server"),
    ("bloom", "Bloom filter commands"),
    ("functions", "Functions library (bitmap backend)"),
    ("keys", "Filters"),
    ("persistence", "Persistence"),
    ("eviction", "Eviction"),
    ("memory", "Memory headroom for a rebuild"),
    ("replication", "Replication"),
    ("cluster", "Cluster"),
    ("acl", "Access"),
)

USERS = (
    ("operator", "operator (every bloomctl command on these filters and windows but `functions install`)"),
    ("application", "application (lookups, adds, a cuckoo filter's deletes, dual writes, a window's adds and lookups)"),
    ("functions", "functions admin (`bloomctl functions install`: once per server, and after each bloomctl upgrade)"),
)


@click.command("doctor")
@click.argument("keys", nargs=-1)
@click.option(
    "--acl-user",
    metavar="NAME",
    help="Check what this user may run instead of the connected one (needs ACL DRYRUN: Redis 7+, an admin).",
)
@format_option("text", "json")
@click.pass_obj
def doctor_command(app: AppContext, keys: tuple[str, ...], acl_user: str | None, output_format: str) -> None:
    """Check the server for Bloom filters: modules, persistence, eviction, memory, replication, Cluster, ACL.

    Exit 1 when any finding is an error (an evicting maxmemory-policy, no room to rebuild the
    largest filter, a missing KEY, a replica cut off from its master, uncovered Cluster slots);
    warnings alone exit 0. A check the user may not run (NOPERM) is a warning naming the
    permission. KEYS are the filters to check (default: what a bounded SCAN finds); the ACL
    lines at the end are limited to their keys. No password is ever printed.

    \b
    Examples:
      bloomctl doctor
      bloomctl doctor users orders --format json | jq .summary
      bloomctl --url redis://admin@db:6379 doctor users --acl-user bloomctl-operator
    """
    from bloomctl.doctor.commands import COMMANDS
    from bloomctl.doctor.report import diagnose

    registered = getattr(click.get_current_context().find_root().command, "commands", {})
    groups = [group for group in COMMANDS if group in registered and group != "plan"]
    report = diagnose(app.client, list(keys), acl_user=acl_user, groups=groups)  # (it detects the server itself)
    if output_format == "json":
        emit_json({"url": app.settings.redacted_url, **report.as_dict()})
    else:
        render_text(report, app.settings.redacted_url)
    if not report.ok:
        raise click.exceptions.Exit(ExitCode.CHECK_FAILED)


def render_text(report: Report, url: str) -> None:
    from bloomctl.doctor.commands import shown

    click.echo(f"bloomctl doctor: {report.server['description']} at {url}")
    for check, title in SECTIONS:
        findings = [f for f in report.findings if f.check == check]
        if not findings:
            continue
        click.echo(f"\n{title}")
        for finding in findings:
            click.echo(f"  {MARKS[finding.level]} {finding.message}")
            if finding.fix and finding.level in ("warning", "error", "info"):
                click.echo(f"        fix: {finding.fix}")
    acl = report.acl
    if acl["groups"] and acl["method"] is not None:
        click.echo(f"\nWhat {acl['user'] or 'the connected user'} may run (on {acl['sample_key']!r}):")
        width = max(len(g["command"]) for g in acl["groups"])
        for group in acl["groups"]:
            missing = ", ".join(sorted({shown(d["command"]) for d in group["denied"]}))
            verdict = "yes" if group["allowed"] else f"no: needs {missing}"
            if not group["needed"]:
                verdict = "not needed here (no bitmap filter)"
            click.echo(f"  {group['command']:<{width}}  {verdict}")
    click.echo("\nLeast-privilege users (no password is shown):")
    for role, title in USERS:
        if role in acl["setuser"]:
            click.echo(f"  {title}:\n    {acl['setuser'][role]}")
            for note in acl["notes"].get(role, []):
                click.echo(f"    note: {note}")
    click.echo(f"  password: {acl['password_note']}")
    errors, warnings = report.errors, report.warnings
    verdict = "fit for Bloom filters" if report.ok else "NOT fit for Bloom filters"
    click.echo(f"\n{errors} error(s), {warnings} warning(s): {verdict}")
