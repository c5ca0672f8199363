"""The request-level token cache: (tokenizer version, text) -> int32 token ids, bounded in bytes.

The text in the key is exactly the text that gets tokenized: normalizing it (NFC, zero-width removal, as the
response-cache key does) would return the ids of a different string, which the model would then see. The
tokenizer version is part of the key, so an upgraded tokenizer misses instead of returning stale ids.
Values are `array('i')`: 4 bytes per id; the stored size counts the key text too.

Eviction is CLOCK (second-chance FIFO), the classic LRU approximation: a hit is one dict lookup and one flag
store, with no reordering. cachetools' `LRUCache` reorders on every hit from Python code and costs ~3-5x
more per hit, which matters when the thing being cached (a short encode) takes only a few microseconds
(numbers in bench/token_path.py).
"""

from __future__ import annotations

import sys
from array import array

ENTRY_OVERHEAD_BYTES = 200  # tuple key, dict slot, the entry list, array header


def entry_bytes(text: str, ids: array[int]) -> int:
    return sys.getsizeof(text) + ids.itemsize * len(ids) + ENTRY_OVERHEAD_BYTES


class TokenCache:
    __slots__ = ("_entries", "bytes", "hits", "max_bytes", "max_text_chars", "misses")

    def __init__(self, max_bytes: int, *, max_text_chars: int = 256 * 1024) -> None:
        self._entries: dict[tuple[str, str], list] = {}  # key -> [size, ids, referenced]; insertion order = clock
        self.max_bytes = max_bytes
        self.max_text_chars = max_text_chars  # longer texts are encoded every time, never stored
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, version: str, text: str) -> array[int] | None:
        entry = self._entries.get((version, text))
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
        key = (version, text)
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[0]
        self._evict(self.max_bytes - size)
        self._entries[key] = [size, ids, False]
        self.bytes += size

    def discard(self, version: str, text: str) -> None:
        old = self._entries.pop((version, text), None)
        if old is not None:
            self.bytes -= old[0]

    def _evict(self, budget: int) -> None:
        """Second chance: the oldest entry goes unless it was hit since its last pass, then it moves to the back."""
        entries = self._entries
        while self.bytes > budget and entries:
            key = next(iter(entries))
            entry = entries.pop(key)
            if entry[2]:
                entry[2] = False
                entries[key] = entry
            else:
                self.bytes -= entry[0]

    def __len__(self) -> int:
        return len(self._entries)
