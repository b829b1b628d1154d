"""Where a CSV file can be cut into byte ranges that jobs read apart (``rebuild --jobs``).

A cut is where a read of the whole file starts a record: after a line end outside quoted fields
(an even count of quotes before it), with every byte before it strict CSV and decodable, and not
before a UTF-8 signature. The scan runs in the native kernel (``csv_cuts``), 64 bytes at a time,
with numpy as its reference and fallback.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any, NamedTuple

from bloomctl.native import native

SCAN_CHUNK = 1 << 24  # bytes the numpy scan for cuts looks at in one go
QUOTE = ord('"')


class Scan(NamedTuple):
    """What a scan for cuts found (``csv_cuts`` in the native kernel, or ``scan_cuts_numpy``)."""

    cuts: list[int]  # for each target reached, the first cut at or after it
    lines: list[int]  # the line breaks before each cut
    problem: int  # where a quote strict CSV refuses (or ``stop``) ended the scan early; -1: it did not
    safe: int  # with a problem: the last cut before it (0: none)
    safe_lines: int
    non_ascii: int  # the first byte >= 0x80 before the last cut (or the problem, or the end); -1: none


def cut_ranges(data: Any, delimiter: int, parts: int, codec: str) -> list[tuple[int, int, int]]:
    """``parts`` byte ranges of a CSV file's bytes (a buffer), of about equal sizes: each
    ``(start, end, line breaks before start)``. Every cut is where a read of the whole file starts
    a record, and whose line it is on: after a line end outside quoted fields, with every byte
    before it strict CSV (a quote strict CSV refuses, or a byte ``codec`` cannot decode, can
    shift the csv module's records from the quotes' count) and not before a UTF-8 signature. Past
    such a byte no cut is made: the part before it reads the rest, the parts after it nothing."""
    size = len(data)
    targets = [size * i // parts for i in range(1, parts)]
    scan = scan_cuts(data, delimiter, targets, size)
    end = max([0, *scan.cuts, scan.safe])
    if 0 <= scan.non_ascii < end:
        undecodable = first_undecodable(data, codec, scan.non_ascii, end)
        if undecodable is not None:
            scan = scan_cuts(data, delimiter, targets, undecodable)
    starts = [(0, 0), *zip(scan.cuts, scan.lines, strict=True)]
    if len(starts) < parts and scan.problem >= 0 and scan.safe > starts[-1][0]:
        starts.append((scan.safe, scan.safe_lines))
    while len(starts) < parts:
        starts.append((size, starts[-1][1]))  # nothing left for this part
    ends = [start for start, _lines in starts[1:]] + [size]
    return [(start, end, lines) for (start, lines), end in zip(starts, ends, strict=True)]


def scan_cuts(data: Any, delimiter: int, targets: Sequence[int], stop: int) -> Scan:
    """For each target offset (ascending) the first cut at or after it, within the bytes before
    the first problem (see ``Scan``), by the native kernel or else numpy."""
    kernel = native()
    if kernel is not None:
        return Scan(*kernel.csv_cuts(data, delimiter, list(targets), stop))
    return scan_cuts_numpy(data, delimiter, targets, stop)


def scan_cuts_numpy(data: Any, delimiter: int, targets: Sequence[int], stop: int) -> Scan:
    """``scan_cuts`` with numpy (the kernel's reference), ``SCAN_CHUNK`` bytes at a time."""
    import numpy as np

    from bloomctl.sources.arrow_csv import quote_faults

    array = np.frombuffer(data, dtype=np.uint8)
    size = int(array.size)
    cuts: list[int] = []
    cut_lines: list[int] = []
    quotes = lines = safe = safe_lines = 0
    problem = non_ascii = -1
    end = size
    for start in range(0, size, SCAN_CHUNK):
        if len(cuts) == len(targets):
            break
        chunk_end = min(start + SCAN_CHUNK, size)
        chunk = array[start:chunk_end]
        at = np.flatnonzero(chunk == QUOTE) + start
        opening, closing = quote_faults(array, at, quotes, delimiter)
        faults = at[opening | closing]
        limit = int(faults[0]) if faults.size else None
        if start <= stop < chunk_end and (limit is None or stop < limit):
            limit = stop
        newlines = np.flatnonzero(chunk == 10) + start
        allowed = newlines[((quotes + np.searchsorted(at, newlines)) & 1) == 0] + 1
        if limit is not None:
            allowed = allowed[allowed <= limit]
        signed = allowed[allowed + 3 <= size]  # no cut before a UTF-8 signature: pyarrow would drop it
        signed = signed[(array[signed] == 0xEF) & (array[signed + 1] == 0xBB) & (array[signed + 2] == 0xBF)]
        allowed = np.setdiff1d(allowed, signed, assume_unique=True)
        returns = np.flatnonzero(chunk == 13) + start
        lone = returns[(returns + 1 == size) | (array[np.minimum(returns + 1, size - 1)] != 10)]
        breaks = np.sort(np.concatenate([newlines, lone]))
        while len(cuts) < len(targets) and targets[len(cuts)] <= chunk_end:
            first = int(np.searchsorted(allowed, targets[len(cuts)]))
            if first == allowed.size:
                break
            cuts.append(int(allowed[first]))
            cut_lines.append(lines + int(np.searchsorted(breaks, cuts[-1])))
        if allowed.size:
            safe = int(allowed[-1])
            safe_lines = lines + int(np.searchsorted(breaks, safe))
        high = np.flatnonzero(chunk >= 0x80)
        if high.size and non_ascii < 0:
            non_ascii = start + int(high[0])
        if len(cuts) == len(targets):
            end = cuts[-1] if cuts else 0
            break
        if limit is not None:
            problem = end = limit
            break
        lines += int(breaks.size)
        quotes += int(at.size)
    if not targets:
        end = 0
    if non_ascii >= end:
        non_ascii = -1
    if problem < 0:
        safe = safe_lines = 0
    return Scan(cuts, cut_lines, problem, safe, safe_lines, non_ascii)


def first_undecodable(data: Any, codec: str, start: int, end: int) -> int | None:
    """The first offset in ``[start, end)`` from which ``codec`` cannot decode (at or before the
    byte at fault), or None: the bytes before ``start`` are ASCII."""
    decoder = codecs.getincrementaldecoder("utf-8" if codec == "utf-8-sig" else codec)()
    at = start
    while at < end:
        piece = data[at : min(at + SCAN_CHUNK, end)]
        pending = len(decoder.getstate()[0])  # bytes of a character the last piece began
        try:
            decoder.decode(piece, final=at + len(piece) >= end)
        except UnicodeDecodeError as exc:
            return max(start, at - pending + exc.start)
        at += len(piece)
    return None
