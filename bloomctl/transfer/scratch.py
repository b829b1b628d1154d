"""Load one dumped member into its scratch key, and check what was loaded against the dump's header.

A restore never writes into the standby itself: a dual write landing between two chunks would be
overwritten by the next. The chunks go to a scratch key of the member's (with a TTL, so that a
killed restore leaves nothing for long): through the backend's load command, or for a filter kept
in one string as one SET whose value streams from here. The backend checks the first chunk
against the dump's header as it arrives; ``check`` compares the loaded filter with it at the end.
"""

from __future__ import annotations

from typing import Any

from bloomctl.backends import Backend
from bloomctl.backends.base import DumpMismatch
from bloomctl.errors import UnsupportedServer, VerifyFailed
from bloomctl.keys import KeyFamily
from bloomctl.lifecycle.standby import is_out_of_memory
from bloomctl.server.client import NodeClient, RedisClient
from bloomctl.server.topology import node_client
from bloomctl.transfer.dumpfile import Chunk, DumpCorrupt

SCRATCH_TTL_MS = 3_600_000  # a killed restore's scratch key drops itself after an hour


class StreamedSet:
    """``SET key value`` sent in pieces on a connection of its own: the value is never whole in the
    client, and the server executes the command once its last byte has arrived."""

    def __init__(self, node: NodeClient, key: bytes, size: int) -> None:
        self.pool = node.connection_pool
        try:
            self.connection = self.pool.get_connection()
        except TypeError:  # redis-py 5: the command name is a required argument
            self.connection = self.pool.get_connection("SET")
        self.size, self.sent = size, 0
        try:
            head = b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(key), key, size)
            self.connection.send_packed_command([head])
        except BaseException:
            self.abort()
            raise

    def send(self, data: bytes) -> None:
        try:
            self.connection.send_packed_command([data], check_health=False)
        except BaseException:
            self.abort()
            raise
        self.sent += len(data)

    def finish(self) -> None:
        if self.sent != self.size:
            self.abort()
            raise DumpCorrupt("the dump holds %s bytes of a bitmap filter of %s", f"{self.sent:,}", f"{self.size:,}")
        try:
            ttl = str(SCRATCH_TTL_MS).encode()  # SET ... PX: the scratch key is never without its TTL
            self.connection.send_packed_command(
                [b"\r\n$2\r\nPX\r\n$%d\r\n%s\r\n" % (len(ttl), ttl)], check_health=False
            )
            self.connection.read_response()
        except BaseException:
            self.abort()
            raise
        self.pool.release(self.connection)

    def abort(self) -> None:
        """Close the connection: the server drops the unfinished command with it."""
        self.connection.disconnect()
        self.pool.release(self.connection)


