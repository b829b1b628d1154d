"""The Redis client the library takes: a structural type that redis-py's clients satisfy.

Every function that talks to Redis takes the client explicitly: a ``redis.Redis`` (standalone,
or one node of a cluster) or a ``redis.cluster.RedisCluster``. The protocol lists what the
library calls, so a type checker catches a wrong argument without tying the library to one
redis-py class. Nothing here imports redis at run time.

Replies are typed as a client made with ``decode_responses=False`` gives them (redis-py's default,
and what ``connect`` sets): bytes, never str. redis-py's annotations cannot tell that setting
apart and say ``bytes | str``, so a type checker does not take a ``redis.Redis`` for a
``RedisClient`` by itself: ``connect`` casts the client it opens, as must type-checked code that
opens its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, Self

if TYPE_CHECKING:  # pragma: no cover - annotations only: importing redis is not free
    from redis.connection import ConnectionPool

Key = bytes | str
Field = bytes | str
Value = bytes | str | int | float


class Script(Protocol):
    """A Lua script registered with ``register_script``: EVALSHA, loading it when the server lacks it.

    Every script bloomctl runs answers an integer; an error reply raises ResponseError instead.
    """

    def __call__(
        self, keys: Sequence[Key] | None = None, args: Iterable[Value] | None = None, client: RedisClient | None = None
    ) -> int: ...


class Pipeline(Protocol):
    """A redis-py pipeline: each command queues (and returns the pipeline); ``execute`` sends them
    in one round trip and returns their replies in order."""

    def execute_command(self, *args: Any, **options: Any) -> Self: ...

    def hget(self, name: Key, key: Field) -> Self: ...

    def hset(
        self,
        name: Key,
        key: Field | None = None,
        value: Value | None = None,
        mapping: Mapping[str, Value] | None = None,
    ) -> Self: ...

    def pexpire(self, name: Key, time: int) -> Self: ...

    def getrange(self, key: Key, start: int, end: int) -> Self: ...

    def strlen(self, name: Key) -> Self: ...

    def execute(self, raise_on_error: bool = True) -> list[Any]: ...

    def __len__(self) -> int: ...


class RedisClient(Protocol):
    """The calls bloomctl makes on a client (redis-py ``Redis`` or ``RedisCluster``)."""

    def execute_command(self, *args: Any, **options: Any) -> Any: ...

    def pipeline(self, transaction: bool = True) -> Pipeline: ...

    def register_script(self, script: str | bytes) -> Script: ...

    def ping(self) -> bool: ...

    def type(self, name: Key) -> bytes: ...

    def exists(self, *names: Key) -> int: ...

    def unlink(self, *names: Key) -> int: ...

    def delete(self, *names: Key) -> int: ...

    def get(self, name: Key) -> bytes | None: ...

    def set(self, name: Key, value: Value, *, px: int | None = None, nx: bool = False) -> bool | None: ...

    def pttl(self, name: Key) -> int: ...

    def expireat(self, name: Key, when: int | datetime) -> bool: ...

    def lrange(self, name: Key, start: int, end: int) -> list[bytes]: ...

    def hget(self, name: Key, key: Field) -> bytes | None: ...

    def hgetall(self, name: Key) -> dict[bytes, bytes]: ...

    def hmget(self, name: Key, keys: Sequence[Field], *args: Field) -> list[bytes | None]: ...

    def hset(
        self,
        name: Key,
        key: Field | None = None,
        value: Value | None = None,
        mapping: Mapping[str, Value] | None = None,
    ) -> int: ...

    def info(self, section: str | None = None) -> dict[str, Any]: ...

    def scan_iter(
        self, match: Key | None = None, count: int | None = None, _type: str | None = None
    ) -> Iterator[bytes]: ...

    def close(self) -> None: ...


class NodeClient(RedisClient, Protocol):
    """The client of one server (a ``redis.Redis``; a Cluster's node, or the standalone server):
    what bloomctl asks of a single node beyond the commands every client routes."""

    connection_pool: ConnectionPool

    def scan(
        self, cursor: int = 0, match: Key | None = None, count: int | None = None, _type: str | bytes | None = None
    ) -> tuple[int, list[bytes]]: ...

    def time(self) -> tuple[int, int]: ...

    def ttl(self, name: Key) -> int: ...

    def dump(self, name: Key) -> bytes | None: ...

    def restore(self, name: Key, ttl: float, value: bytes, replace: bool = False) -> bytes: ...

    def script_load(self, script: str | bytes) -> str: ...
