"""Tool calling by grammar: the request's tools, the prompt that shows them, the grammar, the parsed answer.

Chat templates of small models (SmolLM2's included) have no tool syntax, so the convention is the server's own,
llama.cpp's "generic" one: the tools are described in a system message and the answer is one JSON object, either
`{"tool_calls": [{"name", "arguments"}]}` or, under `auto`, `{"response": "<text>"}`. The grammar enforces
it, so a call always names a declared function with arguments matching its parameters schema:
- `none`: no tools shown, no grammar, a plain answer;
- `auto`: the model chooses, by its own logits, between the two objects;
- `required`: at least one call; a named function: exactly that one.
`parallel_tool_calls: false` allows one call. Earlier assistant tool calls are rendered back in the same JSON, so
the model sees its own convention in the history. Everything is rendered in the order declared (a function's
parameters as the client wrote them, a call as `name` then `arguments`, the grammar's order), so the prompt shows the
model the order the grammar makes it answer in; two tool lists that differ only in member order are two prompts,
and the gateway keys them apart. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from backend.server.errors import bad_request
from backend.server.tool_answer import scan

Mode = Literal["none", "auto", "required", "named"]
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
PREAMBLE = (
    "You can call these functions. Answer with one JSON object only: "
    '{"tool_calls": [{"name": <function name>, "arguments": <object>}]} to call functions'
)


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool


@dataclass(frozen=True, slots=True)
class ToolSpec:
    tools: tuple[Tool, ...]
    mode: Mode
    named: str | None  # the function tool_choice names (mode "named")
    parallel: bool

    @property
    def active(self) -> bool:
        """Whether the tools are shown to the model and the answer is grammar-bound JSON."""
        return self.mode != "none"


def parse_tools(body: Mapping[str, Any]) -> ToolSpec | None:
    raw = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    if not raw:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(raw, list):
        raise bad_request("'tools' must be an array of function tools", "tools")
    tools = tuple(_tool(t, i) for i, t in enumerate(raw))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise bad_request("tool names must be unique", "tools")
    mode, named = _choice(choice, names)
    return ToolSpec(tools, mode, named, parallel is not False)


def _tool(value: Any, index: int) -> Tool:
    where = f"tools[{index}]"
    function = value.get("function") if isinstance(value, Mapping) else None
    if not isinstance(value, Mapping) or value.get("type") != "function" or not isinstance(function, Mapping):
        raise bad_request(f"{where} must be {{'type': 'function', 'function': {{...}}}}", where)
    name = function.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= 64 or not set(name) <= NAME_CHARS:
        raise bad_request(
            f"{where}.function.name must be 1-64 of a-z, A-Z, 0-9, _ and -", f"{where}.function.name"
        )
    parameters = function.get("parameters", {"type": "object"})
    if not isinstance(parameters, Mapping):
        raise bad_request(
            f"{where}.function.parameters must be a JSON schema", f"{where}.function.parameters"
        )
    description = function.get("description") or ""
    strict = function.get("strict") or False
    if not isinstance(description, str) or not isinstance(strict, bool):
        raise bad_request(f"{where}.function: description is a string, strict a boolean", where)
    return Tool(name, description, dict(parameters), strict)


def _choice(value: Any, names: Sequence[str]) -> tuple[Mode, str | None]:
    if value is None:
        return "auto", None
    if value in ("none", "auto", "required"):
        return value, None
    function = value.get("function") if isinstance(value, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if isinstance(value, Mapping) and value.get("type") == "function" and isinstance(name, str):
        if name not in names:
            raise bad_request(f"tool_choice names {name!r}, which is not in tools", "tool_choice")
        return "named", name
    raise bad_request("tool_choice must be none, auto, required or a named function", "tool_choice")


def tool_schema(spec: ToolSpec) -> dict[str, Any]:
    """The JSON schema the answer must match (the grammar is compiled from it)."""
    tools = [t for t in spec.tools if spec.named is None or t.name == spec.named]
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }
    calls: dict[str, Any] = {"type": "array", "items": call, "minItems": 1}
    if not spec.parallel or spec.named is not None:
        calls["maxItems"] = 1
    answer = _object({"tool_calls": calls})
    return {"anyOf": [answer, _object({"response": {"type": "string"}})]} if spec.mode == "auto" else answer


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def strict(spec: ToolSpec) -> bool:
    """Strict grammar (unenforceable schema keywords are an error) only when every function asks for it."""
    return all(t.strict for t in spec.tools)


def render_messages(messages: Sequence[Mapping[str, Any]], spec: ToolSpec | None) -> list[dict[str, Any]]:
    """The messages the template renders: the tools' system message first when active, and earlier assistant
    tool calls written back as the JSON the model is asked for."""
    out = [_with_calls(m) for m in messages]
    if spec is None or not spec.active:
        return out
    declared = [
        {"name": t.name, "description": t.description, "parameters": t.parameters} for t in spec.tools
    ]
    tail = ', or {"response": <text>} to answer in words' if spec.mode == "auto" else ""
    system = f"{PREAMBLE}{tail}.\nFunctions: {json.dumps(declared)}"
    if out and out[0].get("role") == "system":
        return [{**out[0], "content": f"{out[0]['content']}\n\n{system}"}, *out[1:]]
    return [{"role": "system", "content": system}, *out]


def _with_calls(message: Mapping[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not calls or message.get("content"):
        return dict(message)
    try:
        rendered = [
            {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
            for c in calls
        ]
    except (KeyError, TypeError, ValueError):
        raise bad_request(
            "an assistant message's tool_calls must carry function names and JSON arguments", "messages"
        ) from None
    return {**message, "content": json.dumps({"tool_calls": rendered})}


@dataclass(frozen=True, slots=True)
class ParsedAnswer:
    content: str | None
    tool_calls: list[dict[str, Any]] | None


def parse_answer(text: str) -> ParsedAnswer:
    """A finished grammar-bound answer -> message content or OpenAI tool_calls (with fresh call ids and the
    model's own argument text); ValueError where the answer is unfinished."""
    answer = scan(text)
    if not answer.complete:
        raise ValueError("the tool answer is unfinished")
    if answer.kind == "response":
        return ParsedAnswer(answer.content, None)
    return ParsedAnswer(None, [c.as_openai() for c in answer.calls])
