"""Rebuild: stream a source of truth into the standby, verify it, and (optionally) swap it in.

The steps, one module each, in the order they run (docs/rebuild.md describes them one to one):
``preflight`` (options, source, plan), ``standby`` (replace and reserve the standbys under the
lock), ``load`` (the load and the SQL catch-up), ``verify`` (a sample, or everything), and the
cut-over in ``run``, which also runs them in order.
"""

from __future__ import annotations

from bloomctl.rebuild.options import RebuildOptions, RebuildReport
from bloomctl.rebuild.run import rebuild
from bloomctl.sampling import Reservoir

__all__ = ["RebuildOptions", "RebuildReport", "Reservoir", "rebuild"]
