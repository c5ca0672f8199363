"""Replay: the SSE frames of a streamed hit, synthesized from one entry (design §3: one entry, both forms).

Pure. A stream-recorded entry replays its own payloads, so the chunk boundaries, ids and `created` are the first
answer's. The usage chunk follows the new request, not the recording: it is dropped unless the request set
`stream_options.include_usage`, and built from the entry's usage when the request asks and the recording has none.
A JSON-recorded entry becomes real `chat.completion.chunk` (or `text_completion`) events by the rules of
`gateway.misses.streaming.forms` (every field kept; the text in `chunk_chars` pieces, 0: one piece), then the
optional usage chunk; always followed by `data: [DONE]`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson

from gateway.keys.entry import Entry
from gateway.keys.policy import RESPONSES
from gateway.misses.streaming.forms import stream_of
from gateway.misses.streaming.recorder import is_usage_only
from gateway.misses.streaming.responses import response_frames
from gateway.misses.streaming.sse import DONE_FRAME, data_frame


def replay_frames(entry: Entry, *, include_usage: bool, chunk_chars: int) -> list[bytes]:
    if entry.endpoint == RESPONSES:  # typed events ending with the whole response: no usage chunk, no [DONE]
        return response_frames(entry.body, entry.stream_chunks, chunk_chars=chunk_chars)
    if entry.stream_chunks is not None:
        payloads = list(recorded(entry.stream_chunks, entry.usage, include_usage=include_usage))
    else:
        doc = orjson.loads(entry.body)
        chunks = stream_of(doc, entry.endpoint, include_usage=include_usage, chunk_chars=chunk_chars)
        payloads = [orjson.dumps(chunk) for chunk in chunks]
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
        base = {k: v for k, v in orjson.loads(chunks[0]).items() if k not in ("choices", "usage")}
        yield orjson.dumps({**base, "choices": [], "usage": usage})
