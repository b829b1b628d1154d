"""The object Click passes to every command: connection settings and a lazily opened client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - annotations only: the library loads when a command needs it
    from bloomctl.cli.hints import Hints
    from bloomctl.cli.output import Output
    from bloomctl.declared.config import Config
    from bloomctl.server.capabilities import ServerInfo
    from bloomctl.server.client import RedisClient
    from bloomctl.server.connection import ConnectionSettings


class AppContext:
    """Per-invocation state: connection settings, resolved once and lazily into a client."""

    def __init__(
        self,
        output: Output | None = None,
        config: str | None = None,
        overrides: Mapping[str, Any] | None = None,
        **connection: Any,
    ) -> None:
        from bloomctl.cli.output import Output

        self.output: Output = output if output is not None else Output()
        self._connection = connection
        self._settings: ConnectionSettings | None = None
        self._client: RedisClient | None = None
        self._server: ServerInfo | None = None
        self.config_path = config  # --config (or $BLOOMCTL_CONFIG, read when a command needs the file)
        self._config: Config | None = None
        # the connection options given on the command line: they win over a profile's
        self.overrides: dict[str, Any] = dict(overrides or {})
        self._profiles: dict[str, tuple[RedisClient, ServerInfo]] = {}
        self._profile_settings: dict[str, ConnectionSettings] = {}
        # the settings of the profile last connected to (an error names its server)
        self.in_use: ConnectionSettings | None = None
        self.config_given = False  # --config was on the command line (not $BLOOMCTL_CONFIG): hints repeat it
        self.hints_override: Hints | None = None  # a copy's target, while the copy writes there

    def hints(self) -> Hints:
        """How a printed next-step command reaches the server in use (bloomctl.cli.hints): a copy's
        target while it is written, else a config profile's once one is used, else the command line's."""
        from bloomctl.cli.hints import Hints, command_line_hints, server_hints

        if self.hints_override is not None:
            return self.hints_override
        if self.in_use is not None:
            return server_hints(self.in_use, password_file=self.overrides.get("password_file"))
        try:
            url = self.settings.url
        except Exception:  # an unusable URL: the command fails on it, and prints no hint
            return Hints()
        return command_line_hints(self.overrides, url, self.config_path if self.config_given else None)

    def next_step(self, *args: str) -> str:
        """`` `bloomctl ARGS` `` on the server in use, quoted for the shell (and where a password goes)."""
        return self.hints().command(*args)

    @property
    def settings(self) -> ConnectionSettings:
        if self._settings is None:
            from bloomctl.server.connection import settings_from

            self._settings = settings_from(**self._connection)
        return self._settings

    @property
    def client(self) -> RedisClient:
        if self._client is None:
            from bloomctl.server.connection import connect

            self._client = connect(self.settings)
            kind = "a Cluster" if type(self._client).__name__ == "RedisCluster" else "a standalone server"
            self.output.log(f"connected to {self.settings.redacted_url} ({kind})", level="debug")
        return self._client

    @property
    def server(self) -> ServerInfo:
        if self._server is None:
            from bloomctl.server.capabilities import detect

            self._server = detect(self.client)
        return self._server

    @property
    def config(self) -> Config:
        """bloomctl.toml (--config, else $BLOOMCTL_CONFIG, else ./bloomctl.toml), read once."""
        if self._config is None:
            from bloomctl.declared import config
            from bloomctl.errors import UsageError

            path = config.find(self.config_path)
            if path is None:
                raise UsageError(
                    "no config file: give --config PATH, set $%s, or run where bloomctl.toml is", config.CONFIG_ENV
                )
            self._config = config.load(path)
        return self._config

    @property
    def has_config(self) -> bool:
        from bloomctl.declared import config

        return config.find(self.config_path) is not None

    def connect_profile(self, name: str) -> tuple[RedisClient, ServerInfo]:
        """The client and server of a profile of the config file (without profiles: the global
        connection options'), opened once."""
        if name not in self._profiles:
            profile = self.config.profiles.get(name)
            if profile is None:
                self.in_use = None
                self._profiles[name] = (self.client, self.server)
            else:
                from bloomctl.declared.declarations import settings_for
                from bloomctl.server.capabilities import detect
                from bloomctl.server.connection import connect

                self.in_use = self._profile_settings[name] = settings_for(profile, **self.overrides)
                client = connect(self.in_use)
                self._profiles[name] = (client, detect(client))
        self.in_use = self._profile_settings.get(name)
        return self._profiles[name]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        for client, _server in self._profiles.values():
            if client is not self._client:
                client.close()
