"""The compatibility table in docs/compatibility.md, from the test runs' matrix reports.

Each run of the suite with BLOOMCTL_TEST_MATRIX_REPORT=FILE writes, per feature row, how many
`matrix` tests passed, failed or were skipped (and why) on the server it ran on. This script turns
those files into the table's cells and either checks the document against them (CI) or writes them
into it (after a local run, e.g. the RedisBloom tier):

    python scripts/matrix.py --check docs/compatibility.md reports/*.json
    python scripts/matrix.py --write docs/compatibility.md reports/master.json

A column is named by what its run's server said it is ("Valkey 9.1.2 + RedisBloom 2.8.2"). Only the
columns of the given reports are checked or written; the others stay as they are: CI checks the
four servers it runs with RedisBloom 2.8.2 from PyPI, and the columns of other RedisBloom builds
come from local runs (DEVELOPERS.md builds the current line, which no package registry has).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BEGIN = "<!-- matrix:begin (scripts/matrix.py writes this table from the test runs; CI checks it) -->"
END = "<!-- matrix:end -->"
FEATURE = "feature"


def cell(counts: dict) -> str:
    """A row's outcome on one server, in words that stay the same from run to run."""
    if counts["failed"]:
        return "FAILED"
    if counts["passed"]:
        return "yes"
    reasons = " ".join(counts.get("reasons") or [])
    if "no TLS support" in reasons:
        return "no: built without TLS"
    if "RedisBloom tier skipped" in reasons:
        return "n/a: no RedisBloom"
    if "needs the current RedisBloom line" in reasons:
        return "n/a: needs RedisBloom 8"
    return "skipped"


def read_table(text: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The table between the markers: its columns (servers) and its rows (feature -> server -> cell)."""
    if BEGIN not in text or END not in text:
        raise SystemExit(f"matrix: the document has no table between {BEGIN!r} and {END!r}")
    body = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip().splitlines()
    lines = [[part.strip() for part in line.strip().strip("|").split("|")] for line in body if line.strip()]
    if not lines:
        return [], {}
    columns = lines[0][1:]
    rows: dict[str, dict[str, str]] = {}
    for parts in lines[2:]:  # after the header and the --- line
        rows[parts[0]] = dict(zip(columns, parts[1:], strict=False))
    return columns, rows


def render(columns: list[str], rows: dict[str, dict[str, str]]) -> str:
    lines = [
        "| " + " | ".join([FEATURE, *columns]) + " |",
        "| " + " | ".join(["---"] * (len(columns) + 1)) + " |",
    ]
    for feature, cells in rows.items():
        lines.append("| " + " | ".join([feature, *(cells.get(column, "") for column in columns)]) + " |")
    return "\n".join(lines)


def load(paths: list[str]) -> dict[str, dict[str, str]]:
    """server -> feature -> cell, from the report files."""
    found: dict[str, dict[str, str]] = {}
    for path in paths:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
        found[report["server"]] = {feature: cell(counts) for feature, counts in report["rows"].items()}
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", metavar="DOC", help="fail if the table disagrees with the reports")
    mode.add_argument("--write", metavar="DOC", help="write the reports' columns into the table")
    parser.add_argument("reports", nargs="+", help="matrix report files (JSON) from test runs")
    args = parser.parse_args(argv)

    doc = Path(args.check or args.write)
    text = doc.read_text(encoding="utf-8")
    columns, rows = read_table(text)
    found = load(args.reports)

    if args.check:
        problems = []
        for server, cells in found.items():
            if server not in columns:
                problems.append(f"no column for {server!r} (run with --write to add it)")
                continue
            for feature, value in cells.items():
                documented = rows.get(feature, {}).get(server)
                if documented != value:
                    problems.append(f"{server} / {feature}: the tests say {value!r}, {doc} says {documented!r}")
            for feature, cells_of_row in rows.items():
                if feature not in cells and cells_of_row.get(server, "") not in ("", "not run"):
                    problems.append(f"{server} / {feature}: {doc} says {cells_of_row[server]!r}, but no test ran it")
        for problem in problems:
            print(f"matrix: {problem}", file=sys.stderr)
        if problems:
            print(f"matrix: {doc} disagrees with the test runs: python scripts/matrix.py --write {doc} REPORTS...")
            return 1
        print(f"matrix: {doc} agrees with {len(found)} test run(s): {', '.join(found)}")
        return 0

    for server, cells in found.items():
        if server not in columns:
            columns.append(server)
        for feature in rows:
            rows[feature][server] = cells.get(feature, "not run")
        for feature, value in cells.items():
            rows.setdefault(feature, {column: "not run" for column in columns})[server] = value
    for cells in rows.values():
        for column in columns:
            cells.setdefault(column, "not run")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    doc.write_text(text[:start] + "\n" + render(columns, rows) + "\n" + text[end:], encoding="utf-8")
    print(f"matrix: wrote {len(found)} column(s) into {doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
