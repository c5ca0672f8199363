"""Stored responses (`store: true`, OpenAI's default): a bounded in-memory LRU, by count and by bytes.

Each entry keeps the Response object (for `GET /v1/responses/{id}`) and its conversation, the input items and
then the output items, which `previous_response_id` prepends to the next request's input. A response larger than
the byte bound is not kept at all. Pure state, no I/O; the handlers are its only users (one event loop).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: dict[str, Any]
    conversation: tuple[dict[str, Any], ...]  # input items, then output items
    size_bytes: int


@dataclass(frozen=True, slots=True)
class StoreLimits:
    max_count: int = 1024
    max_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_count < 1 or self.max_bytes < 1:
            raise ValueError(f"invalid response store limits: {self}")


class ResponseStore:
    def __init__(self, limits: StoreLimits) -> None:
        self.limits = limits
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.size_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response: Mapping[str, Any], conversation: Sequence[Mapping[str, Any]]) -> bool:
        """Keep a response under its id, evicting the least recently used; False if it alone is too big."""
        entry = StoredResponse(dict(response), tuple(dict(i) for i in conversation), 0)
        size = len(json.dumps([entry.response, entry.conversation], separators=(",", ":")).encode())
        if size > self.limits.max_bytes:
            return False
        self.delete(response["id"])
        self._entries[response["id"]] = StoredResponse(entry.response, entry.conversation, size)
        self.size_bytes += size
        while len(self._entries) > self.limits.max_count or self.size_bytes > self.limits.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.size_bytes -= evicted.size_bytes
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self.size_bytes -= entry.size_bytes
        return True
