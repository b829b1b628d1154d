"""Moved to ``bloomctl.rebuild.build``; this path stays for code written against it."""

from bloomctl.rebuild.build import available, tune_allocator  # noqa: F401  (the names docs/python-api.md showed)
