"""Database URLs read without SQLAlchemy, by SQLAlchemy's own rules, written for libpq, and shown
without their secrets.

``parse_db_url`` gives what ``sqlalchemy.engine.make_url`` gives (the same pattern, the same
percent-decoding of user, password and database, the same query parsing), so a PostgreSQL source
that ADBC serves never loads SQLAlchemy; ``libpq_uri`` holds the options SQLAlchemy's psycopg
dialect connects with (several hosts included). tests/test_sql_without_sqlalchemy.py holds each
to SQLAlchemy's. ``secrets_of`` finds every text of a URL that may be a password, for the
messages that must not show it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol
from urllib.parse import parse_qsl, quote, unquote, unquote_plus

from bloomctl.server.connection import redact_url

# sqlalchemy.engine.url._parse_url's pattern, character for character
_URL = re.compile(
    r"""
        (?P<name>[\w\+]+)://
        (?:
            (?P<username>[^:/]*)
            (?::(?P<password>[^@]*))?
        @)?
        (?:
            (?:
                \[(?P<ipv6host>[^/\?]+)\] |
                (?P<ipv4host>[^/:\?]+)
            )?
            (?::(?P<port>[^/\?]*))?
        )?
        (?:/(?P<database>[^\?]*))?
        (?:\?(?P<query>.*))?
        """,
    re.X,
)


class UrlParts(Protocol):
    """What a libpq URI is made of: a ``DbUrl``, or SQLAlchemy's ``URL`` (the same fields)."""

    @property
    def username(self) -> str | None: ...

    @property
    def password(self) -> str | None: ...

    @property
    def host(self) -> str | None: ...

    @property
    def port(self) -> int | None: ...

    @property
    def database(self) -> str | None: ...

    @property
    def query(self) -> Mapping[str, str | Sequence[str]]: ...


class DbUrl(NamedTuple):
    """A database URL's parts, named and valued as SQLAlchemy's ``URL`` names and values them (a
    query key given twice holds a tuple of its values)."""

    drivername: str
    username: str | None
    password: str | None
    host: str | None
    port: int | None
    database: str | None
    query: dict[str, str | tuple[str, ...]]

    @property
    def dialect(self) -> str:
        return self.drivername.partition("+")[0]

    @property
    def driver(self) -> str:
        return self.drivername.partition("+")[2]


def parse_db_url(url: str) -> DbUrl:
    """``url``'s parts; a ValueError where ``make_url`` refuses it (SQLAlchemy's ArgumentError is
    one). The error's text never holds a part of the URL: a password can end up in any of them."""
    match = _URL.match(url)
    if match is None:
        raise ValueError("Could not parse SQLAlchemy URL from given URL string")
    parts = match.groupdict()
    query: dict[str, str | tuple[str, ...]] = {}
    for key, value in parse_qsl(parts["query"] or ""):
        before = query.get(key)
        query[key] = value if before is None else (*((before,) if isinstance(before, str) else before), value)
    username, password, database = (
        None if parts[name] is None else unquote(parts[name]) for name in ("username", "password", "database")
    )
    port = parts["port"]
    if port is not None and not _is_int(port):  # int() as SQLAlchemy calls it: '' and 'x' are refused
        # ('user:secret' without an '@' reads as host 'user', port 'secret': SQLAlchemy's message quotes it)
        raise ValueError("the port is not a number")
    return DbUrl(
        drivername=parts["name"],
        username=username,
        password=password,
        host=parts["ipv4host"] or parts["ipv6host"],
        port=None if port is None else int(port),
        database=database,
        query=query,
    )


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def connect_options(url: UrlParts) -> dict[str, str]:
    """The libpq options SQLAlchemy's psycopg dialects connect with (their ``create_connect_args``):
    user, password, host, port and database where they are not empty, the query over them, and the
    query's hosts (``host=a:1&host=b:2``, ``host=a,b&port=1,2``, a lone ``host=a:1``) written as
    libpq's comma-separated lists. A ValueError where the dialect refuses the URL, or would hand
    the driver another key given twice."""
    hosts, ports = _hosts_and_ports(url.query)
    named = {"user": url.username, "password": url.password, "host": url.host, "port": url.port}
    options: dict[str, str | Sequence[str]] = {key: str(value) for key, value in named.items() if value}
    if url.database:
        options["dbname"] = url.database
    options.update(url.query)
    if hosts:
        options["host"] = ",".join(hosts)
        listed = ",".join(str(port) if port else "" for port in ports or ())
        if listed:
            options["port"] = listed
    twice = sorted(key for key, value in options.items() if not isinstance(value, str))
    if twice:
        raise ValueError(f"the query gives {', '.join(twice)} more than once")
    return {key: str(value) for key, value in options.items()}


