"""A rebuild whose bits an engine builds: the driver's side of every distributed build."""

from __future__ import annotations

from typing import Any

from bloomctl.distributed.frame import FrameSource
from bloomctl.rebuild.build.spec import Engine
from bloomctl.rebuild.options import Events, RebuildReport


def run(
    source: FrameSource,
    engine: Engine,
    *,
    key: str,
    url: str | None = None,
    client: Any = None,
    events: Events | None = None,
    **options: Any,
) -> RebuildReport:
    """Rebuild ``key`` from ``source`` with ``engine`` building the bits. ``client`` is an open
    redis-py client (else one is opened from ``url``, else ``$BLOOMCTL_URL``, else localhost);
    ``options`` are ``RebuildOptions``' (``swap=True``, ``capacity``, ``error_rate``, ...).
    Raises bloomctl's errors as a rebuild does (``bloomctl.errors``): nothing is swapped then."""
    from bloomctl.rebuild import RebuildOptions, rebuild
    from bloomctl.rebuild.build import tune_allocator
    from bloomctl.server.capabilities import detect
    from bloomctl.server.connection import connect, settings_from

    settings = RebuildOptions.from_mapping({**options, "engine": engine})
    if client is None:
        client = connect(settings_from(url))
    tune_allocator()
    return rebuild(client, detect(client), key, source, settings, events=events)
