"""The request memo: identical request bytes skip parsing, validation and canonicalization.

Clients that repeat a question usually repeat it byte for byte, so the memo maps (endpoint, raw body) to the parsed
body and, once a lookup needed it, the canonical bytes and the level they were built at (at the `tokens` level those
hold the prompt's token ids, so repeated bytes are not tokenized again). It is exact (a dict lookup on the bytes themselves, so
no hash collision can alias two requests) and bounded by bytes. Correctness does not depend on it: a miss here
only means the slow path runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cachetools import LRUCache

from gateway.canonical import Level
from gateway.keys import CacheKey

MAX_MEMO_BODY_BYTES = 64 * 1024


@dataclass(slots=True)
class ParsedRequest:
    body: dict[str, Any]
    size: int
    # tokenizer version ("" where none applies) -> (level used, canonical bytes); filled when a lookup needs them
    canonical: dict[str, tuple[Level, bytes]] = field(default_factory=dict)
    # (scope, revision, tokenizer version) -> (derived key, level used)
    keys: dict[tuple[str, str, str], tuple[CacheKey, Level]] = field(default_factory=dict)


class RequestMemo:
    def __init__(self, max_bytes: int) -> None:
        self._cache: LRUCache[tuple[str, bytes], ParsedRequest] = LRUCache(
            maxsize=max(max_bytes, 1), getsizeof=lambda parsed: parsed.size)
        self.enabled = max_bytes > 0

    def get(self, endpoint: str, raw: bytes) -> ParsedRequest | None:
        return self._cache.get((endpoint, raw)) if self.enabled else None

    def put(self, endpoint: str, raw: bytes, parsed: ParsedRequest) -> None:
        if self.enabled and len(raw) <= MAX_MEMO_BODY_BYTES:
            self._cache[(endpoint, raw)] = parsed
