"""``bloomctl exporter``: a long-running Prometheus endpoint for the filters of bloomctl.toml."""

from __future__ import annotations

import dataclasses
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from bloomctl.cli.context import AppContext
from bloomctl.cli.options import Number
from bloomctl.declared.exporter import DEFAULT_CACHE_SECONDS, DEFAULT_SCRAPE_TIMEOUT

if TYPE_CHECKING:  # pragma: no cover - annotations only: the library loads when the command runs
    from bloomctl.server.capabilities import ServerInfo
    from bloomctl.server.client import RedisClient
    from bloomctl.server.connection import ConnectionSettings

DEFAULT_LISTEN = "127.0.0.1:9477"


def _listen(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"expected HOST:PORT, e.g. {DEFAULT_LISTEN} (0.0.0.0:9477 on every interface)")
    return host.strip("[]") or "0.0.0.0", int(port)


@click.command("exporter")
@click.argument("names", nargs=-1)
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    callback=_listen,
    metavar="HOST:PORT",
    help="Where to serve /metrics (0.0.0.0:PORT: every interface).",
)
@click.option(
    "--cache-seconds",
    type=Number(min=0),
    default=DEFAULT_CACHE_SECONDS,
    show_default=True,
    help="Scrapes within this long of a collection get that collection (the servers are asked at most "
    "once per interval, however many scrape).",
)
@click.option(
    "--scrape-timeout",
    type=Number(min=0, min_open=True, max=300),
    default=DEFAULT_SCRAPE_TIMEOUT,
    show_default=True,
    help="Seconds a server may take to answer one command (a server that does not: bloomctl_up 0). "
    "A profile's own timeout, or --timeout, wins.",
)
@click.pass_obj
def exporter_command(
    app: AppContext, names: tuple[str, ...], listen: tuple[str, int], cache_seconds: float, scrape_timeout: float
) -> None:
    """Serve Prometheus metrics of every filter of bloomctl.toml (or those NAMES) until stopped.

    Each scrape reads the filters (at most once per --cache-seconds): the fill-ratio metrics
    (bloomctl_fill_ratio, bloomctl_items, bloomctl_estimated_false_positive_ratio...), the
    declared thresholds, when each filter was built and how its last rebuild ended (from its
    metadata), a window's buckets; and bloomctl_up per profile: 0 while its server does not
    answer (the endpoint stays up). SIGTERM or Ctrl-C stop it (exit 0).

    \b
    Examples:
      bloomctl exporter
      bloomctl --config /etc/bloomctl/app.toml exporter --listen 0.0.0.0:9477
    """
    from bloomctl.declared.exporter import Exporter, serve

    config = app.config
    exporter = Exporter(
        config,
        _connector(app, scrape_timeout),
        names=list(names),
        cache_seconds=cache_seconds,
        log=lambda message, level: app.output.log(message, level=level),
    )
    host, port = listen
    try:
        server, thread = serve(exporter, host, port)
    except OSError as exc:
        from bloomctl.errors import UsageError

        raise UsageError("cannot listen on %s:%s: %s", host, port, exc.strerror or exc) from None
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    app.output.log(
        f"exporter: serving http://{host}:{server.server_port}/metrics for {len(exporter.decls)} filter(s) of {config.path}",
        {"listen": f"{host}:{server.server_port}", "filters": len(exporter.decls)},
    )
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.shutdown()
        server.server_close()
        thread.join(5)
    app.output.log("exporter: stopped")


def _connector(app: AppContext, timeout: float) -> Callable[[str], tuple[RedisClient, ServerInfo]]:
    """A profile's client, opened once and opened again after a failure (a server that went away
    and came back is asked again at the next collection)."""
    from bloomctl.declared.declarations import settings_for
    from bloomctl.server.capabilities import detect
    from bloomctl.server.connection import connect

    opened: dict[str, tuple[RedisClient, ServerInfo]] = {}

    def settings_of(name: str) -> ConnectionSettings:
        profile = app.config.profiles.get(name)
        settings = app.settings if profile is None else settings_for(profile, **app.overrides)
        short: dict[str, Any] = {}  # the scrape's timeouts, where neither the profile nor the command line sets one
        if "timeout" not in app.overrides and getattr(profile, "timeout", None) is None:
            short["timeout"] = timeout
        if "connect_timeout" not in app.overrides and getattr(profile, "connect_timeout", None) is None:
            short["connect_timeout"] = min(timeout, settings.connect_timeout)
        return dataclasses.replace(settings, **short)

    def open_profile(name: str) -> tuple[RedisClient, ServerInfo]:
        if name in opened:
            client, server = opened[name]
            try:
                client.ping()
                return client, server
            except Exception:
                opened.pop(name)
                client.close()
                raise
        settings = settings_of(name)
        client = connect(settings)
        try:
            server = detect(client)
        except BaseException:
            client.close()
            raise
        opened[name] = (client, server)
        return client, server

    return open_profile
