"""The request-level token cache: (tokenizer version, text) -> int32 token ids, bounded in bytes.

The text in the key is exactly the text that gets tokenized: normalizing it (NFC, zero-width removal, as the
response-cache key does) would return the ids of a different string, which the model would then see. The
tokenizer version is part of the key, so an upgraded tokenizer misses instead of returning stale ids.
Values are `array('i')`: 4 bytes per id; the stored size counts the key text too.

Eviction is CLOCK (second-chance FIFO), the classic LRU approximation: a hit is one dict lookup and one flag
store, with no reordering. cachetools' `LRUCache` reorders on every hit from Python code and costs ~3-5x
more per hit, which matters when the thing being cached (a short encode) takes only a few microseconds
(numbers in bench/scenarios/token_path.py).
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

ENTRY_OVERHEAD_BYTES = 200  # tuple key, dict slot, the entry list, array header


def entry_bytes(text: str, ids: array[int]) -> int:
    return sys.getsizeof(text) + ids.itemsize * len(ids) + ENTRY_OVERHEAD_BYTES


class TokenCache:
    """One table per tokenizer version (the version is the first half of the key), one byte budget for all."""

    __slots__ = ("_tables", "bytes", "hits", "max_bytes", "max_text_chars", "misses")

    def __init__(self, max_bytes: int, *, max_text_chars: int = 256 * 1024) -> None:
        self._tables: dict[str, dict[str, list[Any]]] = {}  # version -> text -> [size, ids, referenced]
        self.max_bytes = max_bytes
        self.max_text_chars = max_text_chars  # longer texts are encoded every time, never stored
        self.bytes = 0
        self.hits = 0  # counted by `get`; the encoder's inlined hit path does not count (it is the hot path)
        self.misses = 0

    def table(self, version: str) -> dict[str, list[Any]]:
        """The version's table, for a caller that inlines the hit path (one dict lookup, one flag store)."""
        return self._tables.setdefault(version, {})

    def get(self, version: str, text: str) -> array[int] | None:
        entry = self._tables.get(version, {}).get(text)
        if entry is None:
            self.misses += 1
            return None
        entry[2] = True
        self.hits += 1
        return entry[1]

    def put(self, version: str, text: str, ids: array[int]) -> None:
        size = entry_bytes(text, ids)
        if len(text) > self.max_text_chars or size > self.max_bytes:
            return
        table = self.table(version)
        old = table.pop(text, None)
        if old is not None:
            self.bytes -= old[0]
        self._evict(self.max_bytes - size)
        table[text] = [size, ids, False]
        self.bytes += size

    def discard(self, version: str, text: str) -> None:
        old = self._tables.get(version, {}).pop(text, None)
        if old is not None:
            self.bytes -= old[0]

    def _evict(self, budget: int) -> None:
        """Oldest version first (an upgrade leaves its predecessor's ids useless), CLOCK within a version: the
        oldest entry goes unless it was hit since its last pass, in which case it moves to the back."""
        for table in self._tables.values():
            while self.bytes > budget and table:
                text = next(iter(table))
                entry = table.pop(text)
                if entry[2]:
                    entry[2] = False
                    table[text] = entry
                else:
                    self.bytes -= entry[0]
            if self.bytes <= budget:
                return

    def __len__(self) -> int:
        return sum(len(t) for t in self._tables.values())
