"""The request memo: identical request bytes skip parsing, validation and canonicalization.

Clients that repeat a question usually repeat it byte for byte, so the memo maps the raw body to the parsed body
and, once a lookup needed them, the canonical bytes (with the level and tokenizer version they were built at: at
the `tokens` level they hold the prompt's token ids, so repeated bytes are not tokenized again) and the last key
derived from them (with the scope, revision and tokenizer it was derived for). It is exact (a dict lookup
on the bytes themselves, so no hash collision can alias two requests; the endpoint is checked on the record) and
bounded by the bytes it really holds: the raw body, the parsed JSON tree, the canonical bytes and the key, as the
allocator sizes them (`gateway.keys.sizing`; tests/gateway/test_memo.py checks it against tracemalloc), plus the
record and its LRU slot. Growth after insertion (canonical bytes, a key) is charged when it happens.
Correctness does not depend on it: a miss here only means the slow path runs.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from gateway.keys.canonical import Level
from gateway.keys.derive import CacheKey
from gateway.keys.sizing import compact, held, json_held

MAX_MEMO_BODY_BYTES = 64 * 1024
# What a key was derived for besides the body: (scope, revision, tokenizer identity, the headers' and query's key
# material, gateway.keys.parts.wire_material).
KeyContext = tuple[str, str, str, bytes]
SLOT_BYTES = 104  # an OrderedDict slot (see gateway.tiers.memory)


@dataclass(slots=True)
class ParsedRequest:
    endpoint: str
    body: dict[str, Any]
    size: int = 0  # bytes charged to the memo for this record (0 until stored)
    canonical: bytes | None = None  # filled the first time a lookup derives the key
    canonical_level: Level | None = None  # the level `canonical` was built at
    # The tokenizer version (or remote identity) it was built with; "" where none applies, or after a remote
    # tokenization failed (the next sight of these bytes on the ordinary path asks again).
    canonical_tokenizer: str = ""
    key: CacheKey | None = None  # the last key derived, for `key_context`
    key_level: Level | None = None
    key_context: KeyContext | None = None
    fast: object = (
        None  # gateway.edge.fastlane's policy decision without request directives, once it has looked
    )


def _key_bytes(key: CacheKey | None) -> int:
    return 0 if key is None else held(key) + held(key.scope) + held(key.digest)


def _context_bytes(context: KeyContext | None) -> int:
    """The tuple (its strings are shared: the scope is the key's, the revision the catalog's, the tokenizer
    version the registry's) and the wire bytes, which are this record's own."""
    return 0 if context is None else held(context) + held(context[3])


class RequestMemo:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.enabled = max_bytes > 0
        self._records: OrderedDict[bytes, ParsedRequest] = OrderedDict()
        self._bytes = 0

    def get(self, endpoint: str, raw: bytes) -> ParsedRequest | None:
        parsed = self._records.get(raw) if self.enabled else None
        if parsed is None or parsed.endpoint != endpoint:
            return None
        self._records.move_to_end(raw)
        return parsed

    def put(self, endpoint: str, raw: bytes, parsed: ParsedRequest) -> None:
        if not self.enabled or len(raw) > MAX_MEMO_BODY_BYTES:
            return
        old = self._records.pop(raw, None)
        if old is not None:
            self._bytes -= old.size
        parsed.size = held(raw) + held(parsed) + json_held(parsed.body) + SLOT_BYTES
        self._records[raw] = parsed
        self._bytes += parsed.size
        self._evict()

    def set_canonical(self, parsed: ParsedRequest, canonical: bytes, level: Level, tokenizer: str) -> bytes:
        canonical = compact(canonical)  # orjson output keeps its growth buffer (gateway.keys.sizing)
        self._charge(
            parsed, held(canonical) - (held(parsed.canonical) if parsed.canonical is not None else 0)
        )
        parsed.canonical, parsed.canonical_level, parsed.canonical_tokenizer = canonical, level, tokenizer
        return canonical

    def set_key(self, parsed: ParsedRequest, key: CacheKey, level: Level, context: KeyContext) -> None:
        self._charge(
            parsed,
            _key_bytes(key)
            + _context_bytes(context)
            - _key_bytes(parsed.key)
            - _context_bytes(parsed.key_context),
        )
        parsed.key, parsed.key_level, parsed.key_context = key, level, context

    def _charge(self, parsed: ParsedRequest, delta: int) -> None:
        """Grow a record (only those stored count) and evict least recently used records down to the budget."""
        if parsed.size == 0:
            return
        parsed.size += delta
        self._bytes += delta
        self._evict()

    def _evict(self) -> None:
        while self._bytes > self.max_bytes and self._records:
            _, oldest = self._records.popitem(last=False)
            self._bytes -= oldest.size
            oldest.size = 0

    def entries(self) -> int:
        return len(self._records)

    def bytes_used(self) -> int:
        return self._bytes
