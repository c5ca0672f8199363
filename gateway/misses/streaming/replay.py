"""Replay: the SSE frames of a streamed hit, synthesized from one entry (DESIGN §3: one entry, both forms).

Pure. A stream-recorded entry replays its own payloads, so the chunk boundaries, ids and `created` are the first
answer's. The usage chunk follows the new request, not the recording: it is dropped unless the request set
`stream_options.include_usage`, and built from the entry's usage when the request asks and the recording has none.
A JSON-recorded entry becomes real `chat.completion.chunk` (or `text_completion`) events: a role delta, the content
in `chunk_chars` pieces (0: one piece), the tool calls, the finish reason, the optional usage chunk; always
followed by `data: [DONE]`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson

from gateway.keys.entry import Entry
from gateway.keys.policy import RESPONSES
from gateway.misses.streaming.recorder import CHAT, is_usage_only
from gateway.misses.streaming.responses import response_frames
from gateway.misses.streaming.sse import DONE_FRAME, data_frame


def replay_frames(entry: Entry, *, include_usage: bool, chunk_chars: int) -> list[bytes]:
    if entry.endpoint == RESPONSES:  # typed events ending with the whole response: no usage chunk, no [DONE]
        return response_frames(entry.body, entry.stream_chunks, chunk_chars=chunk_chars)
    if entry.stream_chunks is not None:
        payloads = list(recorded(entry.stream_chunks, entry.usage, include_usage=include_usage))
    else:
        payloads = [
            orjson.dumps(doc)
            for doc in synthesized(
                orjson.loads(entry.body), entry.endpoint, include_usage=include_usage, chunk_chars=chunk_chars
            )
        ]
    return [data_frame(p) for p in payloads] + [DONE_FRAME]


def recorded(
    chunks: Sequence[bytes], usage: Mapping[str, Any] | None, *, include_usage: bool
) -> Iterator[bytes]:
    had_usage = False
    for chunk in chunks:
        if b'"usage"' in chunk and is_usage_only(orjson.loads(chunk)):  # parse only the few that may be one
            had_usage = True
            if include_usage:
                yield chunk
            continue
        yield chunk
    if include_usage and not had_usage and usage is not None and chunks:
        first = orjson.loads(chunks[0])
        yield orjson.dumps({**_base(first, first.get("object")), "choices": [], "usage": usage})


def synthesized(
    doc: Mapping[str, Any], endpoint: str, *, include_usage: bool, chunk_chars: int
) -> Iterator[dict[str, Any]]:
    chat = endpoint == CHAT
    base = _base(doc, "chat.completion.chunk" if chat else "text_completion")
    for choice in doc.get("choices") or ():
        index = choice.get("index", 0)
        if chat:
            deltas = _chat_deltas(choice.get("message") or {}, chunk_chars)
            for n, delta in enumerate(deltas):
                logprobs = choice.get("logprobs") if n == 1 else None  # whole, on the first content chunk
                yield {
                    **base,
                    "choices": [
                        {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}
                    ],
                }
            yield {
                **base,
                "choices": [
                    {
                        "index": index,
                        "delta": {},
                        "logprobs": None,
                        "finish_reason": choice.get("finish_reason"),
                    }
                ],
            }
        else:
            pieces = split(choice.get("text") or "", chunk_chars)
            for n, piece in enumerate(pieces):
                yield {
                    **base,
                    "choices": [
                        {
                            "index": index,
                            "text": piece,
                            "logprobs": choice.get("logprobs") if n == 0 else None,
                            "finish_reason": None,
                        }
                    ],
                }
            yield {
                **base,
                "choices": [
                    {
                        "index": index,
                        "text": "",
                        "logprobs": None,
                        "finish_reason": choice.get("finish_reason"),
                    }
                ],
            }
    if include_usage and isinstance(doc.get("usage"), Mapping):
        yield {**base, "choices": [], "usage": doc["usage"]}


def split(text: str, chunk_chars: int) -> list[str]:
    """`text` in pieces of `chunk_chars` code points; 0 means one piece; nothing for an empty text."""
    if not text:
        return []
    if chunk_chars <= 0:
        return [text]
    return [text[i : i + chunk_chars] for i in range(0, len(text), chunk_chars)]


def _chat_deltas(message: Mapping[str, Any], chunk_chars: int) -> list[dict[str, Any]]:
    content = message.get("content")
    deltas: list[dict[str, Any]] = [
        {"role": message.get("role") or "assistant", "content": "" if isinstance(content, str) else None}
    ]
    if isinstance(content, str):
        deltas += [{"content": piece} for piece in split(content, chunk_chars)]
    if isinstance(message.get("refusal"), str):
        deltas.append({"refusal": message["refusal"]})
    for index, call in enumerate(message.get("tool_calls") or ()):
        deltas.append({"tool_calls": [{"index": index, **call}]})
    return deltas


def _base(doc: Mapping[str, Any], obj: Any) -> dict[str, Any]:
    base = {"id": doc.get("id"), "object": obj, "created": doc.get("created"), "model": doc.get("model")}
    if doc.get("system_fingerprint") is not None:
        base["system_fingerprint"] = doc["system_fingerprint"]
    return base