def _hosts_and_ports(
    query: Mapping[str, str | Sequence[str]],
) -> tuple[tuple[str, ...] | None, tuple[int | None, ...] | None]:
    """The query's hosts and ports as SQLAlchemy's PostgreSQL dialect reads them
    (``_split_multihost_from_url``), its refusals raised as ValueErrors."""
    hosts: tuple[str, ...] | None = None
    texts: tuple[str | None, ...] | None = None
    integrated = False
    given = query.get("host")
    if given is not None and not isinstance(given, str):
        integrated = True
        # zip() as the dialect calls it: a token of three parts or more is refused with a ValueError
        tokens: list[Sequence[str | None]] = [token.split(":") if ":" in token else (token, None) for token in given]
        hosts, texts = zip(*tokens)  # noqa: B905
    elif isinstance(given, str):
        hosts = tuple(given.split(","))
        if "port" not in query and len(hosts) == 1 and ":" in hosts[0]:
            match = re.match(r"^([a-zA-Z0-9\-\.]*)(?:\:(\d*))?$", hosts[0])
            if match:
                integrated = True
                hosts, texts = (match.group(1),), (match.group(2) or None,)
    port = query.get("port")
    if port is not None:
        if integrated:
            raise ValueError("the query mixes host=h:p with port=")
        texts = tuple(port.split(",")) if isinstance(port, str) else tuple(port)
    ports = None
    if texts:
        if not all(_is_int(text) for text in texts if text):
            raise ValueError("a port in the query is not a number")
        ports = tuple(int(text) if text else None for text in texts)
    if ports and (
        (not hosts and len(ports) > 1) or (hosts and len(hosts) != len(ports) and (len(hosts) > 1 or len(ports) > 1))
    ):
        raise ValueError("the query's hosts and ports do not pair up")
    if hosts is not None and ports is None:
        ports = tuple(None for _ in hosts)
    return hosts, ports


def libpq_uri(url: UrlParts, **settings: str) -> str:
    """``url`` as a libpq URI of the options SQLAlchemy's psycopg dialect connects with
    (``connect_options``), ``settings`` replacing some: every one in the query, percent-encoded
    whole, which libpq decodes back to the very strings the dialect hands psycopg (it takes
    neither a raw space nor ``+`` for a space, and a host there needs no brackets). The password
    is in it: the URI never leaves this process, and no message shows it."""
    options = {**connect_options(url), **settings}
    if not options:
        return "postgresql://"
    return "postgresql://?" + "&".join(f"{_encoded(key)}={_encoded(value)}" for key, value in options.items())


def _encoded(text: str) -> str:
    return quote(text, safe="")


# libpq's password keys; a secret may stand in either
SECRET_KEYS = frozenset({"password", "sslpassword"})
_QUERY_PAIR = re.compile(r"(?<=[?&])([^=&?]*)=([^&]*)")


def secrets_of(url: str) -> set[str]:
    """The texts of ``url`` that may be secrets, as typed and percent-decoded: the password of the
    user part, read up to the first ``@`` (SQLAlchemy) and up to the last; the port of a
    ``user:secret`` without ``@`` (read as host and port, the "port" being no number); and every
    value of a password key (``password``, ``sslpassword``, however spelt) in the query."""
    found: set[str] = set()
    rest = url.partition("://")[2]
    match = _URL.match(url)
    if match is not None:
        found.add(match.group("password") or "")
        port = match.group("port")
        if port and not _is_int(port):
            found.add(port)
    at = rest.rfind("@")
    colon = rest.find(":", 0, max(at, 0))
    if colon != -1:
        found.add(rest[colon + 1 : at])
    for key, value in _QUERY_PAIR.findall(rest):
        if unquote_plus(key).lower() in SECRET_KEYS:
            found.add(value)
    return {form for text in found for form in (text, unquote(text), unquote_plus(text)) if form}


def redact_db_url(url: str) -> str:
    """``url`` as messages show it: ``redact_url``'s rules (the user part's password, a
    ``user:secret`` without ``@``, ``password=``), and every other password key of the query too."""
    shown = redact_url(url)

    def hide(pair: re.Match[str]) -> str:
        return f"{pair.group(1)}=***" if unquote_plus(pair.group(1)).lower() in SECRET_KEYS else pair.group(0)

    return _QUERY_PAIR.sub(hide, shown)
