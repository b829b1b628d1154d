"""Rebuild: stream a source of truth into the standby, verify it, and (optionally) swap it in.

The steps, one module each, in the order they run (docs/rebuild.md describes them one to one):
``preflight`` (options, source, plan), ``lifecycle.standby`` (replace and reserve the standbys
under the lock), ``load`` (the load and the SQL catch-up), ``verify`` (a sample, or everything),
and the cut-over in ``run``, which also runs them in order. ``loader`` is the server path's bulk
writer, ``build`` the client path (bits computed here, uploaded), ``dedupe`` and ``sampling`` what
both keep of the stream.

The public names load on first use, so that importing one step (a worker process imports
``build``) does not load them all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_PUBLIC = {
    "RebuildOptions": "bloomctl.rebuild.options",
    "RebuildReport": "bloomctl.rebuild.options",
    "rebuild": "bloomctl.rebuild.run",
    "Reservoir": "bloomctl.rebuild.sampling",
}

__all__ = ["RebuildOptions", "RebuildReport", "Reservoir", "rebuild"]

if TYPE_CHECKING:  # pragma: no cover - what the lazy names are, for type checkers and editors
    from bloomctl.rebuild.options import RebuildOptions, RebuildReport
    from bloomctl.rebuild.run import rebuild
    from bloomctl.rebuild.sampling import Reservoir


def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'bloomctl.rebuild' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
