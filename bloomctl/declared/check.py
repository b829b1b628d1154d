"""check: every declared filter against the server, for a CI gate or a cron job.

For each filter of bloomctl.toml: does it exist; do its parameters and item recipe match the
declaration (drift); are its fill and false-positive rate within its thresholds; is what its
rebuild needs beyond bloomctl's dependencies installed on this machine (its SQL driver, pyarrow,
numpy); and, once per server, doctor's checks of the server itself (persistence, eviction, room
to rebuild). Every problem is reported in one run: a missing filter, or a server that does not
answer, never hides another filter's results. ``Report.exit_code`` follows the command line's codes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bloomctl.declared.config import Config, Declared
from bloomctl.declared.declarations import (
    drift,
    drift_fix,
    extras_of,
    recipe_drift,
    summarize,
    thresholds,
    window_drift,
)
from bloomctl.declared.fleet import Connect, Fleet, Outcome, reason
from bloomctl.errors import BloomctlError, ExitCode, KeyMissing, StateConflict
from bloomctl.server.capabilities import ServerInfo
from bloomctl.server.client import RedisClient
from bloomctl.sizing.bloom import format_rate

OK, WARN, FAIL, SKIP, ERROR = "ok", "warn", "fail", "skip", "error"
CHECKS = ("exists", "parameters", "recipe", "fill", "fpr")
EXTRAS = "extras"  # a check of this machine, not of the server: only for filters whose rebuild needs one


@dataclass
class Result:
    subject: str  # the filter's name in the file, or "server PROFILE"
    check: str  # exists, parameters, recipe, fill, fpr, extras; persistence, eviction, memory, connect
    status: str  # ok, warn, fail, skip, error
    message: str
    key: str | None = None
    line: int | None = None  # the declaration's line in the file
    fix: str | None = None  # the command (or step) that resolves it
    code: int | None = None  # an error's exit code

    def as_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "check": self.check,
            "status": self.status,
            "message": self.message,
            "key": self.key,
            "line": self.line,
            "fix": self.fix,
        }


@dataclass
class Report:
    config: str
    results: list[Result] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """The first error's code when a check could not run (3: a server did not answer or refused
        a command), else 5 when a filter is missing, else 9 when what a rebuild needs is not
        installed here, else 1 when a check failed (warnings pass), else 0."""
        statuses = {(r.check, r.status) for r in self.results}
        errors = [r for r in self.results if r.status == ERROR]
        if errors:
            return errors[0].code or ExitCode.CONNECTION
        if ("exists", FAIL) in statuses:
            return ExitCode.CONFLICT
        if (EXTRAS, FAIL) in statuses:
            return ExitCode.MISSING_EXTRA
        if any(status == FAIL for _check, status in statuses):
            return ExitCode.CHECK_FAILED
        return ExitCode.OK

    def counts(self) -> dict[str, int]:
        counts = {status: 0 for status in (OK, WARN, FAIL, SKIP, ERROR)}
        for result in self.results:
            counts[result.status] += 1
        return counts

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "results": [r.as_dict() for r in self.results],
            "summary": {**self.counts(), "exit_code": int(self.exit_code)},
        }


def run(config: Config, connect: Connect, names: list[str] | None = None, *, server_checks: bool = True) -> Report:
    """Every check of every (named) declared filter; each server's checks once."""
    report = Report(config.path)
    for turn in Fleet(config.select(names), connect).by_profile():
        if turn.failure is not None:  # the other profiles are still checked
            message = f"cannot reach profile {turn.profile!r}: {reason(turn.failure)}"
            for decl in turn.decls:
                report.results.append(
                    Result(decl.name, "connect", ERROR, message, decl.key, decl.line, code=turn.failure.exit_code)
                )
                report.results += check_extras(decl)  # this machine's, whatever the server
            continue
        keys: list[bytes] = []
        for outcome in turn.each(lambda client, server, decl: check_filter(client, server, config.path, decl)):
            report.results += _results(outcome, turn.profile)
            report.results += check_extras(outcome.decl)
            if outcome.value is not None and outcome.value[1]:
                keys.append(outcome.value[1])
        if server_checks and turn.client is not None and turn.server is not None:
            report.results += check_server(turn.client, turn.server, turn.profile, keys)
    return report


