"""bloomctl's native kernel, where pip built it, and the choice between it and numpy.

``_native.c`` does two hot loops in C, without the GIL: a client build's bits (hash each item and
set its bits in one pass, in the source's order, counting as the server counts) and the strict
CSV check of the raw bytes pyarrow parses (``sources.arrow_csv``). The numpy code of each
(``rebuild.build``'s murmur, bits and positions; ``StrictStream``'s quote check) is the reference
the tests compare the kernel with, and what runs where the kernel is not built (pip installs
bloomctl without it when there is no C compiler). ``BLOOMCTL_KERNEL=numpy`` picks numpy even
where the kernel is built; ``native`` makes a missing kernel an error instead of a quiet fallback.

``python -m bloomctl.native`` prints which one this installation uses.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from bloomctl.errors import UsageError

KERNEL_ENV = "BLOOMCTL_KERNEL"
CHOICES = ("auto", "native", "numpy")


def native() -> ModuleType | None:
    """The native kernel, or None when numpy does the work (not built here, or not wanted)."""
    wanted = os.environ.get(KERNEL_ENV, "auto").strip().lower() or "auto"
    if wanted not in CHOICES:
        raise UsageError("%s must be one of %s, got %r", KERNEL_ENV, ", ".join(CHOICES), wanted)
    if wanted == "numpy":
        return None
    try:
        return importlib.import_module("bloomctl._native")
    except ImportError:
        if wanted == "native":
            raise UsageError(
                "%s=native, but this installation has no native kernel (pip built it without a C compiler: "
                "install gcc and reinstall bloomctl, or unset %s to use numpy)",
                KERNEL_ENV,
                KERNEL_ENV,
            ) from None
        return None


def name() -> str:
    """``native`` or ``numpy``: what does the work here."""
    return "native" if native() is not None else "numpy"


if __name__ == "__main__":
    print(name())
