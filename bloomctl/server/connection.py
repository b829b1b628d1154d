"""Connection: turn a URL and options into a redis-py client (standalone or Cluster).

Secrets never leave this module in readable form: ``redact_url`` is the only way a URL is
shown, and errors are rebuilt from the exception type and the redacted address.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlsplit

from bloomctl.defaults import DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, DEFAULT_URL, PASSWORD_ENV, URL_ENV
from bloomctl.errors import ConnectionFailed, UsageError
from bloomctl.errors import is_redis_error as is_redis_error  # where callers found it before errors.classify

if TYPE_CHECKING:  # pragma: no cover
    from bloomctl.server.client import RedisClient

SCHEMES = ("redis", "rediss", "unix")


def _secret_spans(rest: str) -> list[tuple[int, int]]:
    """Where secrets are in a URL's text after ``scheme://``: the password before the last ``@``,
    and every ``password=`` value of the query, merged where they overlap. Both readings are
    hidden: in ``host/0?password=a@b`` the last ``@`` is the query password's, not the userinfo's.

    Works on the raw text, not on ``urlsplit``: a password holding ``/``, ``#`` or ``?`` would end
    the parsed netloc early and slip through.
    """
    spans = []
    at = rest.rfind("@")
    if at != -1:
        colon = rest.find(":", 0, at)
        if colon != -1:
            spans.append((colon + 1, at))
    else:  # no '@': 'redis://user:secret' reads as host 'user', port 'secret': a port that is no number
        netloc_end = min(i for i in (rest.find("/"), rest.find("?"), len(rest)) if i != -1)
        # The first colon after the host ends it. What follows, unless it is a port, is hidden to
        # the end of the text: a password's own '/', '?' or '#' would end the netloc early
        # ('user:s3cr/et'), and 'user:secret:6379' or 'user:123456' are no ports either.
        host_end = 0
        if rest.startswith("["):  # an IPv6 host's colons are its own; an unclosed bracket hides nothing
            host_end = rest.find("]", 0, netloc_end) + 1 or netloc_end
        colon = rest.find(":", host_end, netloc_end)
        port = rest[colon + 1 : netloc_end]
        if colon != -1 and not (port.isascii() and port.isdigit() and int(port) <= 65535):
            spans.append((colon + 1, len(rest)))
    qmark = rest.find("?")
    if qmark != -1:
        start = qmark + 1
        for item in rest[start:].split("&"):
            name, eq, _value = item.partition("=")
            if eq and unquote(name).lower() == "password":  # (redis-py reads pass%77ord as password)
                spans.append((start + len(name) + 1, start + len(item)))
            start += len(item) + 1
    merged: list[tuple[int, int]] = []
    for begin, end in sorted(spans):
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((begin, end))
    return merged


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (also ``?password=`` in the query)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "<unparsable URL>" if "@" in url else url
    shown, last = [], 0
    for begin, end in _secret_spans(rest):
        shown += [rest[last:begin], "***"]
        last = end
    return f"{scheme}://{''.join(shown)}{rest[last:]}"


def url_without_secrets(url: str) -> str:
    """The URL with its password and ``password=`` values left out (not masked): what a printed
    command may carry, the password then coming from $BLOOMCTL_PASSWORD or ``--password-file``.
    Read as the client reads it (``urlsplit``: in ``host:6380/2?password=a@b`` the '@' is the
    query's); should any secret remain, the masked form is returned instead: never a password."""
    if not url_has_secret(url):
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_url(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}@{host}" if user else host
    query = "&".join(
        item for item in parts.query.split("&") if item and unquote(item.partition("=")[0]).lower() != "password"
    )
    # (built by hand: urlunsplit writes unix:///path as unix:/path)
    stripped = f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
    stripped += f"#{parts.fragment}" if parts.fragment else ""
    return redact_url(url) if url_has_secret(stripped) else stripped


def full_url(url: str) -> str:
    """``host``, ``host:port`` or ``host:port/db`` (what redis-cli users type) as a redis:// URL."""
    return url if "://" in url else f"redis://{url}"


def with_address(url: str, host: str | None, port: int | None) -> str:
    """The URL with its host and/or port replaced (its user, password, database and query kept)."""
    if host is None and port is None:
        return url
    try:
        parts = urlsplit(url)
        old_host, old_port = parts.hostname or "localhost", parts.port or 6379
    except ValueError:
        raise UsageError("invalid `url` %s: the host or port cannot be read", redact_url(url)) from None
    if parts.scheme.lower() == "unix":
        raise UsageError("--host/--port do not apply to a unix:// URL (a socket path)")
    userinfo, at, _address = parts.netloc.rpartition("@")
    netloc = f"{userinfo}{at}{_host_part(host) if host is not None else _host_part(old_host)}"
    return parts._replace(netloc=f"{netloc}:{port if port is not None else old_port}").geturl()


def _host_part(host: str) -> str:
    """A host name or an IP address as it stands in a URL (IPv6 in brackets); anything else (a URL,
    user:password@host, host:port) is refused without being echoed: it may hold a password."""
    import ipaddress

    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return f"[{bare}]" if ipaddress.ip_address(bare).version == 6 else bare
    except ValueError:
        pass
    if not bare or not all(c.isalnum() or c in "-._" for c in bare):
        raise UsageError("--host takes a host name or an IP address (a URL goes in --url; a port in --port)")
    return bare


def check_userinfo(url: str) -> None:
    """A user or password holding ``/``, ``?`` or ``#`` unencoded ends the URL's host part early: the
    client would connect to another host (localhost) with part of the password. Refused, without
    echoing any part of it."""
    _scheme, sep, rest = url.partition("://")
    at = rest.rfind("@")
    if sep and at != -1 and any(char in rest[:at] for char in "/?#"):
        raise UsageError(
            "the `url`'s user or password holds / ? or # unencoded, which ends the host part early "
            "(%s): percent-encode them (/ is %%2F, ? %%3F, # %%23, @ %%40, : %%3A), or pass the "
            "password in %s or `password_file`",
            redact_url(url),
            PASSWORD_ENV,
        )


def _url_secrets(url: str) -> list[str]:
    """The URL's secrets (its password, ``password=`` values), read the same raw way ``redact_url`` reads them."""
    rest = url.partition("://")[2]
    return [rest[begin:end] for begin, end in _secret_spans(rest) if end > begin]


def url_has_secret(url: str) -> bool:
    """Whether the URL holds a password (before its last ``@``, or a ``password=`` in its query)."""
    return bool(_url_secrets(url))


def read_password_file(path: str | os.PathLike[str]) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError("cannot read `password_file` %r: %s", os.fspath(path), exc.strerror) from None
    except UnicodeDecodeError:
        raise UsageError("`password_file` %r is not UTF-8 text", os.fspath(path)) from None
    return text.rstrip("\r\n")


@dataclass(frozen=True)
class ConnectionSettings:
    url: str = DEFAULT_URL
    cluster: bool | None = None  # None: detect from the server
    password: str | None = None  # used only when the URL carries none
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    timeout: float = DEFAULT_TIMEOUT
    password_from: str | None = None  # where a profile's password comes from ($VAR, a file), for errors' hints

    def __repr__(self) -> str:  # never show the password, not even in a traceback
        return f"ConnectionSettings(url={self.redacted_url!r}, cluster={self.cluster})"

    @property
    def redacted_url(self) -> str:
        return redact_url(self.url)

    def client_kwargs(self) -> dict[str, Any]:
        check_userinfo(self.url)
        try:
            parts = urlsplit(self.url)
            has_password = bool(parts.password)
            _port = parts.port  # a port that is no number, or out of range, raises here (for every scheme)
        except ValueError as exc:
            # the port's message quotes the "port", which is the password in 'redis://user:secret': never shown
            port = "port" in str(exc).lower()
            reason = "the port is not a number from 0 to 65535" if port else _scrub(str(exc), self)
            raise UsageError("invalid `url` %s: %s", self.redacted_url, reason) from None
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES:
            raise UsageError(
                "unsupported URL scheme %r in %s: use redis://, rediss:// or unix://", scheme, self.redacted_url
            )
        if (self.tls_ca or self.tls_cert or self.tls_key) and scheme != "rediss":
            raise UsageError("`tls_ca`/`tls_cert`/`tls_key` need a rediss:// URL")
        check_tls_files(self.tls_ca, self.tls_cert, self.tls_key)
        database = parts.path.strip("/")
        if scheme != "unix" and database and not database.isdigit():
            raise UsageError("the `url` names database %r: a database is a number (redis://host:6379/0)", database)
        kwargs: dict[str, Any] = {
            "socket_connect_timeout": self.connect_timeout,
            "socket_timeout": self.timeout,
            "decode_responses": False,
        }
        if self.password is not None and not has_password:
            kwargs["password"] = self.password
        if self.tls_ca:
            kwargs["ssl_ca_certs"] = self.tls_ca
        if self.tls_cert:
            kwargs["ssl_certfile"] = self.tls_cert
        if self.tls_key:
            kwargs["ssl_keyfile"] = self.tls_key
        return kwargs


def settings_from(
    url: str | None = None,
    *,
    cluster: bool | None = None,
    password_file: str | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    timeout: float = DEFAULT_TIMEOUT,
    environ: dict[str, str] | None = None,
    host: str | None = None,
    port: int | None = None,
) -> ConnectionSettings:
    """Resolve the connection: flag > environment > default, for the URL and the password.
    ``host``/``port`` (redis-cli's -h/-p) replace the URL's; a URL may be just ``host:port``."""
    env = os.environ if environ is None else environ
    password = read_password_file(password_file) if password_file else env.get(PASSWORD_ENV) or None
    return ConnectionSettings(
        url=with_address(full_url(url or env.get(URL_ENV) or DEFAULT_URL), host, port),
        cluster=cluster,
        password=password,
        tls_ca=tls_ca,
        tls_cert=tls_cert,
        tls_key=tls_key,
        connect_timeout=connect_timeout,
        timeout=timeout,
    )


def connect(settings: ConnectionSettings, **hints: str) -> RedisClient:
    """Open a client and check it answers. ``cluster=None`` asks the server whether it is a Cluster node.
    ``hints`` (``password_env``, ``password_option``) name where this server's password comes from.

    The client is a ``redis.Redis`` or a ``redis.cluster.RedisCluster`` that answers bytes, as
    ``RedisClient`` describes it; redis-py's annotations cannot say so, hence the casts."""
    import redis

    kwargs = settings.client_kwargs()
    if urlsplit(settings.url).scheme.lower() == "rediss":
        check_tls(settings)
    try:
        if settings.cluster:
            return _open_cluster(settings, kwargs)
        client = redis.Redis.from_url(settings.url, **kwargs)
        if settings.cluster is False:
            client.ping()
            return cast("RedisClient", client)
        try:
            cluster_enabled = client.info("cluster").get("cluster_enabled") == 1
        except redis.exceptions.NoPermissionError:  # an ACL user without INFO: ask CLUSTER INFO's cousin
            cluster_enabled = _answers_moved(client)
        if cluster_enabled:
            client.close()
            return _open_cluster(settings, kwargs)
        return cast("RedisClient", client)
    except redis.exceptions.RedisError as exc:
        raise connection_error(exc, settings, **hints) from None
    except ValueError as exc:  # redis-py rejects malformed URLs with ValueError
        raise UsageError("invalid `url` %s: %s", settings.redacted_url, _scrub(str(exc), settings)) from None


def check_tls_files(ca: str | None, cert: str | None, key: str | None) -> None:
    """Load the CA and the client's certificate and key now, so a wrong file is named (exit 2),
    not reported as "Error 524297 PEM lib" by the connection."""
    import ssl

    context = ssl.create_default_context()
    if ca:
        try:
            context.load_verify_locations(cafile=ca)
        except (ssl.SSLError, OSError) as exc:
            raise UsageError("cannot load `tls_ca` %r: %s", ca, _ssl_reason(exc)) from None
    if cert or key:
        if not cert:
            raise UsageError("`tls_key` needs `tls_cert` too")
        try:
            context.load_cert_chain(certfile=cert, keyfile=key)
        except (ssl.SSLError, OSError) as exc:
            raise UsageError(
                "cannot load `tls_cert` %r / `tls_key` %r: %s", cert, key or cert, _ssl_reason(exc)
            ) from None


def _ssl_reason(exc: BaseException) -> str:
    import ssl

    if isinstance(exc, ssl.SSLError):
        return f"not a PEM certificate and key that belong together ({exc.reason or exc.strerror or 'unreadable'})"
    return getattr(exc, "strerror", None) or str(exc)


PLAIN_TCP_SIGNS = (
    "wrong version number",
    "record layer failure",
    "packet length too long",
    "unexpected eof",
    "http request",
)


def check_tls(settings: ConnectionSettings) -> None:
    """Whether a TLS server answers at a rediss:// URL's address, within `connect_timeout` (a plain
    Redis there left the client waiting for the whole reply timeout). A handshake without
    verification, only to tell TLS from plain TCP; the client then makes the real, verified one."""
    import socket
    import ssl

    parts = urlsplit(settings.url)
    host, port = parts.hostname or "localhost", parts.port or 6379
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    plain = ConnectionFailed(
        "no TLS handshake from %s:%s within %ss: is it a plain (non-TLS) Redis? then use a redis:// URL",
        host,
        port,
        f"{settings.connect_timeout:g}",
    )
    try:
        with (
            socket.create_connection((host, port), timeout=settings.connect_timeout) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return
    except TimeoutError:
        raise plain from None
    except ssl.SSLError as exc:
        if any(sign in str(exc).lower() for sign in PLAIN_TCP_SIGNS):
            raise plain from None
        return  # a TLS server that wants more (a client certificate): the real handshake will say
    except OSError:
        return  # refused, unreachable: the client's own error says it best


def _answers_moved(client: Any) -> bool:
    """Whether the server redirects a keyed command: the sign of a Cluster node, for users denied INFO."""
    import redis

    redirected = (redis.exceptions.MovedError, redis.exceptions.AskError, redis.exceptions.ClusterDownError)
    try:
        for probe in ("bloomctl:probe:a", "bloomctl:probe:b", "bloomctl:probe:c"):  # slots on different nodes
            client.exists(probe)
    except redirected:  # redis-py parses the MOVED/ASK/CLUSTERDOWN replies into these (without the word)
        return True
    except redis.exceptions.ResponseError as exc:
        return str(exc).startswith(("MOVED", "ASK", "CLUSTERDOWN"))
    return False


CLUSTER_RETRIES = 0


def _open_cluster(settings: ConnectionSettings, kwargs: dict[str, Any]) -> RedisClient:
    from redis.cluster import RedisCluster

    if urlsplit(settings.url).scheme.lower() == "unix":
        raise UsageError("a Redis Cluster is reached over TCP: use a redis:// or rediss:// URL with `cluster`")
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # No retries of our own: redis-py retried a command on a dead node 10 times (a --timeout of 3 s
    # took 33 s); a CLI run fails in --timeout, and cron or the operator runs it again.
    # require_full_coverage=False: a cluster with uncovered slots still serves the others (and
    # `doctor` can say which are missing) instead of refusing to start the client at all
    client = RedisCluster.from_url(
        settings.url, retry=Retry(NoBackoff(), CLUSTER_RETRIES), require_full_coverage=False, **kwargs
    )
    client.ping(target_nodes=RedisCluster.DEFAULT_NODE)  # not ALL_NODES: a failed replica must not stop us
    return cast("RedisClient", client)


def _scrub(text: str, settings: ConnectionSettings) -> str:
    """Remove every secret we know of from a message produced by a third party."""
    secrets = sorted([settings.password or "", *_url_secrets(settings.url)], key=len, reverse=True)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text.replace(settings.url, settings.redacted_url)


def connection_error(
    exc: Exception,
    settings: ConnectionSettings,
    *,
    password_env: str = PASSWORD_ENV,
    password_option: str = "password_file",
) -> ConnectionFailed:
    """One line for a redis-py error at ``settings``'s server; the hints name where its password
    comes from (``copy``'s target has its own variable and option)."""
    import redis

    where = settings.redacted_url
    if isinstance(exc, redis.exceptions.AuthenticationError | redis.exceptions.AuthorizationError):
        if settings.password_from:
            user = "the URL's user and " if urlsplit(settings.url).username else ""
            return ConnectionFailed(
                "authentication failed at %s (check %sthe password in %s)", where, user, settings.password_from
            )
        return ConnectionFailed(
            "authentication failed at %s (check the URL's user and password, %s or `" + password_option + "`)",
            where,
            password_env,
        )
    if isinstance(exc, redis.exceptions.ResponseError) and "NOAUTH" in str(exc):
        return ConnectionFailed(
            "%s requires a password: put it in the URL, %s or `" + password_option + "`", where, password_env
        )
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return ConnectionFailed(
            "the server at %s denies this user a command bloomctl needs: %s", where, _scrub(str(exc), settings)
        )
    if isinstance(exc, redis.exceptions.TimeoutError):
        return ConnectionFailed("timed out talking to %s", where)
    if isinstance(exc, redis.exceptions.ConnectionError):
        return ConnectionFailed("cannot connect to %s: %s", where, _scrub(str(exc), settings))
    return ConnectionFailed("server error at %s: %s", where, _scrub(str(exc), settings))
