"""The stream recorder: assembles the canonical non-stream completion from a stream's `data:` payloads.

Pure and incremental: the tee feeds each payload as it is forwarded. The recorder keeps the payloads (the chunk
boundaries a streamed hit replays) and merges the deltas the way the OpenAI clients accumulate them: content and
refusal concatenated, `tool_calls` assembled per index (id and type set once, name and arguments concatenated),
the last `finish_reason` per choice, logprob lists concatenated, and `usage` from the chunk that carries it.
Past the byte cap it drops everything it holds and only keeps the flags, since nothing will be stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

import orjson

from gateway.misses.streaming.sse import DONE

CHAT = "chat/completions"


class Kind(Enum):
    CHUNK = "chunk"  # a completion chunk, forwarded and recorded
    USAGE = "usage"  # a usage-only chunk (`choices: []`): only clients that asked for usage receive it
    DONE = "done"  # the `[DONE]` sentinel
    ERROR = "error"  # an error event inside the 200 stream


@dataclass(slots=True)
class _Choice:
    role: str | None = None
    content: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


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
        self._head: dict[str, Any] = {}
        self._choices: dict[int, _Choice] = {}

    def feed(self, payload: bytes) -> Kind:
        """Record one data payload; its kind tells the tee how to forward it."""
        if payload.strip() == DONE:
            self.done = True
            return Kind.DONE
        doc = json_object(payload)
        if doc is None or self.done:
            self.error = True  # not a completion chunk, or data after [DONE]: forwarded, never stored
            return Kind.CHUNK
        if doc.get("error"):
            self.error = True
            return Kind.ERROR
        self._record(payload)
        if not self.too_large:
            self._merge(doc)
        return Kind.USAGE if is_usage_only(doc) else Kind.CHUNK

    @property
    def complete(self) -> bool:
        """A clean end: [DONE] seen, no error, and every choice finished (DESIGN §4)."""
        return (
            self.done
            and not self.error
            and not self.too_large
            and bool(self._choices)
            and all(c.finish_reason is not None for c in self._choices.values())
        )

    @property
    def finish_reasons(self) -> list[str | None]:
        return [c.finish_reason for c in self._choices.values()]

    @property
    def recorded_bytes(self) -> int:
        return self._bytes

    def discard(self) -> None:
        """Drop the partial data (called in the tee's `finally`, whatever the outcome)."""
        self.chunks = []
        self._choices = {}
        self._head = {}

    def body(self) -> bytes:
        """The assembled non-stream completion (`chat.completion` or `text_completion`)."""
        choices = [self._choice_body(i, c) for i, c in sorted(self._choices.items())]
        doc: dict[str, Any] = {
            "id": self._head.get("id"),
            "object": "chat.completion" if self.endpoint == CHAT else "text_completion",
            "created": self._head.get("created"),
            "model": self._head.get("model"),
        }
        if self._head.get("system_fingerprint") is not None:
            doc["system_fingerprint"] = self._head["system_fingerprint"]
        doc["choices"] = choices
        if self.usage is not None:
            doc["usage"] = self.usage
        return orjson.dumps(doc)

    def _record(self, payload: bytes) -> None:
        self._bytes += len(payload)
        if self._bytes > self.max_bytes:
            self.too_large = True
            self.discard()
        elif not self.too_large:
            self.chunks.append(payload)

    def _merge(self, doc: dict[str, Any]) -> None:
        for name in ("id", "created", "model", "system_fingerprint"):
            if name not in self._head and doc.get(name) is not None:
                self._head[name] = doc[name]
        if isinstance(doc.get("usage"), dict):
            self.usage = doc["usage"]
        for raw in doc.get("choices") or ():
            if not isinstance(raw, dict):
                continue
            index = raw.get("index", 0)
            choice = self._choices.setdefault(index if isinstance(index, int) else 0, _Choice())
            if self.endpoint == CHAT:
                _merge_delta(choice, raw.get("delta") or {})
            elif isinstance(raw.get("text"), str):
                choice.content.append(raw["text"])
            if isinstance(raw.get("logprobs"), dict):
                choice.logprobs = _merge_lists(choice.logprobs, raw["logprobs"])
            if raw.get("finish_reason") is not None:
                choice.finish_reason = raw["finish_reason"]

    def _choice_body(self, index: int, c: _Choice) -> dict[str, Any]:
        text = "".join(c.content)
        if self.endpoint != CHAT:
            return {"index": index, "text": text, "logprobs": c.logprobs, "finish_reason": c.finish_reason}
        message: dict[str, Any] = {
            "role": c.role or "assistant",
            "content": text if text or not (c.tool_calls or c.refusal) else None,
        }
        if c.refusal:
            message["refusal"] = "".join(c.refusal)
        if c.tool_calls:
            message["tool_calls"] = [c.tool_calls[i] for i in sorted(c.tool_calls)]
        return {"index": index, "message": message, "logprobs": c.logprobs, "finish_reason": c.finish_reason}


def _merge_delta(choice: _Choice, delta: dict[str, Any]) -> None:
    if isinstance(delta.get("role"), str):
        choice.role = delta["role"]
    if isinstance(delta.get("content"), str):
        choice.content.append(delta["content"])
    if isinstance(delta.get("refusal"), str):
        choice.refusal.append(delta["refusal"])
    for call in delta.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        index = call.get("index", 0)
        slot = choice.tool_calls.setdefault(
            index if isinstance(index, int) else 0,
            {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if call.get("id") is not None:
            slot["id"] = call["id"]
        if call.get("type") is not None:
            slot["type"] = call["type"]
        function = call.get("function") or {}
        for part in ("name", "arguments"):
            if isinstance(function.get(part), str):
                slot["function"][part] += function[part]


def _merge_lists(into: dict[str, Any] | None, part: dict[str, Any]) -> dict[str, Any]:
    """Logprobs arrive as parallel lists per chunk (`content`, or `tokens`/`token_logprobs`/...): concatenate."""
    merged = into if into is not None else {}
    for name, value in part.items():
        if isinstance(value, list):
            if isinstance(merged.get(name), list):
                merged[name].extend(value)
            else:
                merged[name] = list(value)
        elif value is not None or name not in merged:
            merged[name] = value
    return merged
