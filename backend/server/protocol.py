"""OpenAI request bodies -> one typed `GenerationRequest`. Pure: validation raises `ApiError` (400),
so handlers never see a malformed value and user input never reaches an assert. Chat messages follow
`tokenedge_wire.chat_schema` (known roles; content required except on assistant turns), the rules the gateway
applies before it calls or caches anything, so the two agree. Which fields exist at all, and which are refused,
is backend/server/fields.py's table, checked first."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backend.engine.sampling_params import LOGIT_BIAS_RANGE, MAX_LOGPROBS
from backend.server.errors import bad_request
from backend.server.fields import Endpoint, check_fields
from backend.server.tools import ToolSpec, parse_tools
from tokenedge_wire.chat_schema import messages_problem

MAX_STOP_STRINGS = 4
MAX_PROMPTS = 64  # prompts in one /v1/completions request
MAX_LOGIT_BIAS = 300  # entries, OpenAI's limit
SEED_RANGE = (-(2**63), 2**63 - 1)  # OpenAI's int64; choice i uses seed + i, which torch still accepts


Prompt = str | tuple[int, ...]  # text or token ids


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """A structured-output request: `json_object` (any object) or `json_schema`."""

    schema: dict[str, Any]
    strict: bool


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    endpoint: Endpoint
    model: str | None
    messages: tuple[dict[str, Any], ...]  # chat only
    prompts: tuple[Prompt, ...]  # completion only: one choice group per prompt
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    n: int
    stream: bool
    include_usage: bool
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = frozenset()
    logprobs: int | None = None  # None: none; k: the chosen token's and the k most likely
    echo: bool = False
    response_format: ResponseFormat | None = None
    tools: ToolSpec | None = None  # chat only
    cache_salt: str = ""  # vLLM's prefix-cache isolation (backend/engine/block_pool.py salt_root)


def parse_request(body: Any, endpoint: Endpoint, max_n: int) -> GenerationRequest:
    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object")
    check_fields(body, endpoint)
    model = _optional(body, "model", str)
    messages: tuple[dict[str, Any], ...] = ()
    prompts: tuple[Prompt, ...] = ()
    if endpoint == "chat":
        messages = parse_messages(body.get("messages"))
    else:
        prompts = _prompts(body.get("prompt"))
    max_tokens = _max_tokens(body)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise bad_request("top_p must be greater than 0", "top_p")
    top_k = _optional(body, "top_k", int)
    if top_k is not None and top_k < -1:
        raise bad_request("top_k must be -1, 0 (disabled) or positive", "top_k")
    n = _n(body, max_n)
    seed = _optional(body, "seed", int)
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise bad_request(f"seed must be a 64-bit signed integer, got {seed}", "seed")
    logprobs = _logprobs(body, endpoint)
    echo = _optional(body, "echo", bool) or False
    if echo and logprobs is not None:
        raise bad_request("echo with logprobs needs the prompt's logprobs, which are not computed", "echo")
    min_tokens = _optional(body, "min_tokens", int) or 0
    if min_tokens < 0 or (max_tokens is not None and min_tokens > max_tokens):
        raise bad_request("min_tokens must be between 0 and max_tokens", "min_tokens")
    ignore_eos = _optional(body, "ignore_eos", bool) or False
    response_format, tools = _grammar_sources(body, endpoint, ignore_eos, min_tokens)
    return GenerationRequest(
        endpoint=endpoint,
        model=model,
        messages=messages,
        prompts=prompts,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=top_p,
        top_k=top_k or 0,
        seed=seed,
        stop=_stop(body.get("stop")),
        n=n,
        stream=_optional(body, "stream", bool) or False,
        include_usage=_include_usage(body),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=_repetition_penalty(body),
        logit_bias=_logit_bias(body.get("logit_bias")),
        min_tokens=min_tokens,
        ignore_eos=ignore_eos,
        stop_token_ids=_token_ids(body.get("stop_token_ids"), "stop_token_ids"),
        logprobs=logprobs,
        echo=echo,
        response_format=response_format,
        tools=tools,
        cache_salt=_optional(body, "cache_salt", str) or "",
    )


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    max_tokens = _optional(body, "max_completion_tokens", int)
    if max_tokens is None:
        max_tokens = _optional(body, "max_tokens", int)
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
    return max_tokens


def _n(body: Mapping[str, Any], max_n: int) -> int:
    n = _optional(body, "n", int)
    n = 1 if n is None else n
    if not 1 <= n <= max_n:
        raise bad_request(f"n must be between 1 and {max_n}", "n")
    best_of = _optional(body, "best_of", int)
    if best_of is not None and best_of != n:
        raise bad_request("best_of must equal n: extra candidates are not ranked", "best_of")
    return n


def _include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise bad_request("stream_options must be an object", "stream_options")
    if options and set(options) - {"include_usage"}:
        unknown = sorted(set(options) - {"include_usage"})[0]
        raise bad_request(f"stream_options.{unknown} is not supported", f"stream_options.{unknown}")
    return bool(options and options.get("include_usage") is True)


def _grammar_sources(
    body: Mapping[str, Any], endpoint: Endpoint, ignore_eos: bool, min_tokens: int
) -> tuple[ResponseFormat | None, ToolSpec | None]:
    """response_format and tools; at most one may set the grammar, and a grammar's end is not to be fought."""
    response_format = _response_format(body.get("response_format"))
    tools = parse_tools(body) if endpoint == "chat" else None
    bound = tools is not None and tools.active
    if response_format is not None and bound:
        raise bad_request(
            "response_format cannot be combined with tools (both set the grammar)", "response_format"
        )
    if (response_format is not None or bound) and (ignore_eos or min_tokens):
        param = "ignore_eos" if ignore_eos else "min_tokens"
        raise bad_request(f"{param} cannot be combined with a grammar (response_format or tools)", param)
    return response_format, tools


