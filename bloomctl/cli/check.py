"""``bloomctl check``: the CI gate over the declared filters."""

from __future__ import annotations

import click

from bloomctl.cli.context import AppContext
from bloomctl.cli.options import format_option
from bloomctl.cli.output import current
from bloomctl.errors import ExitCode

CHECK_FORMATS = ("text", "json", "junit", "github")


@click.command("check")
@click.argument("names", nargs=-1)
@format_option(*CHECK_FORMATS)
@click.option(
    "--output",
    "-o",
    "output_file",
    metavar="FILE",
    help="Write the report to FILE (renamed into place: never half written; missing directories made) "
    "instead of stdout; a JUnit report for the CI to show, say. The format is --format's.",
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
    1 when a check fails, 5 when a filter is missing, 9 when a filter's source needs an optional
    dependency that is not installed (the fix names the extra), 3 when a server does not answer.

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

    output_file = None if output_file == "-" else output_file  # '-': stdout, as fill-ratio's
    if output_file:
        from bloomctl.cli.metrics import check_writable

        check_writable(output_file, "--output", CHECK_FORMATS, make_dirs=True)
    config = app.config
    report = run(config, app.connect_profile, list(names), server_checks=not no_server_checks)
    text = render(report, output_format)
    if output_file:
        from bloomctl.cli.metrics import write_atomically

        write_atomically(output_file, text, "--output")
    else:
        from bloomctl.cli.render import one_line

        click.echo(one_line(text, output_format), nl=False)
    code = report.exit_code
    if code != ExitCode.OK:
        counts = report.counts()
        current().log(
            f"check: {counts['fail']} failed, {counts['error']} error(s), {counts['warn']} warning(s)",
            {"exit_code": int(code)},
            level="error" if code != ExitCode.CHECK_FAILED else "warning",
        )
        raise click.exceptions.Exit(code)
