"""The stream recorder: keeps a stream's `data:` payloads and assembles the JSON answer they make.

Pure and incremental: the tee feeds each payload as it is forwarded. The recorder keeps the payloads (the chunk
boundaries a streamed hit replays) and merges every field of every chunk, unknown ones included, by the rules of
`gateway.misses.streaming.forms` (strings concatenate, calls merge by index, scalars from the chunk that carries
them); `convertible` says whether that JSON answer is exact. Past the byte cap it drops everything it holds and only
keeps the flags, since nothing will be stored.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Protocol

import orjson

from gateway.misses.streaming.forms import CHAT, Assembler
from gateway.misses.streaming.sse import DONE

__all__ = ["CHAT", "Kind", "Recorder", "StreamRecorder", "is_usage_only", "json_object"]


class Kind(Enum):
    CHUNK = "chunk"  # a completion chunk, forwarded and recorded
    USAGE = "usage"  # a usage-only chunk (`choices: []`): only clients that asked for usage receive it
    DONE = "done"  # the `[DONE]` sentinel
    ERROR = "error"  # an error event inside the 200 stream


def json_object(payload: bytes) -> dict[str, Any] | None:
    """A data payload as a JSON object; None when it is not JSON, or JSON but not an object (what a recorder
    forwards and never stores)."""
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


class StreamRecorder(Protocol):
    """What the tee needs of a recorder: this module's for completions, `gateway.misses.streaming.responses`' for Responses."""

    chunks: list[bytes]
    usage: dict[str, Any] | None
    done: bool
    error: bool
    too_large: bool

    def feed(self, payload: bytes) -> Kind: ...

    @property
    def complete(self) -> bool: ...

    @property
    def convertible(self) -> bool: ...

    @property
    def finish_reasons(self) -> list[str | None]: ...

    @property
    def recorded_bytes(self) -> int: ...

    def discard(self) -> None: ...

    def body(self) -> bytes: ...


def is_usage_only(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("choices") == [] and isinstance(doc.get("usage"), dict)


class Recorder:
    def __init__(self, endpoint: str, max_bytes: int) -> None:
        self.endpoint = endpoint
        self.max_bytes = max_bytes
        self.chunks: list[bytes] = []
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error = False  # an error event, or a payload that is not a JSON object
        self.too_large = False
        self._bytes = 0
        self._assembler = Assembler(endpoint)

    def feed(self, payload: bytes) -> Kind:
        """Record one data payload; its kind tells the tee how to forward it."""
        if payload.strip() == DONE:
            self.done = True
            return Kind.DONE
        doc = json_object(payload)
        if doc is None or self.done:
            self.error = True  # not a completion chunk, or data after [DONE]: forwarded, never stored
            return Kind.CHUNK
        if doc.get("error") is not None:  # policy.error_body's rule, for a chunk
            self.error = True
            return Kind.ERROR
        self._record(payload)
        if not self.too_large:
            if isinstance(doc.get("usage"), dict):
                self.usage = doc["usage"]
            self._assembler.feed(doc)
        return Kind.USAGE if is_usage_only(doc) else Kind.CHUNK

    @property
    def complete(self) -> bool:
        """A clean end: [DONE] seen, no error, and every choice finished (design §4)."""
        choices = self._assembler.choices
        return (
            self.done
            and not self.error
            and not self.too_large
            and bool(choices)
            and all(c.finish_reason is not None for c in choices.values())
        )

    @property
    def convertible(self) -> bool:
        """Whether `body` is the exact JSON form of the stream (`forms`: no member of unknown merge rule twice)."""
        return self._assembler.convertible

    @property
    def finish_reasons(self) -> list[str | None]:
        return [c.finish_reason for c in self._assembler.choices.values()]

    @property
    def recorded_bytes(self) -> int:
        return self._bytes

    def discard(self) -> None:
        """Drop the partial data (called in the tee's `finally`, whatever the outcome)."""
        self.chunks = []
        self._assembler = Assembler(self.endpoint)

    def body(self) -> bytes:
        """The assembled non-stream completion (`chat.completion` or `text_completion`), every field kept."""
        return orjson.dumps(self._assembler.body())

    def _record(self, payload: bytes) -> None:
        self._bytes += len(payload)
        if self._bytes > self.max_bytes:
            self.too_large = True
            self.discard()
        elif not self.too_large:
            self.chunks.append(payload)
