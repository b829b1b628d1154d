"""Test data written to disk: CSV sources of distinct items."""

from __future__ import annotations


def write_csv(path, n: int, start: int = 0, header: str = "user_id") -> str:
    """A one-column CSV of ``user:<i>`` for i in [start, start + n), with a header line."""
    with open(path, "w") as f:
        f.write(header + "\n")
        f.write("".join(f"user:{i}\n" for i in range(start, start + n)))
    return str(path)
