"""A Responses request body -> the chat request it means, and Responses items <-> chat messages. Pure: no I/O.

Input items: messages (a string, or text parts), `function_call` (an assistant tool call) and
`function_call_output` (its result, a `tool` message); consecutive calls form one assistant turn, as chat has
them. Function tools in the Responses shape (`{type, name, parameters, ...}`) become chat function tools, so
backend/server/tools.py's grammar binds the answer. Fields with no meaning here are a 400 naming them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backend.server.errors import bad_request

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
        "stream",
        "store",
        "previous_response_id",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "metadata",
    }
)
INERT: Mapping[str, tuple[Any, ...]] = {
    "truncation": ("disabled",),
    "background": (False,),
    "include": ([],),
    "service_tier": ("auto", "default"),
    "conversation": (),
    "reasoning": (),
    "max_tool_calls": (),
    "prompt": (),
    "prompt_cache_key": (),
    "top_logprobs": (0,),
    "stream_options": (),
}


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    body: Mapping[str, Any]
    items: tuple[dict[str, Any], ...]  # this request's input items (what a stored response keeps)
    stream: bool
    store: bool
    previous_response_id: str | None


def parse_body(body: Any) -> ResponsesRequest:
    """Check a Responses body's fields; a 400 naming any field that has no meaning here."""
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
    for name in ("stream", "store"):
        if not isinstance(body.get(name, False), bool | None):
            raise bad_request(f"'{name}' must be a boolean", name)
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise bad_request("'previous_response_id' must be a string", "previous_response_id")
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, Mapping) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise bad_request("'metadata' must be an object of strings", "metadata")
    items = input_items(body.get("input"))
    messages_of(items)  # every item must render; a bad one is a 400 naming it now
    return ResponsesRequest(body, items, body.get("stream") is True, body.get("store") is not False, previous)


def input_items(value: Any) -> tuple[dict[str, Any], ...]:
    if isinstance(value, str):
        return ({"type": "message", "role": "user", "content": value},)
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty array of items", "input")
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise bad_request(f"input[{i}] must be an object", f"input[{i}]")
    return tuple(dict(item) for item in value)


def messages_of(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages a conversation of items renders as."""
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message" and "role" in item:
            messages.append({"role": item["role"], "content": _content(item.get("content"), i)})
        elif kind == "function_call":
            call = _call(item, i)
            last = messages[-1] if messages else {}
            if last.get("role") == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str) or not isinstance(output, str):
                raise bad_request(f"input[{i}]: call_id and output must be strings", f"input[{i}]")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        else:
            raise bad_request(
                f"input[{i}]: only message, function_call and function_call_output items are supported",
                f"input[{i}]",
            )
    return messages


def _content(content: Any, i: int) -> Any:
    if not isinstance(content, list):
        return content
    parts = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") not in ("input_text", "output_text"):
            raise bad_request(f"input[{i}].content: only text parts are supported", f"input[{i}].content")
        parts.append({"type": "text", "text": part.get("text")})
    return parts


def _call(item: Mapping[str, Any], i: int) -> dict[str, Any]:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not all(isinstance(v, str) for v in (call_id, name, arguments)):
        raise bad_request(f"input[{i}]: call_id, name and arguments must be strings", f"input[{i}]")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_body(req: ResponsesRequest, history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The chat request a Responses request means, its stored history (previous_response_id) first."""
    body = req.body
    messages = messages_of([*history, *req.items])
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("'instructions' must be a string", "instructions")
        messages = [{"role": "system", "content": instructions}, *messages]
    chat: dict[str, Any] = {"messages": messages}
    for name in ("model", "temperature", "top_p", "user", "safety_identifier", "parallel_tool_calls"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    response_format = _format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    if body.get("tools"):
        chat["tools"] = chat_tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    return chat


def chat_tools(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise bad_request("'tools' must be an array of function tools", "tools")
    tools = []
    for i, tool in enumerate(value):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            raise bad_request(f"tools[{i}]: only function tools are supported, not {kind!r}", "tools")
        function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        function["strict"] = tool.get("strict") is not False  # the Responses API's default is strict
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(value: Any) -> Any:
    if isinstance(value, Mapping) and value.get("type") == "function":
        return {"type": "function", "function": {"name": value.get("name")}}
    if value in ("none", "auto", "required"):
        return value
    raise bad_request("tool_choice must be none, auto, required or {type: function, name}", "tool_choice")


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
