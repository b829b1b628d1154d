"""Client-side builds: a rebuild computes the filter's bits in the client and uploads them.

The production server then does almost nothing: a few large, bounded writes instead of one hash
per item. Each backend has its module (``redisbloom``: BF.LOADCHUNK of the module's own layout;
``bitmap``: scheme-1 bits ORed into the string); ``client`` runs a build over one filter or the
members of a sharded one, within a memory budget; ``probe`` checks, on the server at hand, that
the client's bits are the server's before any is trusted. numpy is needed (the ``fast`` extra).
"""

from __future__ import annotations

import importlib.util


def available() -> bool:
    """Whether numpy is installed (the client build needs it; the server path does not)."""
    return importlib.util.find_spec("numpy") is not None


def tune_allocator() -> bool:
    """On glibc, keep freed memory for reuse instead of handing it back to the system at once.

    A build makes and drops large numpy temporaries for every batch; with glibc's defaults they
    are mapped and unmapped each time (half a million page faults for 5M items, a third of the
    build's time). This raises the mmap threshold to its 32 MiB maximum and the trim threshold to
    256 MiB, process-wide: the CLI calls it; an application may too. Returns whether it applied.
    """
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 256 << 20))
