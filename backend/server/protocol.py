"""OpenAI request bodies -> one typed `GenerationRequest`. Pure: validation raises `ApiError` (400),
so handlers never see a malformed value and user input never reaches an assert. Chat messages follow
`tokenedge_wire.chat_schema` (known roles; content required except on assistant turns), the rules the gateway
applies before it calls or caches anything, so the two agree."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from backend.server.errors import bad_request
from tokenedge_wire.chat_schema import messages_problem

Endpoint = Literal["chat", "completion"]
MAX_STOP_STRINGS = 4
SEED_RANGE = (-(2**63), 2**63 - 1)  # OpenAI's int64; choice i uses seed + i, which torch still accepts


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    endpoint: Endpoint
    model: str | None
    messages: tuple[dict[str, Any], ...]  # chat only
    prompt: str | tuple[int, ...] | None  # completion only: text or token ids
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    n: int
    stream: bool
    include_usage: bool


def parse_request(body: Any, endpoint: Endpoint, max_n: int) -> GenerationRequest:
    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object")
    model = _optional(body, "model", str)
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str | tuple[int, ...] | None = None
    if endpoint == "chat":
        messages = _messages(body.get("messages"))
    else:
        prompt = _prompt(body.get("prompt"))
    max_tokens = _optional(body, "max_completion_tokens", int)
    if max_tokens is None:
        max_tokens = _optional(body, "max_tokens", int)
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise bad_request("top_p must be greater than 0", "top_p")
    top_k = _optional(body, "top_k", int)
    if top_k is not None and top_k < -1:
        raise bad_request("top_k must be -1, 0 (disabled) or positive", "top_k")
    n = _optional(body, "n", int)
    n = 1 if n is None else n
    if not 1 <= n <= max_n:
        raise bad_request(f"n must be between 1 and {max_n}", "n")
    stream = _optional(body, "stream", bool) or False
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise bad_request("stream_options must be an object", "stream_options")
    include_usage = bool(options and options.get("include_usage") is True)
    seed = _optional(body, "seed", int)
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise bad_request(f"seed must be a 64-bit signed integer, got {seed}", "seed")
    logprobs = body.get("logprobs")
    if logprobs not in (None, False, 0):
        raise bad_request("logprobs are not supported", "logprobs")
    return GenerationRequest(
        endpoint=endpoint,
        model=model,
        messages=messages,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k or 0,
        seed=seed,
        stop=_stop(body.get("stop")),
        n=n,
        stream=stream,
        include_usage=include_usage,
    )


def _optional(body: Mapping[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise bad_request(f"'{name}' must be of type {kind.__name__}", name)
    return value


def _number(body: Mapping[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_request(f"'{name}' must be a number", name)
    if not low <= value <= high:
        raise bad_request(f"'{name}' must be between {low} and {high}, got {value}", name)
    return float(value)


def _messages(value: Any) -> tuple[dict[str, Any], ...]:
    problem = messages_problem(value)  # the gateway's rules too: a known role, content unless assistant
    if problem is not None:
        shown = json.dumps(problem.value)[:80]
        raise bad_request(f"'{problem.param}' must be {problem.expected}, got {shown}", problem.param)
    return tuple(
        {**message, "content": _content(message.get("content"), i)} for i, message in enumerate(value)
    )


def _content(value: Any, index: int) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if (
                not isinstance(part, Mapping)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise bad_request(
                    f"messages[{index}].content: only text parts are supported", f"messages[{index}].content"
                )
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(
        f"messages[{index}].content must be a string or an array of text parts", f"messages[{index}].content"
    )


def _prompt(value: Any) -> str | tuple[int, ...]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    ):
        return tuple(value)
    raise bad_request("'prompt' must be a string or an array of token ids (one prompt per request)", "prompt")


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise bad_request("'stop' must be a non-empty string or an array of them", "stop")
    if len(items) > MAX_STOP_STRINGS:
        raise bad_request(f"at most {MAX_STOP_STRINGS} stop strings", "stop")
    return tuple(items)