def _results(outcome: Outcome[tuple[list[Result], bytes | None]], profile: str) -> list[Result]:
    """A filter's results; when its checks could not run, the one result that says why."""
    decl, failure = outcome.decl, outcome.failure
    if failure is None:
        return outcome.value[0] if outcome.value is not None else []
    what = "connect" if failure.unreachable else "read"
    message = f"profile {profile!r}: {reason(failure)}" if what == "connect" else reason(failure)
    return [Result(decl.name, what, ERROR, message, decl.key, decl.line, code=failure.exit_code)]


def check_extras(decl: Declared) -> list[Result]:
    """Whether this machine has what the filter's rebuild needs beyond bloomctl's dependencies
    (``extras_of``): one result, or none for a filter whose rebuild needs nothing optional (a CSV
    source, a filter the application feeds)."""
    needs = extras_of(decl)
    if not needs.needed:
        return []
    if needs.missing is not None:
        problem = needs.missing
        return [Result(decl.name, EXTRAS, FAIL, str(problem), decl.key, decl.line, problem.install, problem.exit_code)]
    if needs.unknown is not None:
        return [Result(decl.name, EXTRAS, SKIP, needs.unknown, decl.key, decl.line)]
    return [Result(decl.name, EXTRAS, OK, "what its rebuild needs is installed here", decl.key, decl.line)]


def check_filter(
    client: RedisClient, server: ServerInfo, path: str, decl: Declared
) -> tuple[list[Result], bytes | None]:
    """The checks of one declared filter, and its key when it is there (for the server's memory check)."""
    if decl.kind == "windowed":
        return _check_window(client, path, decl), None
    from bloomctl.lifecycle import front as lifecycle

    def result(check: str, status: str, message: str, fix: str | None = None) -> Result:
        return Result(decl.name, check, status, message, decl.key, decl.line, fix)

    from bloomctl.backends.library import installs_nothing

    try:
        with installs_nothing():  # a check writes nothing: not even the function library
            description = lifecycle.describe(client, decl.key)
        summary = summarize(description)
    except KeyMissing:
        fix = f"bloomctl --config {path} apply"
        skipped = [result(c, SKIP, "the filter is missing") for c in CHECKS[1:]]
        return [result("exists", FAIL, f"{decl.key!r} does not exist", fix), *skipped], None
    except StateConflict as exc:
        skipped = [result(c, SKIP, "the key holds no filter") for c in CHECKS[1:]]
        return [result("exists", FAIL, str(exc), "move that key away, or declare another key"), *skipped], None
    state = summary.state
    members = getattr(description, "shards", None)
    absent = [i for i, member in enumerate(members or ()) if member is None]
    if absent:
        exists = result(
            "exists",
            FAIL,
            f"sharded filter: member(s) {', '.join(map(str, absent))} of {len(members or ())} missing",
            "restore the missing members from a dump, or rebuild it",
        )
    else:
        what = f"sharded {state.kind} filter of {len(members)}" if members else f"{state.kind} filter"
        exists = result("exists", OK, f"{what} ({state.backend}), {state.items:,} items")
    results = [exists]
    results.append(_parameters(decl, path, summary, result))
    results.append(_recipe(decl, path, summary, result))
    results += _thresholds(decl, path, state, result)
    return results, decl.key.encode("utf-8", "surrogateescape")


def _parameters(decl: Declared, path: str, description: Any, result: Callable[..., Result]) -> Result:
    diffs = drift(decl, description)
    if not diffs:
        return result("parameters", OK, "as declared")
    return result("parameters", FAIL, "drift: " + "; ".join(d.describe() for d in diffs), drift_fix(decl, path, diffs))


