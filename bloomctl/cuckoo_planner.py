"""Moved to ``bloomctl.sizing.cuckoo``; this path stays for code written against it."""

from bloomctl.sizing.cuckoo import *  # noqa: F403
from bloomctl.sizing.cuckoo import cuckoo_plan  # noqa: F401  (the name docs/python-api.md showed)
