"""The Responses API's event streams: recorded on a miss, replayed (or synthesized) on a hit. Pure.

A Responses stream is a sequence of typed events (`event: response.created`, `response.output_text.delta`, ...)
that ends with one terminal event carrying the whole response object (`response.completed`, or
`response.incomplete` / `response.failed`), and no `[DONE]`. So one entry serves both forms (design §3): its body is
the terminal event's response (what a `stream: false` request gets), its chunks are the event payloads in order
(replayed with their own names). An entry filled by a JSON request is replayed as the event sequence OpenAI streams
for that response: created, in_progress, each output item added, its content parts with their text deltas, done,
then the terminal event.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson

from gateway.misses.streaming.recorder import Kind, json_object
from gateway.misses.streaming.sse import data_frame

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


def response_finish(response: Mapping[str, Any]) -> str:
    """A Responses object's `status` in the finish-reason words `policy.store_refusal` judges.

    `completed` is a finished answer; `incomplete` at `max_output_tokens` is one cut by its length (stored, as a
    chat answer with `finish_reason: length` is); `incomplete` by the content filter is refused as such; `failed`
    is an error, and anything else (`in_progress`, `queued`, `cancelled`) did not finish.
    """
    status = response.get("status")
    if status == "completed":
        return "stop"
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return {"max_output_tokens": "length", "content_filter": "content_filter"}.get(str(reason), "abort")
    return "error" if status == "failed" else "abort"


class ResponsesRecorder:
    """The stream recorder for `/v1/responses` (the tee's interface of `gateway.misses.streaming.recorder.Recorder`)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.chunks: list[bytes] = []
        self.usage: dict[str, Any] | None = None
        self.done = False  # the terminal event was seen
        self.error = False
        self.too_large = False
        self._bytes = 0
        self._response: dict[str, Any] | None = None

    @property
    def convertible(self) -> bool:
        """Always: the terminal event carries the whole response, the JSON form as the upstream answers it."""
        return True

    def feed(self, payload: bytes) -> Kind:
        doc = json_object(payload)
        if doc is None or self.done:
            self.error = True
            return Kind.CHUNK
        kind = doc.get("type")
        if kind == "error" or (kind is None and doc.get("error")):
            self.error = True
            return Kind.ERROR
        self._record(payload)
        if kind in TERMINAL:
            response = doc.get("response")
            if isinstance(response, dict):
                self._response = response
                usage = response.get("usage")
                self.usage = usage if isinstance(usage, dict) else None
            else:
                self.error = True
            self.done = True
            return Kind.DONE
        return Kind.CHUNK

    @property
    def complete(self) -> bool:
        return self.done and not self.error and not self.too_large and self._response is not None

    @property
    def finish_reasons(self) -> list[str | None]:
        return [response_finish(self._response)] if self._response is not None else []

    @property
    def recorded_bytes(self) -> int:
        return self._bytes

    def discard(self) -> None:
        self.chunks = []
        self._response = None

    def body(self) -> bytes:
        """The whole response: what a `stream: false` request for it gets."""
        return orjson.dumps(self._response)

    def _record(self, payload: bytes) -> None:
        self._bytes += len(payload)
        if self._bytes > self.max_bytes:
            self.too_large = True
            self.chunks = []
        elif not self.too_large:
            self.chunks.append(payload)


def response_frames(body: bytes, chunks: Sequence[bytes] | None, *, chunk_chars: int) -> list[bytes]:
    """The SSE frames of a streamed Responses hit: the recorded events under their own names, or synthesized."""
    payloads = (
        list(chunks)
        if chunks is not None
        else [orjson.dumps(e) for e in events(orjson.loads(body), chunk_chars)]
    )
    return [data_frame(p, _event_name(p)) for p in payloads]


def _event_name(payload: bytes) -> str | None:
    doc = orjson.loads(payload)
    kind = doc.get("type") if isinstance(doc, dict) else None
    return kind if isinstance(kind, str) else None


def events(response: Mapping[str, Any], chunk_chars: int) -> Iterator[dict[str, Any]]:
    """The event sequence OpenAI streams for `response`, each with its `sequence_number`."""
    for number, event in enumerate(_events(response, chunk_chars)):
        yield {"type": event.pop("type"), "sequence_number": number, **event}


def _events(response: Mapping[str, Any], chunk_chars: int) -> Iterator[dict[str, Any]]:
    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    opening.pop("incomplete_details", None)
    yield {"type": "response.created", "response": opening}
    yield {"type": "response.in_progress", "response": opening}
    output = response.get("output")
    for index, item in enumerate(output if isinstance(output, list) else ()):
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            yield from _message(index, item, chunk_chars)
        else:
            yield {"type": "response.output_item.added", "output_index": index, "item": item}
            yield {"type": "response.output_item.done", "output_index": index, "item": item}
    status = response.get("status")
    yield {
        "type": f"response.{status if status in ('incomplete', 'failed') else 'completed'}",
        "response": response,
    }


def _message(index: int, item: Mapping[str, Any], chunk_chars: int) -> Iterator[dict[str, Any]]:
    item_id = item.get("id")
    yield {
        "type": "response.output_item.added",
        "output_index": index,
        "item": {**item, "status": "in_progress", "content": []},
    }
    content = item.get("content")
    for part_index, part in enumerate(content if isinstance(content, list) else ()):
        if not isinstance(part, dict):
            continue
        where = {"item_id": item_id, "output_index": index, "content_index": part_index}
        kind = part.get("type")
        if kind == "output_text":
            yield {"type": "response.content_part.added", **where, "part": {**part, "text": ""}}
            text = part["text"] if isinstance(part.get("text"), str) else ""
            for piece in _pieces(text, chunk_chars):
                yield {"type": "response.output_text.delta", **where, "delta": piece}
            yield {"type": "response.output_text.done", **where, "text": text}
        elif kind == "refusal":
            yield {"type": "response.content_part.added", **where, "part": {**part, "refusal": ""}}
            refusal = part["refusal"] if isinstance(part.get("refusal"), str) else ""
            yield {"type": "response.refusal.delta", **where, "delta": refusal}
            yield {"type": "response.refusal.done", **where, "refusal": refusal}
        else:
            yield {"type": "response.content_part.added", **where, "part": part}
        yield {"type": "response.content_part.done", **where, "part": part}
    yield {"type": "response.output_item.done", "output_index": index, "item": item}


def _pieces(text: str, chunk_chars: int) -> list[str]:
    if not text:
        return []
    if chunk_chars <= 0:
        return [text]
    return [text[i : i + chunk_chars] for i in range(0, len(text), chunk_chars)]
