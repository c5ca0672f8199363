"""The request memo: identical request bytes skip parsing, validation and canonicalization.

Clients that repeat a question usually repeat it byte for byte, so the memo maps (endpoint, raw body) to the parsed
body and, once a lookup needed it, the canonical bytes. It is exact (a dict lookup on the bytes themselves, so
no hash collision can alias two requests) and bounded by bytes. Correctness does not depend on it: a miss here
only means the slow path runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.keys import CacheKey

MAX_MEMO_BODY_BYTES = 64 * 1024


@dataclass(slots=True)
class ParsedRequest:
    body: dict[str, Any]
    size: int
    canonical: bytes | None = None  # filled the first time a lookup derives the key
    keys: dict[tuple[str, str], CacheKey] = field(default_factory=dict)  # (scope, revision) -> derived key
    fast: object = None  # gateway.fastpath's decision without request directives, once it has looked


class RequestMemo:
    """An LRU bounded by bytes over a plain dict (insertion order is recency): a hit is one pop and one insert,
    a third of what cachetools' LRUCache spends on the hit path."""

    def __init__(self, max_bytes: int) -> None:
        self._cache: dict[tuple[str, bytes], ParsedRequest] = {}
        self.max_bytes = max(max_bytes, 1)
        self.size = 0
        self.enabled = max_bytes > 0

    def get(self, endpoint: str, raw: bytes) -> ParsedRequest | None:
        key = (endpoint, raw)
        parsed = self._cache.pop(key, None)
        if parsed is not None:
            self._cache[key] = parsed  # most recent last
        return parsed

    def put(self, endpoint: str, raw: bytes, parsed: ParsedRequest) -> None:
        if not self.enabled or len(raw) > MAX_MEMO_BODY_BYTES or parsed.size > self.max_bytes:
            return
        key = (endpoint, raw)
        old = self._cache.pop(key, None)
        if old is not None:
            self.size -= old.size
        self._cache[key] = parsed
        self.size += parsed.size
        while self.size > self.max_bytes:  # evict least recently used first
            oldest = next(iter(self._cache))
            self.size -= self._cache.pop(oldest).size
