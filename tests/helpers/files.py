"""Files the tests write (CSV sources of distinct items, any text) and the items a source reads
back from them."""

from __future__ import annotations


def write_csv(path, n: int, start: int = 0, header: str = "user_id") -> str:
    """A one-column CSV of ``user:<i>`` for i in [start, start + n), with a header line."""
    with open(path, "w") as f:
        f.write(header + "\n")
        f.write("".join(f"user:{i}\n" for i in range(start, start + n)))
    return str(path)


def write(path, text: str | bytes) -> str:
    """``text`` (or bytes, as they are) at ``path``; returns the path as a string."""
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(data)
    return str(path)


def read(source, size: int = 3) -> list[bytes]:
    """Every item of one pass over ``source``, read in batches of ``size``."""
    return [item for batch in source.batches(size) for item in batch]
