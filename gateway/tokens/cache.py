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


def entry_bytes(text: str, ids: array[int]) -> int:
    return sys.getsizeof(text) + ids.itemsize * len(ids) + ENTRY_OVERHEAD_BYTES


def _stored_size(value: tuple[int, array[int]]) -> int:
    return value[0]


class TokenCache:
    __slots__ = ("_lru", "hits", "max_text_chars", "misses")

    def __init__(self, max_bytes: int, *, max_text_chars: int = 256 * 1024) -> None:
        # values are (size in bytes of key text + ids, ids): cachetools sizes values only
        self._lru: LRUCache[tuple[str, str], tuple[int, array[int]]] = LRUCache(maxsize=max(max_bytes, 1),
                                                                                 getsizeof=_stored_size)
        self.max_text_chars = max_text_chars  # longer texts are encoded every time, never stored
        self.hits = 0
        self.misses = 0

    def get(self, version: str, text: str) -> array[int] | None:
        entry = self._lru.get((version, text))
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        return entry[1]

    def put(self, version: str, text: str, ids: array[int]) -> None:
        size = entry_bytes(text, ids)
        if len(text) <= self.max_text_chars and size <= self._lru.maxsize:
            self._lru[(version, text)] = (size, ids)

    @property
    def bytes(self) -> int:
        return int(self._lru.currsize)

    def __len__(self) -> int:
        return len(self._lru)
