"""`POST /v1/responses`, the text subset: a Responses request becomes a chat request, its answer a Response.

Mapped: `input` (a string, or message items with text content), `instructions` (a leading system message),
`max_output_tokens`, `temperature`, `top_p`, `text.format` (text, json_object, json_schema: the chat
path's grammar), `user`, `safety_identifier`. Everything else is refused with a 400 naming it, as on chat:
tools, streaming, stored state (`previous_response_id`, `store: true`, `conversation`), reasoning, background.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from backend.engine.errors import EngineError
from backend.server.completions import check_model, choice_params, compile_grammar, prompts_of
from backend.server.errors import bad_request, translate_engine_error
from backend.server.generation import Choice, ChoiceEvent, Usage, run_choices
from backend.server.protocol import parse_request
from backend.server.state import ENGINE_KEY, GRAMMARS_KEY, LIMITS_KEY, METRICS_KEY, MODEL_KEY

HONOURED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "text",
        "user",
        "safety_identifier",
    }
)
INERT: Mapping[str, tuple[Any, ...]] = {
    "stream": (False,),
    "store": (False,),
    "metadata": ({},),
    "tools": ([],),
    "tool_choice": ("none",),
    "parallel_tool_calls": (True, False),
    "truncation": ("disabled",),
    "background": (False,),
    "include": ([],),
    "service_tier": ("auto", "default"),
    "previous_response_id": (),
    "conversation": (),
    "reasoning": (),
    "max_tool_calls": (),
    "prompt": (),
    "prompt_cache_key": (),
    "top_logprobs": (0,),
    "stream_options": (),
}


async def responses(request: web.Request) -> web.Response:
    app = request.app
    model, limits = app[MODEL_KEY], app[LIMITS_KEY]
    try:
        body = await request.json()
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None
    req = parse_request(chat_body(body), "chat", 1)
    check_model(req, model)
    prompt = prompts_of(req, model)[0]
    params = choice_params(req, len(prompt), model, limits, compile_grammar(req, app[GRAMMARS_KEY]))
    usage = Usage()
    events = run_choices(
        app[ENGINE_KEY].generate,
        model.tokenizer,
        [Choice(prompt, params[0], counts_prompt=True)],
        (),
        f"resp-{uuid.uuid4().hex}",
        usage,
        on_first_token=app[METRICS_KEY].ttft_seconds.observe,
    )
    text, finish = "", None
    async with contextlib.aclosing(events):
        try:
            event: ChoiceEvent | None = await anext(events)
        except EngineError as exc:
            raise translate_engine_error(exc, limits.retry_after_s) from exc
        while event is not None:
            text += event.text
            finish = event.finish_reason or finish
            event = await anext(events, None)
    return web.json_response(response_object(model.id, text, finish, usage))


def chat_body(body: Any) -> dict[str, Any]:
    """The chat request a Responses body means; a 400 naming any field that has no chat meaning here."""
    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object")
    for name, value in body.items():
        if name in HONOURED or value is None:
            continue
        if name not in INERT:
            raise bad_request(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
        if not any(type(value) is type(v) and value == v for v in INERT[name]):
            raise bad_request(
                f"'{name}' is not supported by /v1/responses here", name, "unsupported_parameter"
            )
    messages = _messages(body.get("input"))
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("'instructions' must be a string", "instructions")
        messages = [{"role": "system", "content": instructions}, *messages]
    chat: dict[str, Any] = {"messages": messages}
    for name in ("model", "temperature", "top_p", "user", "safety_identifier"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    response_format = _format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    return chat


def _messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty array of messages", "input")
    messages = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping) or item.get("type", "message") != "message" or "role" not in item:
            raise bad_request(f"input[{i}]: only message items are supported", f"input[{i}]")
        content = item.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, Mapping) or part.get("type") not in ("input_text", "output_text"):
                    raise bad_request(
                        f"input[{i}].content: only text parts are supported", f"input[{i}].content"
                    )
                parts.append({"type": "text", "text": part.get("text")})
            content = parts
        messages.append({"role": item["role"], "content": content})
    return messages


def _format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) - {"format"}:
        raise bad_request("'text' supports only 'format'", "text")
    fmt = value.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise bad_request("text.format must be an object", "text.format")
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return dict(fmt)


def response_object(model: str, text: str, finish: str | None, usage: Usage) -> dict[str, Any]:
    complete = finish != "length"
    counts = usage.as_dict()
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed" if complete else "incomplete",
        "incomplete_details": None if complete else {"reason": "max_output_tokens"},
        "model": model,
        "output": [
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "status": "completed" if complete else "incomplete",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": False,
        "tool_choice": "none",
        "tools": [],
        "usage": {
            "input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": counts["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": counts["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"],
        },
    }
