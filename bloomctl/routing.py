"""Moved to ``bloomctl.lifecycle.routing``; this path stays for code written against it."""

from bloomctl.lifecycle.routing import *  # noqa: F403
from bloomctl.lifecycle.routing import shard_of  # noqa: F401  (the name docs/sharding.md showed)