class ScratchWriter:
    """Writes one member's chunks into its scratch key."""

    def __init__(
        self, client: RedisClient, backend: Backend, family: KeyFamily, member: dict[str, Any], name: str
    ) -> None:
        self.client, self.backend, self.family, self.member, self.name = client, backend, family, member, name
        self.scratch = family.companion("restore")
        self.scratch_meta = family.companion("restore:meta")
        self.started = False
        self.offset = 0
        self.streamed: StreamedSet | None = None
        self.fingerprints = 0  # a cuckoo filter's taken slots, counted as the chunks pass
        self.counted_items: int | None = None  # and the item count its own header holds

    def write(self, chunk: Chunk) -> None:
        import redis

        command = self.backend.load_command
        if command is None:
            self._write_slice(chunk)
            self.started = True
            return
        if not self.started:
            self.counted_items = self._check_first(chunk)
        else:
            self.fingerprints += self._fingerprints(chunk)
        try:
            if not self.started:  # the header creates the key: with its TTL, in one MULTI
                pipe = self.client.pipeline(transaction=True)
                pipe.execute_command(command, self.scratch, chunk.cursor, chunk.data)
                pipe.pexpire(self.scratch, SCRATCH_TTL_MS)
                pipe.execute()
            else:
                for load in self.backend.load_commands(self.scratch, chunk.cursor, chunk.data):
                    self.client.execute_command(*load)
        except redis.exceptions.ResponseError as exc:
            if is_out_of_memory(exc):
                raise
            raise UnsupportedServer(
                "the server cannot load chunk at %s of %s (%s): rebuild the filter from the source",
                chunk.cursor,
                self.name,
                str(exc),
            ) from None
        self.started = True

    def _check_first(self, chunk: Chunk) -> int | None:
        """The backend's check of the member's first chunk against the dump's header."""
        try:
            return self.backend.check_first_chunk(chunk.data, self.member)
        except DumpMismatch as exc:
            raise DumpCorrupt("%s: %s", self.name, str(exc)) from None

    def _fingerprints(self, chunk: Chunk) -> int:
        try:
            return self.backend.fingerprints_in(chunk.data, chunk.cursor, self.member)
        except DumpMismatch as exc:
            raise DumpCorrupt(str(exc)) from None

    def _reserve_empty(self, reserve: tuple[Any, ...]) -> None:
        """A member whose dump holds no chunks is reserved anew, with the scratch key's TTL, in one MULTI."""
        pipe = self.client.pipeline(transaction=True)
        pipe.execute_command(*reserve)
        pipe.pexpire(self.scratch, SCRATCH_TTL_MS)
        pipe.execute()
        self.started = True

    def _write_slice(self, chunk: Chunk) -> None:
        """A filter kept in one string arrives as one SET whose value streams from here as the slices
        come: the server reads it between other clients' commands and stores it without a copy, so
        no command of the restore blocks it (slices written with SETRANGE cost one allocation of the
        whole string, 82 ms for 120 MB, or reallocations as it grew). Until the last byte, nothing
        exists; a failure closes the connection and the server drops the partial command."""
        size = int(self.member["size_bytes"])
        if chunk.cursor != self.offset or self.offset + len(chunk.data) > size:
            raise DumpCorrupt(
                "%s: a slice at byte %s where %s was next, of %s", self.name, chunk.cursor, self.offset, size
            )
        if not self.started:
            self.counted_items = self._check_first(chunk)
            self.streamed = StreamedSet(node_client(self.client, self.scratch), self.scratch, size)
        self.fingerprints += self._fingerprints(chunk)
        assert self.streamed is not None
        self.streamed.send(chunk.data)
        self.offset += len(chunk.data)

    def finish(self) -> None:
        """The end of a streamed string: the server stores it now, with its TTL."""
        if self.streamed is not None:
            streamed, self.streamed = self.streamed, None
            streamed.finish()

    def abort(self) -> None:
        if self.streamed is not None:
            streamed, self.streamed = self.streamed, None
            streamed.abort()

    def check(self) -> None:
        """The loaded scratch key is the filter the dump's header describes (its size and layout; at
        least its items)."""
        member = self.member
        if not self.started:
            reserve = self.backend.reserve_like(self.scratch, member)
            if reserve is None:
                raise DumpCorrupt("%s: the dump holds no chunks for it", self.name)
            self._reserve_empty(reserve)
            return
        if self.counted_items is not None and self.counted_items != self.fingerprints:
            # every fingerprint is one item a filter counted: a dump that says otherwise is forged, or was
            # read while the filter changed (a restored filter with a wrong count could not be dumped again)
            raise DumpCorrupt(
                "%s: the cuckoo filter holds %s fingerprints, its header counts %s items: the dump is inconsistent",
                self.name,
                f"{self.fingerprints:,}",
                f"{self.counted_items:,}",
            )
        self.backend.check_loaded(self.client, self.scratch, member, self.name)
        state = self.backend.info(self.client, self.scratch, with_header=False)
        # the items may have grown while the member was dumped (its chunks then hold them too); a
        # filter that deletes items may hold fewer
        fewer = state.items < member["items"] and not self.backend.removes_items
        if (state.size_bytes, state.filters) != (member["size_bytes"], member["filters"]) or fewer:
            raise VerifyFailed(
                "%s: the restored filter has %s items in %s bytes, the dump says %s items (or more) in %s bytes",
                self.name,
                f"{state.items:,}",
                f"{state.size_bytes:,}",
                f"{member['items']:,}",
                f"{member['size_bytes']:,}",
            )
