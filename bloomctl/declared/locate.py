"""Where each key of a TOML file is: the line of every table header and ``key =``, so that a
problem found in the parsed data names its line (``tomllib`` keeps no positions).
"""

from __future__ import annotations

import re

_KEY = re.compile(r"""\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")
_TABLE = re.compile(
    r"""\s*\[\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*\]"""
)


def _parts(dotted: str) -> tuple[str, ...]:
    parts = re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", dotted)
    return tuple(p[1:-1] if p[:1] in "\"'" else p for p in parts)


def _code_lines(text: str) -> list[tuple[int, str]]:
    """Each line that starts outside a multi-line string, with its comments and the bodies of its
    multi-line strings left out (escapes, quotes inside strings and ``#`` in them understood)."""
    lines: list[tuple[int, str]] = []
    state: str | None = None  # None, or the string being read: ", ', \"\"\" or \'\'\'
    code: list[str] = []
    number, starts_free, i, n = 1, True, 0, len(text)
    while i < n:
        char = text[i]
        if char == "\n":
            if state in ('"', "'"):
                state = None  # an unterminated string; tomllib has refused such a file already
            if starts_free:
                lines.append((number, "".join(code)))
            number, starts_free, i = number + 1, state is None, i + 1
            code = []
            continue
        if state is None:
            if char == "#":
                end = text.find("\n", i)
                i = n if end == -1 else end
                continue
            if text.startswith('"""', i) or text.startswith("'''", i):
                state, i = text[i : i + 3], i + 3
                code.append("''")
                continue
            if char in "\"'":
                state = char
        elif state == '"':
            if char == "\\":
                code.append(text[i : i + 2])
                i += 2
                continue
            if char == '"':
                state = None
        elif state == "'":
            if char == "'":
                state = None
        else:  # a multi-line string: its body is skipped
            if state == '"""' and char == "\\" and text[i + 1 : i + 2] != "\n":
                i += 2
                continue
            if text.startswith(state, i):
                while text.startswith(state[0], i):  # up to two quotes may end the body: \"\"\"\"\"
                    i += 1
                state = None
                continue
            i += 1
            continue
        code.append(char)
        i += 1
    if starts_free and code:
        lines.append((number, "".join(code)))
    return lines


def locate(text: str) -> dict[tuple[str, ...], int]:
    """The line of every table header and ``key =`` of the file (dotted keys resolved)."""
    where: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, line in _code_lines(text):
        header = _TABLE.match(line.replace("[[", "[").replace("]]", "]"))
        if header:
            table = _parts(header.group(1))
            for depth in range(1, len(table) + 1):  # [filters.e.source] declares filters.e here too
                where.setdefault(table[:depth], number)
            continue
        key = _KEY.match(line)
        if key:
            path = (*table, *_parts(key.group(1)))
            for depth in range(len(table) + 1, len(path) + 1):
                where.setdefault(path[:depth], number)
    return where


def line_of(where: dict[tuple[str, ...], int], path: tuple[str, ...]) -> int | None:
    """The line of ``path``, else of the nearest table above it that the file names."""
    for depth in range(len(path), 0, -1):
        if path[:depth] in where:
            return where[path[:depth]]
    return None
