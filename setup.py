"""bloomctl's native kernel, a C extension (``bloomctl/_native.c``); the rest is in pyproject.toml.

``optional=True``: without a C compiler (or on a big-endian machine, which the kernel is not
written for) pip installs bloomctl all the same, and numpy does the kernel's work, slower, with
the same results. ``python -m bloomctl.native`` says which one an installation has.
"""

import sys

from setuptools import Extension, setup

native = Extension("bloomctl._native", ["bloomctl/_native.c"], extra_compile_args=["-O2", "-std=c99"], optional=True)
setup(ext_modules=[native] if sys.byteorder == "little" else [])
