"""Moved to ``bloomctl.server.client``; this path stays for code written against it."""

from bloomctl.server.client import RedisClient  # noqa: F401  (the name docs/python-api.md showed)
