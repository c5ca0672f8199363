"""The request fields /v1/chat/completions and /v1/completions know, in one table: each is honoured or refused.

A field the server would silently drop is a wrong answer the gateway caches, so nothing is dropped: a field not
in `FIELDS`, or not for this endpoint, is a 400 naming it (`Unrecognized request argument`); a field the server
cannot honour is a 400 naming it unless its value is inert (null, or the value that asks for nothing, e.g.
`"store": false`). Value checks of honoured fields are backend/server/protocol.py's. The README's backend
section shows this table; tests/backend/test_fields.py keeps the two in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from backend.server.errors import bad_request

Endpoint = Literal["chat", "completion"]
CHAT: frozenset[Endpoint] = frozenset({"chat"})
COMPLETION: frozenset[Endpoint] = frozenset({"completion"})
BOTH: frozenset[Endpoint] = CHAT | COMPLETION


@dataclass(frozen=True, slots=True)
class Field:
    endpoints: frozenset[Endpoint]
    honoured: bool
    note: str
    inert: tuple[Any, ...] = ()  # for a refused field: values (besides null) that ask for nothing


FIELDS: Mapping[str, Field] = {
    "model": Field(BOTH, True, "must name the served model (404 otherwise)"),
    "messages": Field(CHAT, True, "text content only"),
    "prompt": Field(COMPLETION, True, "a string, token ids, or a list of either: one choice per prompt"),
    "max_tokens": Field(BOTH, True, "at most the context left after the prompt"),
    "max_completion_tokens": Field(CHAT, True, "as max_tokens"),
    "temperature": Field(BOTH, True, "0 to 2; below 1e-5 is greedy"),
    "top_p": Field(BOTH, True, "(0, 1]"),
    "top_k": Field(BOTH, True, "vLLM extension; 0 or -1 disables"),
    "seed": Field(BOTH, True, "choice i is seeded seed + i; same tokens whatever shares the batch"),
    "n": Field(BOTH, True, "1 to the server's max_n; each choice its own seeded stream"),
    "stop": Field(BOTH, True, "up to 4 strings, not included in the output"),
    "stop_token_ids": Field(BOTH, True, "vLLM extension: extra token ids that end the choice"),
    "stream": Field(BOTH, True, "server-sent events"),
    "stream_options": Field(BOTH, True, "include_usage only"),
    "frequency_penalty": Field(BOTH, True, "-2 to 2, over output tokens"),
    "presence_penalty": Field(BOTH, True, "-2 to 2, over output tokens"),
    "repetition_penalty": Field(BOTH, True, "vLLM extension: (0, 2], over prompt and output tokens"),
    "logit_bias": Field(BOTH, True, "token id (string) -> bias in [-100, 100]"),
    "logprobs": Field(BOTH, True, "chat: boolean; completions: 0 to 20 alternatives"),
    "top_logprobs": Field(CHAT, True, "0 to 20; needs logprobs: true"),
    "min_tokens": Field(BOTH, True, "vLLM extension: EOS and stop_token_ids masked until then"),
    "cache_salt": Field(BOTH, True, "vLLM extension: cached prefix blocks are reused only under one salt"),
    "ignore_eos": Field(BOTH, True, "vLLM extension: keep generating past EOS"),
    "echo": Field(COMPLETION, True, "the prompt's text before the completion; not with logprobs"),
    "best_of": Field(COMPLETION, True, "only equal to n: no ranking of extra candidates (400 otherwise)"),
    "suffix": Field(COMPLETION, False, "no insertion (fill-in-the-middle) mode"),
    "response_format": Field(CHAT, True, "text, json_object, json_schema (strict or not), by grammar"),
    "tools": Field(CHAT, True, "function tools; the answer is grammar-bound JSON, parsed into tool_calls"),
    "tool_choice": Field(CHAT, True, "none, auto, required or a named function"),
    "parallel_tool_calls": Field(CHAT, True, "false: at most one call"),
    "functions": Field(CHAT, False, "deprecated: use tools", inert=([],)),
    "function_call": Field(CHAT, False, "deprecated: use tool_choice", inert=("none",)),
    "user": Field(BOTH, True, "an end-user id for the operator's logs; does not change the output"),
    "safety_identifier": Field(CHAT, True, "as user"),
    "metadata": Field(CHAT, False, "nothing is stored", inert=({},)),
    "store": Field(CHAT, False, "nothing is stored", inert=(False,)),
    "prompt_cache_key": Field(CHAT, False, "prefix caching is automatic; no routing key"),
    "service_tier": Field(CHAT, False, "one tier", inert=("auto", "default")),
    "modalities": Field(CHAT, False, "text only", inert=(["text"],)),
    "audio": Field(CHAT, False, "text only"),
    "prediction": Field(CHAT, False, "no predicted outputs"),
    "reasoning_effort": Field(CHAT, False, "not a reasoning model"),
    "verbosity": Field(CHAT, False, "no verbosity control"),
    "web_search_options": Field(CHAT, False, "no web search"),
}


def check_fields(body: Mapping[str, Any], endpoint: Endpoint) -> None:
    """400 naming the first field this endpoint does not know, or knows but cannot honour with its value."""
    for name, value in body.items():
        spec = FIELDS.get(name)
        if spec is None or endpoint not in spec.endpoints:
            raise bad_request(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
        if not spec.honoured and value is not None and not _inert(value, spec.inert):
            raise bad_request(
                f"'{name}' is not supported by this server: {spec.note}", name, "unsupported_parameter"
            )


def _inert(value: Any, inert: tuple[Any, ...]) -> bool:
    return any(type(value) is type(v) and value == v for v in inert)