def _logprobs(body: Mapping[str, Any], endpoint: Endpoint) -> int | None:
    """The number of alternatives per token, or None for no logprobs (chat: a bool plus top_logprobs)."""
    if endpoint == "completion":
        count = _optional(body, "logprobs", int)
        if count is not None and not 0 <= count <= MAX_LOGPROBS:
            raise bad_request(f"logprobs must be between 0 and {MAX_LOGPROBS}", "logprobs")
        return count
    wanted = _optional(body, "logprobs", bool) or False
    top = _optional(body, "top_logprobs", int)
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise bad_request(f"top_logprobs must be between 0 and {MAX_LOGPROBS}", "top_logprobs")
    if top is not None and not wanted:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    return (top or 0) if wanted else None


def _repetition_penalty(body: Mapping[str, Any]) -> float:
    value = _number(body, "repetition_penalty", 1.0, 0.0, 2.0)
    if value == 0.0:
        raise bad_request("repetition_penalty must be greater than 0", "repetition_penalty")
    return value


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """{"token id": bias} -> sorted (id, bias) pairs; ids are checked against the vocabulary by the handler."""
    if value is None:
        return ()
    if not isinstance(value, Mapping) or len(value) > MAX_LOGIT_BIAS:
        raise bad_request(f"logit_bias must be an object of at most {MAX_LOGIT_BIAS} entries", "logit_bias")
    low, high = LOGIT_BIAS_RANGE
    pairs = []
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise bad_request(f"logit_bias keys must be token ids, got {key!r}", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not low <= bias <= high:
            raise bad_request(f"logit_bias values must be numbers in [{low}, {high}]", "logit_bias")
        pairs.append((int(key), float(bias)))
    return tuple(sorted(pairs))


def _token_ids(value: Any, param: str) -> frozenset[int]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise bad_request(f"'{param}' must be an array of token ids", param)
    return frozenset(value)


def _response_format(value: Any) -> ResponseFormat | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat({"type": "object"}, strict=False)
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise bad_request("response_format.json_schema.schema must be an object", "response_format")
        strict = spec.get("strict") if isinstance(spec, Mapping) else None
        if strict is not None and not isinstance(strict, bool):
            raise bad_request("response_format.json_schema.strict must be a boolean", "response_format")
        return ResponseFormat(dict(schema), strict=bool(strict))
    raise bad_request("response_format.type must be text, json_object or json_schema", "response_format")


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


def parse_messages(value: Any) -> tuple[dict[str, Any], ...]:
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


def _prompts(value: Any) -> tuple[Prompt, ...]:
    """A string, token ids, or a list of strings or of token-id lists (OpenAI's four prompt shapes)."""
    single = _one_prompt(value)
    if single is not None:
        return (single,)
    if isinstance(value, list) and 0 < len(value) <= MAX_PROMPTS:
        prompts = [_one_prompt(item) for item in value]
        if all(p is not None for p in prompts):
            return tuple(p for p in prompts if p is not None)
    raise bad_request(
        f"'prompt' must be a string, an array of token ids, or an array of at most {MAX_PROMPTS} of either",
        "prompt",
    )


def _one_prompt(value: Any) -> Prompt | None:
    if isinstance(value, str):
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    ):
        return tuple(value)
    return None


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise bad_request("'stop' must be a non-empty string or an array of them", "stop")
    if len(items) > MAX_STOP_STRINGS:
        raise bad_request(f"at most {MAX_STOP_STRINGS} stop strings", "stop")
    return tuple(items)
