"""Client-facing OpenAI bodies from binary-transport events, byte for byte what the backend's JSON path writes.

The backend's JSON path (backend/server/completions.py) answers with `json.dumps(body)` (aiohttp's
`json_response`) and streams `data: {compact, non-ASCII kept}` frames; these functions build the same bytes
from the same events, so a greedy request answered over either transport reaches the client unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from tokenedge_wire.framing import WireError

JSON_CONTENT_TYPE = "application/json; charset=utf-8"
SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


@dataclass(slots=True)
class Rendering:
    endpoint: str  # "chat" | "completion"
    n: int
    include_usage: bool
    meta: dict[str, Any] = field(default_factory=dict)  # set by `set_meta`
    texts: list[str] = field(default_factory=list)
    finish: list[str | None] = field(default_factory=list)
    plain_meta: bool = False  # plain_json(meta), found once per stream, not per chunk

    def __post_init__(self) -> None:
        self.texts = [""] * self.n
        self.finish = [None] * self.n

    def set_meta(self, meta: dict[str, Any]) -> None:
        """The stream's meta (id, created, model, ...), from the engine's meta frame."""
        self.meta = meta
        self.plain_meta = plain_json(meta)

    @property
    def stream_object(self) -> str:
        return "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"

    def _parts(self, event: dict[str, Any]) -> tuple[int, str, str | None]:
        """(choice index, text, finish reason) of a text event; a malformed one is a WireError (a 502), never a 500."""
        i, text, finish = event.get("i"), event.get("t"), event.get("f")
        if not (
            isinstance(i, int)
            and 0 <= i < self.n
            and isinstance(text, str)
            and (finish is None or isinstance(finish, str))
        ):
            raise WireError(f"malformed text event: {str(event)[:200]}")
        return i, text, finish

    def add(self, event: dict[str, Any]) -> None:
        i, text, finish = self._parts(event)
        self.texts[i] += text
        self.finish[i] = finish or self.finish[i]

    def body(self, usage: dict[str, Any]) -> bytes:
        if self.endpoint == "chat":
            choices = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": t},
                    "logprobs": None,
                    "finish_reason": self.finish[i],
                }
                for i, t in enumerate(self.texts)
            ]
            obj = "chat.completion"
        else:
            choices = [
                {"index": i, "text": t, "logprobs": None, "finish_reason": self.finish[i]}
                for i, t in enumerate(self.texts)
            ]
            obj = "text_completion"
        return json.dumps({**self.meta, "object": obj, "choices": choices, "usage": usage}).encode()

    def _sse(self, payload: dict[str, Any], *, plain: bool = False) -> bytes:
        """`data: {compact JSON, non-ASCII kept}`: orjson where it writes json.dumps' bytes (`plain`: no float, no
        integer past 64 bits, which the two spell differently or orjson refuses), else json.dumps."""
        if plain:
            return b"data: " + orjson.dumps(payload) + b"\n\n"
        return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()

    def _chunk(self, choices: list[dict[str, Any]]) -> bytes:
        """A chunk: the stream's meta and choices this module builds (ints, strings, null)."""
        extra = {"usage": None} if self.include_usage else {}
        payload = {**self.meta, "object": self.stream_object, "choices": choices, **extra}
        return self._sse(payload, plain=self.plain_meta)

    def stream_start(self) -> Iterator[bytes]:
        if self.endpoint == "chat":
            yield self._chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                    for i in range(self.n)
                ]
            )

    def stream_event(self, event: dict[str, Any]) -> Iterator[bytes]:
        i, text, finish = self._parts(event)
        if not (text or finish):
            return
        if self.endpoint == "chat":
            delta = {"content": text} if text else {}
            choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": i, "text": text, "logprobs": None, "finish_reason": finish}
        yield self._chunk([choice])

    def stream_end(self, usage: dict[str, Any]) -> Iterator[bytes]:
        if self.include_usage:
            payload = {**self.meta, "object": self.stream_object, "choices": [], "usage": usage}
            yield self._sse(payload, plain=plain_json(payload))
        yield b"data: [DONE]\n\n"

    def stream_error(self, error: dict[str, Any]) -> bytes:
        return self._sse(error)


_INT64 = range(-(2**63), 2**64)


def plain_json(value: Any) -> bool:
    """Whether orjson writes `value` exactly as json.dumps(ensure_ascii=False, separators=(",", ":")) does: strings
    (every code point), bools, null, dicts with string keys and lists are spelled alike; floats are not (`1e-05`
    against `1e-5`) and orjson refuses integers past 64 bits."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain_json(v) for k, v in value.items())
    if isinstance(value, list):
        return all(plain_json(v) for v in value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    return isinstance(value, int) and value in _INT64
