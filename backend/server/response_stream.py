"""A Response as a Responses SSE stream: the documented events, each with its `sequence_number`.

response.created, response.in_progress, then per output item: response.output_item.added, for a message
response.content_part.added, response.output_text.delta..., response.output_text.done,
response.content_part.done (for a function call response.function_call_arguments.delta and .done),
response.output_item.done; last response.completed (response.incomplete when cut by max_output_tokens). Text
streams as the chat path generates it; a tool answer is JSON that only means something whole, so it is held
until it finishes (as chat's stream holds it). The final Response is returned only on a clean finish, so
only a complete stream is stored.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from aiohttp import web

from backend.engine.errors import EngineError
from backend.server.errors import translate_engine_error
from backend.server.generation import ChoiceEvent, Usage
from backend.server.response_object import collect_text, finished, message_item
from backend.server.sse import open_stream, send_event


class _Events:
    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response
        self.sequence_number = 0

    async def send(self, kind: str, **fields: Any) -> None:
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        await send_event(self.response, payload, kind)


async def stream_response(
    request: web.Request,
    head: dict[str, Any],
    first: ChoiceEvent,
    events: AsyncGenerator[ChoiceEvent, None],
    usage: Usage,
    tools: bool,
) -> tuple[web.StreamResponse, dict[str, Any] | None]:
    """Stream the Response; the finished Response object, or None if the stream did not end cleanly."""
    response = await open_stream(request)
    out = _Events(response)
    try:
        await out.send("response.created", response=head)
        await out.send("response.in_progress", response=head)
        if tools:
            text, finish = await collect_text(first, events)
            final = finished(head, text, finish, usage, tools)
            for index, item in enumerate(final["output"]):
                await _send_item(out, index, item)
        else:
            final = await _stream_text(out, head, first, events, usage)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        await out.send(kind, response=final)
        await response.write_eof()
    except ConnectionResetError:
        return (
            response,
            None,
        )  # the client went away: leaving closes `events`, which aborts the engine request
    except EngineError as exc:
        error = translate_engine_error(exc, 1)
        failed = {**head, "status": "failed", "error": {"code": "server_error", "message": error.message}}
        with contextlib.suppress(ConnectionResetError):
            await out.send("response.failed", response=failed)
        return response, None
    return response, final


async def _stream_text(
    out: _Events,
    head: dict[str, Any],
    first: ChoiceEvent,
    events: AsyncGenerator[ChoiceEvent, None],
    usage: Usage,
) -> dict[str, Any]:
    item_id = await _open_message(out, 0)
    text, finish = "", None
    event: ChoiceEvent | None = first
    while event is not None:
        if event.text:
            text += event.text
            await _delta(out, 0, item_id, event.text)
        finish = event.finish_reason or finish
        event = await anext(events, None)
    final = finished(head, text, finish, usage, False, item_id)
    await _close_message(out, 0, final["output"][0])
    return final


async def _open_message(out: _Events, index: int, item_id: str | None = None) -> str:
    item = message_item("", "in_progress", item_id)
    item["content"] = []
    await out.send("response.output_item.added", output_index=index, item=item)
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    await out.send(
        "response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part
    )
    return str(item["id"])


async def _delta(out: _Events, index: int, item_id: str, text: str) -> None:
    await out.send(
        "response.output_text.delta",
        item_id=item_id,
        output_index=index,
        content_index=0,
        delta=text,
        logprobs=[],
    )


async def _close_message(out: _Events, index: int, item: dict[str, Any]) -> None:
    part = item["content"][0]
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    await out.send("response.output_text.done", **where, text=part["text"], logprobs=[])
    await out.send("response.content_part.done", **where, part=part)
    await out.send("response.output_item.done", output_index=index, item=item)


async def _send_item(out: _Events, index: int, item: dict[str, Any]) -> None:
    """A held (whole) output item as its events."""
    if item["type"] == "message":
        item_id = await _open_message(out, index, item["id"])
        if item["content"][0]["text"]:
            await _delta(out, index, item_id, item["content"][0]["text"])
        await _close_message(out, index, item)
        return
    where = {"item_id": item["id"], "output_index": index}
    await out.send(
        "response.output_item.added",
        output_index=index,
        item={**item, "arguments": "", "status": "in_progress"},
    )
    await out.send("response.function_call_arguments.delta", **where, delta=item["arguments"])
    await out.send(
        "response.function_call_arguments.done", **where, arguments=item["arguments"], name=item["name"]
    )
    await out.send("response.output_item.done", output_index=index, item=item)
