"""The Response object: its head (what the request set, status `in_progress`) and its finished form.

With active tools the answer is grammar-bound JSON (backend/server/tools.py): a finished one becomes
`function_call` items or one message; one cut by `max_output_tokens` stays raw text in an incomplete message.
Pure: no I/O.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from backend.server.generation import ChoiceEvent, Usage
from backend.server.response_items import ResponsesRequest
from backend.server.tools import ParsedAnswer, parse_answer


def response_head(req: ResponsesRequest, model: str) -> dict[str, Any]:
    body = req.body
    tools = body.get("tools") or []
    text = body.get("text") or {}
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "model": model,
        "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "previous_response_id": req.previous_response_id,
        "store": req.store,
        "temperature": body.get("temperature", 1.0),
        "text": {"format": text.get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice") or ("auto" if tools else "none"),
        "tools": tools,
        "top_p": body.get("top_p", 1.0),
        "usage": None,
    }


def answer(text: str, finish: str | None, tools: bool) -> ParsedAnswer | None:
    """The parsed tool answer, or None where the text is the answer (no tools, or cut short)."""
    if not tools or finish != "stop":
        return None
    try:
        return parse_answer(text)
    except (ValueError, KeyError, TypeError):
        return None


def finished(
    head: dict[str, Any],
    text: str,
    finish: str | None,
    usage: Usage,
    tools: bool,
    item_id: str | None = None,
) -> dict[str, Any]:
    complete = finish != "length"
    status = "completed" if complete else "incomplete"
    counts = usage.as_dict()
    return {
        **head,
        "status": status,
        "incomplete_details": None if complete else {"reason": "max_output_tokens"},
        "output": output_items(answer(text, finish, tools), text, status, item_id),
        "usage": {
            "input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": counts["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": counts["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"],
        },
    }


async def collect_text(
    first: ChoiceEvent, events: AsyncGenerator[ChoiceEvent, None]
) -> tuple[str, str | None]:
    text, finish = "", None
    event: ChoiceEvent | None = first
    while event is not None:
        text += event.text
        finish = event.finish_reason or finish
        event = await anext(events, None)
    return text, finish


def message_item(text: str, status: str, item_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id or f"msg_{uuid.uuid4().hex}",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def output_items(
    parsed: ParsedAnswer | None, text: str, status: str, item_id: str | None = None
) -> list[dict[str, Any]]:
    """A finished answer's output items: its function calls, or one assistant message."""
    if parsed is None:
        return [message_item(text, status, item_id)]
    if parsed.tool_calls is None:
        return [message_item(parsed.content or "", status, item_id)]
    return [
        {
            "type": "function_call",
            "id": f"fc_{uuid.uuid4().hex}",
            "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
            "status": "completed",
        }
        for call in parsed.tool_calls
    ]
