"""Key naming: the standby, old, lock and metadata keys of a filter, all in the active key's hash slot.

Redis Cluster hashes only the part of a key between the first ``{`` and the first ``}`` after it,
when that part is not empty (the "hash tag"); otherwise the whole key. A filter's companion keys
must share its slot, or RENAME and MULTI fail with CROSSSLOT:

- a key with a valid tag keeps it: ``bf:{users}`` -> ``bf:{users}:standby``;
- a key without one is wrapped: ``users`` -> ``{users}:standby``, whose tag is the whole key;
- a key that cannot be wrapped (it has no valid tag but contains ``}``, e.g. ``a}b`` or ``x{}y``)
  gets the shortest hexadecimal tag that hashes to the same slot: ``{3f2}a}b:standby``.

Names are bytes throughout (Redis keys are binary-safe); ``str`` is encoded as UTF-8 with
surrogateescape, so arbitrary bytes that arrived through argv round-trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from bloomctl.errors import UsageError

SLOTS = 16384


def _crc16_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_CRC16 = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), the checksum Redis Cluster uses for key slots."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ byte) & 0xFF]
    return crc


def to_bytes(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else key.encode("utf-8", "surrogateescape")


def to_display(key: str | bytes) -> str:
    """A printable form of a key for messages: undecodable bytes appear as \\xNN."""
    return key if isinstance(key, str) else key.decode("utf-8", "backslashreplace")


def glob_escape(raw: bytes) -> bytes:
    """``raw`` as a SCAN MATCH (or ACL) pattern that matches it alone: glob characters escaped."""
    out = bytearray()
    for byte in raw:
        if byte in b"*?[]\\":
            out += b"\\"
        out.append(byte)
    return bytes(out)


def hash_tag(key: str | bytes) -> bytes | None:
    """The hash tag Redis uses for ``key``, or None when the whole key is hashed."""
    raw = to_bytes(key)
    start = raw.find(b"{")
    if start == -1:
        return None
    end = raw.find(b"}", start + 1)
    if end == -1 or end == start + 1:
        return None
    return raw[start + 1 : end]


def key_slot(key: str | bytes) -> int:
    tag = hash_tag(key)
    return crc16(tag if tag is not None else to_bytes(key)) % SLOTS


@lru_cache(maxsize=4096)
def _tag_for_slot(slot: int) -> bytes:
    """The shortest lowercase hexadecimal string (by value) whose CRC16 lands in ``slot``."""
    candidate = 0
    while True:
        tag = format(candidate, "x").encode()
        if crc16(tag) % SLOTS == slot:
            return tag
        candidate += 1


@dataclass(frozen=True)
class KeyFamily:
    """The active key of a filter and the companion keys that share its slot."""

    active: bytes
    prefix: bytes  # companion names are prefix + b":" + role
    tagged: bool  # True when the active key already carried a valid hash tag

    @classmethod
    def of(cls, key: str | bytes) -> KeyFamily:
        raw = to_bytes(key)
        if not raw:
            raise UsageError("a key name must not be empty")
        if hash_tag(raw) is not None:
            return cls(active=raw, prefix=raw, tagged=True)
        if b"}" not in raw:
            return cls(active=raw, prefix=b"{" + raw + b"}", tagged=False)
        # The whole key is hashed but "}" would end a wrapping tag early: pick a tag for its slot.
        return cls(active=raw, prefix=b"{" + _tag_for_slot(key_slot(raw)) + b"}" + raw, tagged=False)

    def companion(self, role: str) -> bytes:
        return self.prefix + b":" + role.encode()

    @property
    def standby(self) -> bytes:
        return self.companion("standby")

    @property
    def old(self) -> bytes:
        return self.companion("old")

    @property
    def lock(self) -> bytes:
        return self.companion("lock")

    @property
    def meta(self) -> bytes:
        return self.companion("meta")

    @property
    def standby_meta(self) -> bytes:
        return self.companion("standby:meta")

    @property
    def old_meta(self) -> bytes:
        return self.companion("old:meta")

    @property
    def standby_log(self) -> bytes:
        """A cuckoo standby's log of the application's writes during its rebuild (docs/cuckoo.md)."""
        return self.companion("standby:log")

    @property
    def slot(self) -> int:
        return key_slot(self.active)

    def all_keys(self) -> dict[str, bytes]:
        return {
            "active": self.active,
            "standby": self.standby,
            "old": self.old,
            "lock": self.lock,
            "meta": self.meta,
            "standby_meta": self.standby_meta,
            "old_meta": self.old_meta,
        }
