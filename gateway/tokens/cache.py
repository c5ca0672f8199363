"""The request-level token cache: (tokenizer version, text) -> int32 token ids, in a byte-bounded LRU.

The text in the key is exactly the text that gets tokenized: normalizing it (NFC, zero-width removal, as the
response-cache key does) would return the ids of a different string, which the model would then see. The
tokenizer version is part of the key, so an upgraded tokenizer misses instead of returning stale ids.
Values are `array('i')`: 4 bytes per id, and the stored size counts the key text too.
"""

from __future__ import annotations

import sys
from array import array

from cachetools import LRUCache

ENTRY_OVERHEAD_BYTES = 200  # tuple, dict slot, LRU bookkeeping, array header


def entry_bytes(key: tuple[str, str], ids: array[int]) -> int:
    return sys.getsizeof(key[1]) + ids.itemsize * len(ids) + ENTRY_OVERHEAD_BYTES


class TokenCache:
    __slots__ = ("_lru", "hits", "max_text_chars", "misses")

    def __init__(self, max_bytes: int, *, max_text_chars: int = 256 * 1024) -> None:
        self._lru: LRUCache[tuple[str, str], array[int]] = LRUCache(maxsize=max(max_bytes, 1), getsizeof=entry_bytes)
        self.max_text_chars = max_text_chars  # longer texts are encoded every time, never stored
        self.hits = 0
        self.misses = 0

    def get(self, version: str, text: str) -> array[int] | None:
        ids = self._lru.get((version, text))
        if ids is None:
            self.misses += 1
        else:
            self.hits += 1
        return ids

    def put(self, version: str, text: str, ids: array[int]) -> None:
        if len(text) <= self.max_text_chars and entry_bytes((version, text), ids) <= self._lru.maxsize:
            self._lru[(version, text)] = ids

    @property
    def bytes(self) -> int:
        return int(self._lru.currsize)

    def __len__(self) -> int:
        return len(self._lru)
