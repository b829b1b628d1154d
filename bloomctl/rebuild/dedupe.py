"""Which items a rebuild has loaded: exact de-duplication of a stream, in bounded client memory.

A cuckoo filter counts: an item inserted twice holds two slots, and CF.INSERTNX (insert if "not
present") skips a new item whose fingerprint merely collides with another's, which a later delete
of that other item then turns into a false negative. So a cuckoo rebuild inserts every distinct
source item exactly once (CF.INSERT), and needs to know exactly which items it has seen: here, a
128-bit BLAKE2b digest per item, keyed with a random key per run (two distinct items share one
with a chance of about n^2 / 2^129). With numpy, digests are kept as two 64-bit words in sorted
runs (16 bytes an item, a merge briefly doubles the largest run); without it, in a set (about 100
bytes an item). The digests stay until the rebuild's end: the replay of the
application's deletes asks which items the standby holds.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from bloomctl import extras
from bloomctl.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover - numpy is loaded only where it is installed
    import numpy as np
    from numpy.typing import NDArray

    Words = NDArray[np.uint64]  # one 64-bit word of each item's digest

NUMPY_BYTES_PER_ITEM = 32  # 16 a digest, and the largest run's copy while it merges
PYTHON_BYTES_PER_ITEM = 100  # a set entry and a 16-byte bytes object


def _over(items: int, limit: int) -> UsageError:
    return UsageError(
        "de-duplicating the source takes more than `client_memory` (%s bytes) after %s distinct items: raise "
        "`client_memory`, or de-duplicate the source first (SELECT DISTINCT)",
        f"{limit:,}",
        f"{items:,}",
    )


class Seen:
    """The distinct items of a stream so far: ``fresh(batch)`` keeps the first sight of each."""

    def __init__(self, memory_limit: int) -> None:
        self.limit = memory_limit
        self.items = 0  # distinct
        self.duplicates = 0
        self._numpy = extras.available(extras.CLIENT_BUILD)
        self._digests: set[bytes] = set()
        self._runs: list[tuple[Words, Words]] = []  # each run's first words sorted, its second words in their order
        self._key = os.urandom(16)  # a digest no source can aim collisions at

    @property
    def memory_bytes(self) -> int:
        return self.items * (NUMPY_BYTES_PER_ITEM if self._numpy else PYTHON_BYTES_PER_ITEM)

    def fresh(self, batch: list[bytes]) -> list[bytes]:
        """The items of ``batch`` not seen before (the first of repeats within it too), in order."""
        kept = self._fresh_numpy(batch) if self._numpy else self._fresh_python(batch)
        self.duplicates += len(batch) - len(kept)
        self.items += len(kept)
        if self.memory_bytes > self.limit:
            raise _over(self.items, self.limit)
        return kept

    def __contains__(self, item: bytes) -> bool:
        return self.contains([item])[0]

    def contains(self, items: list[bytes]) -> list[bool]:
        """Whether each item has been seen (without marking it)."""
        if not items:
            return []
        if not self._numpy:
            return [hashlib.blake2b(item, digest_size=16, key=self._key).digest() in self._digests for item in items]
        if not self._runs:
            return [False] * len(items)
        import numpy as np

        a, b = self._hash(items)
        order = np.argsort(a, kind="stable")
        found = np.zeros(len(items), dtype=bool)
        found[order] = self._in_runs(a[order], b[order])
        return [bool(x) for x in found]

    def batches(self, batches: Iterator[list[bytes]]) -> Iterator[list[bytes]]:
        for batch in batches:
            kept = self.fresh(list(batch))
            if kept:
                yield kept

    # --- without numpy ------------------------------------------------------------------------

    def _fresh_python(self, batch: list[bytes]) -> list[bytes]:
        kept = []
        for item in batch:
            digest = hashlib.blake2b(item, digest_size=16, key=self._key).digest()
            if digest not in self._digests:
                self._digests.add(digest)
                kept.append(item)
        return kept

    # --- with numpy ---------------------------------------------------------------------------

    def _hash(self, batch: list[bytes]) -> tuple[Words, Words]:
        """Each item's 128-bit digest as two 64-bit words: BLAKE2b keyed with this run's random key
        (MurmurHash64A has collisions that hold for every seed, so two of its words are no 128 bits)."""
        import numpy as np

        key = self._key
        joined = b"".join([hashlib.blake2b(item, digest_size=16, key=key).digest() for item in batch])
        words = np.frombuffer(joined, dtype="<u8").reshape(-1, 2)
        return words[:, 0], words[:, 1]

    def _in_runs(self, a: Words, b: Words) -> NDArray[np.bool_]:
        """Which (a, b) pairs some run holds; ``a`` sorted (searchsorted is far faster so)."""
        import numpy as np

        found = np.zeros(len(a), dtype=bool)
        for run_a, run_b in self._runs:
            lo = np.searchsorted(run_a, a, "left")
            inside = np.minimum(lo, len(run_a) - 1)
            hit = (lo < len(run_a)) & (run_a[inside] == a)
            found |= hit & (run_b[inside] == b)
            after = np.minimum(inside + 1, len(run_a) - 1)
            for i in np.nonzero(hit & (inside + 1 < len(run_a)) & (run_a[after] == a))[0]:
                hi = np.searchsorted(run_a, a[i], "right")  # the same first word twice: compare the second
                found[i] |= bool(np.any(run_b[lo[i] : hi] == b[i]))
        return found

    def _fresh_numpy(self, batch: list[bytes]) -> list[bytes]:
        import numpy as np

        if not batch:
            return []
        a, b = self._hash(batch)
        order = np.argsort(a, kind="stable")  # repeats side by side, the first sight first
        sa, sb = a[order], b[order]
        keep_sorted = np.ones(len(batch), dtype=bool)
        same = sa[1:] == sa[:-1]
        if np.any(same & (sb[1:] != sb[:-1])):  # two items share a first word: compare both words
            pairs = np.empty(len(batch), dtype=[("a", "<u8"), ("b", "<u8")])
            pairs["a"], pairs["b"] = sa, sb
            _unique, first = np.unique(pairs, return_index=True)
            keep_sorted[:] = False
            keep_sorted[first] = True
        else:
            keep_sorted[1:][same] = False
        if self._runs:
            keep_sorted &= ~self._in_runs(sa, sb)
        if np.any(keep_sorted):
            self._add_run(sa[keep_sorted], sb[keep_sorted])
        keep = np.zeros(len(batch), dtype=bool)
        keep[order[keep_sorted]] = True
        return [batch[i] for i in np.nonzero(keep)[0].tolist()]

    def _add_run(self, a: Words, b: Words) -> None:
        """A new sorted run (``a`` sorted already), merged with the last while they are alike in size."""
        import numpy as np

        self._runs.append((a, b))
        while len(self._runs) > 1 and len(self._runs[-2][0]) <= 2 * len(self._runs[-1][0]):
            (a1, b1), (a2, b2) = self._runs.pop(), self._runs.pop()
            merged_a, merged_b = np.concatenate([a2, a1]), np.concatenate([b2, b1])
            order = np.argsort(merged_a, kind="stable")
            self._runs.append((merged_a[order], merged_b[order]))