def _recipe(decl: Declared, path: str, description: Any, result: Callable[..., Result]) -> Result:
    if not decl.source:
        return result("recipe", SKIP, "no source declared")
    if not description.metadata.get("recipe"):
        return result("recipe", SKIP, "the filter records no recipe (not rebuilt by bloomctl yet)")
    diff = recipe_drift(decl, description)
    if diff is None:
        return result("recipe", OK, "its items are built as declared")
    return result(
        "recipe",
        FAIL,
        f"its items are built as {diff.found}, the file says {diff.declared}: lookups built the declared way miss",
        f"bloomctl --config {path} rebuild {decl.name} --allow-recipe-change",
    )


def _larger(decl: Declared, path: str) -> str:
    """What resolves a filter too full: a larger one."""
    if decl.kind == "windowed":
        return f"raise the window's capacity (or min_capacity) in {path}: its next buckets get it"
    if not decl.source:
        return "the application feeds it: reserve a larger filter under a new key and move the application to it"
    if decl.capacity is None:
        return f"bloomctl --config {path} rebuild {decl.name} (capacity auto: the source counted again)"
    return f"raise its capacity in {path}, then `bloomctl --config {path} rebuild {decl.name}`"


def _thresholds(decl: Declared, path: str, state: Any, result: Callable[..., Result]) -> list[Result]:
    from bloomctl.lifecycle.fill import judge

    limits = thresholds(decl)
    judged = judge(decl.key.encode("utf-8", "surrogateescape"), state, limits)
    warn_at, max_at = judged.limits or (limits.warn_at, limits.max_at)
    what = "load" if state.kind == "cuckoo" else "fill"
    fill_reasons = [r for r in judged.reasons if not r.startswith("estimated FPR")]
    over = any("> max" in r for r in fill_reasons)  # (judge's verdict: a cuckoo filter at its full load is over)
    fill_status = FAIL if over else WARN if fill_reasons else OK
    fill = result(
        "fill",
        fill_status,
        "; ".join(fill_reasons) or f"{what} {state.fill_ratio:.1%} (warn {warn_at:.1%}, max {max_at:.1%})",
        _larger(decl, path) if fill_status != OK else None,
    )
    fpr = state.estimated_fpr
    if limits.max_fpr is None:
        return [fill, result("fpr", SKIP if fpr is None else OK, f"estimated {format_rate(fpr)}; no max_fpr declared")]
    over = fpr is not None and fpr > limits.max_fpr
    message = f"estimated {format_rate(fpr)} " + (">" if over else "<=") + f" max {format_rate(limits.max_fpr)}"
    return [fill, result("fpr", FAIL if over else OK, message, _larger(decl, path) if over else None)]


