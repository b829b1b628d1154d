"""The object Click passes to every command: connection settings and a lazily opened client."""

from __future__ import annotations

from typing import Any


class AppContext:
    """Per-invocation state: connection settings, resolved once and lazily into a client."""

    def __init__(self, output: Any = None, **connection: Any) -> None:
        from bloomctl.cli.output import Output

        self.output: Output = output if output is not None else Output()
        self._connection = connection
        self._settings: Any = None
        self._client: Any = None
        self._server: Any = None

    @property
    def settings(self) -> Any:
        if self._settings is None:
            from bloomctl.connection import settings_from

            self._settings = settings_from(**self._connection)
        return self._settings

    @property
    def client(self) -> Any:
        if self._client is None:
            from bloomctl.connection import connect

            self._client = connect(self.settings)
            kind = "a Cluster" if type(self._client).__name__ == "RedisCluster" else "a standalone server"
            self.output.log(f"connected to {self.settings.redacted_url} ({kind})", level="debug")
        return self._client

    @property
    def server(self) -> Any:
        if self._server is None:
            from bloomctl.server import detect

            self._server = detect(self.client)
        return self._server

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