def _check_window(client: RedisClient, path: str, decl: Declared) -> list[Result]:
    from bloomctl import window

    def result(check: str, status: str, message: str, fix: str | None = None) -> Result:
        return Result(decl.name, check, status, message, decl.key, decl.line, fix)

    try:
        info = window.describe(client, decl.key)
    except (KeyMissing, StateConflict) as exc:
        fix = f"bloomctl --config {path} apply" if isinstance(exc, KeyMissing) else "move that key away"
        return [result("exists", FAIL, str(exc), fix), *(result(c, SKIP, "the window is missing") for c in CHECKS[1:])]
    if info.current_missing:
        exists = result(
            "exists", FAIL, "its current bucket is missing: adds fail", f"bloomctl --config {path} rebuild --all --due"
        )
    else:
        exists = result("exists", OK, f"window of {info.spec.kind} filters, {info.as_dict()['items']:,} items")
    diffs = window_drift(decl, info.spec)
    parameters = (
        result("parameters", FAIL, "drift: " + "; ".join(d.describe() for d in diffs), drift_fix(decl, path, diffs))
        if diffs
        else result("parameters", OK, "as declared")
    )
    current = next((b for b in info.buckets if b.role == "current" and b.state is not None), None)
    results = [exists, parameters, result("recipe", SKIP, "a window has no source")]
    # a bucket past its capacity: above any max fill; its lookups' rate above plan, unless it grew a sub-filter
    overfilled = window.overfilled(info)
    status = FAIL if any(window.above_plan(info, b) for b in overfilled) else WARN  # (a grown bucket: within plan)
    message = "; ".join(window.overfill_warning(info, b) for b in overfilled)
    over_fill = result("fill", status, message, _larger(decl, path)) if overfilled else None
    if current is None:
        fill = over_fill or result("fill", SKIP, "no current bucket")
        return [*results, fill, result("fpr", SKIP, "no current bucket")]
    limits = thresholds(decl)
    fill_results = _thresholds(decl, path, current.state, result)
    if over_fill is not None:
        fill_results[0] = over_fill
    if limits.max_fpr is not None:  # a lookup asks every bucket of the window
        over = info.combined_fpr > limits.max_fpr
        fill_results[1] = result(
            "fpr",
            FAIL if over else OK,
            f"a lookup over the window: {format_rate(info.combined_fpr)} "
            + (">" if over else "<=")
            + f" max {format_rate(limits.max_fpr)}",
        )
    return [*results, *fill_results]


def check_server(client: RedisClient, server: ServerInfo, profile: str, keys: list[bytes]) -> list[Result]:
    """doctor's checks of the server (persistence, eviction, memory), as results."""
    from bloomctl.doctor.findings import ERROR as DOCTOR_ERROR
    from bloomctl.doctor.findings import WARNING
    from bloomctl.doctor.report import fitness

    subject = f"server {profile}"
    try:
        findings = fitness(client, server, keys)
    except BloomctlError as exc:
        return [Result(subject, "server", ERROR, str(exc))]
    results = []
    for finding in findings:
        status = FAIL if finding.level == DOCTOR_ERROR else WARN if finding.level == WARNING else OK
        results.append(Result(subject, finding.check, status, finding.message, fix=finding.fix))
    return results


# --- the report in each format ----------------------------------------------------------------------

MARKS = {OK: "ok   ", WARN: "WARN ", FAIL: "FAIL ", SKIP: "skip ", ERROR: "ERROR"}


def to_text(report: Report) -> str:
    """One line a check, grouped by filter (and server); what resolves each problem beneath it."""
    lines: list[str] = []
    subjects = list(dict.fromkeys(r.subject for r in report.results))
    width = max((len(r.check) for r in report.results), default=6)
    for subject in subjects:
        mine = [r for r in report.results if r.subject == subject]
        key = mine[0].key
        lines.append(subject + (f" ({key})" if key and key != subject else ""))
        skipped: dict[str, list[str]] = {}  # why -> the checks skipped for it: one line
        for result in mine:
            if result.status == SKIP:
                skipped.setdefault(result.message, []).append(result.check)
                continue
            lines.append(f"  {MARKS[result.status]} {result.check:<{width}}  {result.message}")
            if result.fix and result.status in (WARN, FAIL, ERROR):
                lines.append(f"        {'':<{width}}  fix: {result.fix}")
        for why, checks in skipped.items():
            lines.append(f"  {MARKS[SKIP]} {', '.join(checks)}: {why}")
    counts = report.counts()
    summary = ", ".join(f"{counts[s]} {s}" for s in (OK, WARN, FAIL, ERROR, SKIP) if counts[s])
    filters = len({r.subject for r in report.results if not r.subject.startswith("server ")})
    lines.append(
        f"\n{filters} filter(s) of {report.config}: {summary or 'nothing checked'} (exit {int(report.exit_code)})"
    )
    return "\n".join(lines) + "\n"


_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml(text: str) -> str:
    """Text XML 1.0 can hold: a control character or a lone surrogate (a key's raw byte) shown as \\xNN."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def to_junit(report: Report, *, timestamp: str | None = None) -> str:
    """JUnit XML: one test suite per filter (and server), one test case per check; a failed check
    is a <failure>, a server that did not answer an <error>, a skipped one <skipped>, and a
    warning passes with its message in <system-out> (JUnit has no warnings)."""
    import xml.etree.ElementTree as ET
    from datetime import UTC, datetime

    moment = timestamp or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    root = ET.Element("testsuites", name="bloomctl check")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for subject in dict.fromkeys(r.subject for r in report.results):
        mine = [r for r in report.results if r.subject == subject]
        counts = {
            "tests": len(mine),
            "failures": sum(r.status == FAIL for r in mine),
            "errors": sum(r.status == ERROR for r in mine),
            "skipped": sum(r.status == SKIP for r in mine),
        }
        for name, value in counts.items():
            totals[name] += value
        attributes = {"name": subject, "timestamp": moment, "time": "0"}
        attributes.update({name: str(value) for name, value in counts.items()})
        suite = ET.SubElement(root, "testsuite", attributes)
        properties = ET.SubElement(suite, "properties")
        ET.SubElement(properties, "property", name="config", value=report.config)
        if mine[0].key:
            ET.SubElement(properties, "property", name="key", value=mine[0].key)
        for result in mine:
            attributes = {"name": result.check, "classname": f"bloomctl.{subject}", "time": "0"}
            attributes["file"] = report.config
            if result.line:
                attributes["line"] = str(result.line)
            case = ET.SubElement(suite, "testcase", attributes)
            detail = result.message + (f"\nfix: {result.fix}" if result.fix else "")
            if result.status == FAIL:
                ET.SubElement(case, "failure", message=result.message, type=result.check).text = detail
            elif result.status == ERROR:
                ET.SubElement(case, "error", message=result.message, type=result.check).text = detail
            elif result.status == SKIP:
                ET.SubElement(case, "skipped", message=result.message)
            elif result.status == WARN:
                ET.SubElement(case, "system-out").text = f"warning: {detail}"
            else:
                ET.SubElement(case, "system-out").text = result.message
    for name, value in totals.items():
        root.set(name, str(value))
    root.set("time", "0")
    for element in root.iter():  # nothing a CI system's parser would refuse
        for attribute, text in list(element.attrib.items()):
            element.set(attribute, _xml(text))
        if element.text:
            element.text = _xml(element.text)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def to_github(report: Report) -> str:
    """GitHub Actions workflow commands: an ``::error`` for each failed check (a server that did not
    answer too), a ``::warning`` for each warning, at the declaration's line of the file; then a
    one-line summary (a ``::notice``)."""
    lines = []
    for result in report.results:
        level = {FAIL: "error", ERROR: "error", WARN: "warning"}.get(result.status)
        if level is None:
            continue
        where = f"file={_escape_property(report.config)}" + (f",line={result.line}" if result.line else "")
        title = _escape_property(f"bloomctl check: {result.subject} {result.check}")
        message = result.message + (f" (fix: {result.fix})" if result.fix else "")
        lines.append(f"::{level} {where},title={title}::{_escape_data(message)}")
    counts = report.counts()
    summary = ", ".join(f"{counts[s]} {s}" for s in (OK, WARN, FAIL, ERROR, SKIP) if counts[s])
    lines.append(f"::notice title=bloomctl check::{_escape_data(summary or 'nothing checked')}")
    return "\n".join(lines) + "\n"


def render(report: Report, output_format: str) -> str:
    import json

    if output_format == "json":
        return json.dumps(report.as_dict(), indent=2) + "\n"
    if output_format == "junit":
        return to_junit(report)
    if output_format == "github":
        return to_github(report)
    return to_text(report)
