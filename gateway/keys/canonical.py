"""Canonical form of an OpenAI-style request: the value a cache key is derived from (design §2).

Two requests get the same canonical form only when the chosen level says they are equivalent. `exact` removes
JSON-level differences only (number spelling, documented OpenAI defaults, the `max_tokens` alias, transport and
bookkeeping fields, and key order where it never reaches the model); text bytes and content-part structure are never
touched. Key order is sorted only in the request's own fields, each message's (and content part's) own keys and the
known order-free maps (`logit_bias`, `metadata`); everywhere else (`tools`, `functions`, `response_format`, engine
extras such as `guided_json` or `structured_outputs`, any nested value not known to be order-free) the client's
order is kept, since engines render tools into the prompt and generate schema properties in that order. The form's
own member order is that canonical order, and `canonical_json` writes it as it is. `tokens` replaces the
prompt (the rendered chat template, the completion prompt or the embeddings input) with the exact token ids the
model receives, next to the `exact` form of every other field (`tokens_form`; the ids come from the token path).
`normalized` and `aggressive` (opt-in, never a default) also rewrite text (NFC, zero-width removal, CRLF folding,
trimming; then NFKC, case folding, punctuation and whitespace runs): they change the bytes the tokenizer sees, so
they MAY serve an answer the model would not give to this exact text. Everything not understood is kept, so an
unknown field can only split keys, never merge them. Pure functions: no I/O, the input is never mutated, and
`canonicalize` is idempotent, so a canonical form (as `/v1/cache/explain` shows it) canonicalizes to itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, assert_never

import orjson

from gateway.keys.jsonvalue import CanonicalizationError, plain_json
from gateway.keys.parts import TRANSPORT_FIELDS
from gateway.keys.textnorm import aggressive_text, normalized_text

# Part of every key, so a change here leaves old entries unreachable (a miss, never a wrong hit; no migration).
# 3: key order kept wherever it reaches the model (tools, schemas, unknown nested values); 2: `exact` keeps
# content parts, `standard` became the opt-in `normalized`, `tokens`.
CANON_VERSION: Final = 3


class Level(StrEnum):
    """How much two requests may differ and still share an entry: the level a key was built at."""

    EXACT = "exact"
    TOKENS = "tokens"
    NORMALIZED = "normalized"
    AGGRESSIVE = "aggressive"


AUTO: Final = (
    "auto"  # a route setting, never a key level: `tokens` where the model's ids are known, else `exact`
)
ROUTE_LEVELS: Final = (AUTO, *(level.value for level in Level))


class Fallback(StrEnum):
    """Why a request under an `auto`/`tokens` route was keyed `exact` (a metric label and explain's reason)."""

    NO_TOKENIZER = "no_tokenizer"  # the upstream offers no tokenize route for this model
    PROBE_FAILED = "probe_failed"  # a probe call failed or did not answer ids
    PROBE_INCONSISTENT = "probe_inconsistent"  # ids unstable, or equal where the words differ, ...
    UNSUPPORTED_REQUEST = "unsupported_request"  # fields or parts whose effect the ids would not show
    TOKENIZE_ERROR = "tokenize_error"  # this request's remote tokenization failed
    TOKENIZE_TIMEOUT = "tokenize_timeout"
    BREAKER_OPEN = "breaker_open"  # recent remote tokenizations failed: not asked for a while


TEXT_FIELDS: Final[Mapping[str, str]] = MappingProxyType(
    {"chat/completions": "messages", "completions": "prompt", "embeddings": "input", "responses": "input"}
)


TextFn = Callable[[str], str]

# Maps whose member order no upstream reads: sorted, like the request's and each message's own keys.
ORDER_FREE_MAPS: Final = frozenset({"logit_bias", "metadata"})
_MESSAGE_LISTS: Final[Mapping[str, str]] = MappingProxyType(
    {"chat/completions": "messages", "responses": "input"}
)

# OpenAI documents these as "... or null" with null meaning the default: null == absent.
_NULL_IS_DEFAULT: Final = frozenset(
    {
        "temperature",
        "top_p",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "top_logprobs",
        "stop",
        "logit_bias",
        "max_tokens",
        "max_completion_tokens",
        "seed",
        "best_of",
        "echo",
        "suffix",
        "dimensions",
    }
)

_SAMPLING_DEFAULTS: Final[Mapping[str, Any]] = {
    "temperature": 1,
    "top_p": 1,
    "n": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": {},
    "stop": [],
}
# Only documented OpenAI defaults; completions' `max_tokens` (16) is left alone: upstreams disagree.
_DEFAULTS: Final[Mapping[str, Mapping[str, Any]]] = MappingProxyType(
    {
        "chat/completions": MappingProxyType(
            {
                **_SAMPLING_DEFAULTS,
                "logprobs": False,
                "parallel_tool_calls": True,
                "response_format": {"type": "text"},
            }
        ),
        "completions": MappingProxyType({**_SAMPLING_DEFAULTS, "echo": False, "best_of": 1}),
        "embeddings": MappingProxyType({"encoding_format": "float"}),
        # Responses: exact only (config refuses the text levels), so only its documented defaults are elided.
        "responses": MappingProxyType(
            {"temperature": 1, "top_p": 1, "parallel_tool_calls": True, "truncation": "disabled"}
        ),
    }
)
ENDPOINTS: Final = frozenset(_DEFAULTS)


def canonicalize(endpoint: str, body: Mapping[str, Any], level: Level) -> dict[str, Any]:
    """The canonical request for `endpoint` ("chat/completions", "completions", "embeddings" or "responses").

    `Level.TOKENS` needs the model's ids: build it with `tokens_form` over the `exact` form.
    """
    if endpoint not in ENDPOINTS:
        raise ValueError(f"not a cacheable endpoint: {endpoint!r}")
    text, parts = _text_normalizer(Level(level))
    request = plain_json(body)  # a validated deep copy: everything below may edit it in place
    if not isinstance(request, dict):
        raise CanonicalizationError("the request body must be a JSON object")
    for name in TRANSPORT_FIELDS[endpoint] & request.keys():  # the request table (gateway.keys.parts)
        del request[name]
    _elide_defaults(request, _DEFAULTS[endpoint])
    match endpoint:
        case "chat/completions":
            _chat(request, text, parts)
        case "completions":
            _strings_field(request, "prompt", text)
        case "embeddings":
            _strings_field(request, "input", text)
    return _in_canonical_order(endpoint, request)


def _in_canonical_order(endpoint: str, request: dict[str, Any]) -> dict[str, Any]:
    """Sorts the members no upstream reads in order: the request's fields, each message's and content part's
    own keys, the order-free maps. Everything nested keeps the client's order (tools, schemas, extras)."""
    for name in ORDER_FREE_MAPS & request.keys():
        if isinstance(request[name], dict):
            request[name] = _sorted(request[name])
    items = request.get(_MESSAGE_LISTS.get(endpoint, ""))
    if isinstance(items, list):
        request[_MESSAGE_LISTS[endpoint]] = [_message_order(item) for item in items]
    return _sorted(request)


def _message_order(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if isinstance(content, list):
        message["content"] = [_sorted(part) if isinstance(part, dict) else part for part in content]
    return _sorted(message)


def _sorted(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(sorted(obj.items()))


def tokens_form(endpoint: str, exact: Mapping[str, Any], ids: Any, tokenizer: str) -> dict[str, Any]:
    """The `tokens` canonical form: the model's input ids and tokenizer version, beside every other field's
    `exact` form (`exact` is `canonicalize(endpoint, body, Level.EXACT)`). Two requests get the same form iff
    the model receives the same ids with the same parameters. The ids sit apart from the parameters, so no
    client field can collide with them.
    """
    params = {name: value for name, value in exact.items() if name != TEXT_FIELDS[endpoint]}
    return {"input": {"ids": plain_json(ids), "tokenizer": tokenizer}, "params": params}


def canonical_json(obj: Any) -> bytes:
    """Canonical UTF-8 JSON of a canonical form: no spaces, integral floats as ints, the top-level keys sorted
    (a request's fields, a tokens form's parts, a key's material) and every nested member in the order given:
    `canonicalize` has already sorted the nested objects whose order no upstream reads. One pass, then orjson.
    """
    plain = plain_json(obj)
    try:
        return orjson.dumps(_sorted(plain) if isinstance(plain, dict) else plain)
    except orjson.JSONEncodeError as exc:  # unreachable after plain_json; kept as the one boundary
        raise CanonicalizationError(f"not representable as JSON: {exc}") from exc


def _same(value: Any, default: Any) -> bool:
    """Equality that keeps `true` apart from `1` (Python says True == 1; JSON does not)."""
    if isinstance(value, bool) or isinstance(default, bool):
        return type(value) is type(default) and value == default
    if isinstance(value, int | float) and isinstance(default, int | float):
        return value == default
    return type(value) is type(default) and bool(value == default)


def _elide_defaults(request: dict[str, Any], defaults: Mapping[str, Any]) -> None:
    for name in _NULL_IS_DEFAULT & request.keys():
        if request[name] is None:
            del request[name]
    stop = request.get("stop")
    if isinstance(stop, list) and len(stop) == 1 and isinstance(stop[0], str):
        request["stop"] = stop[0]  # one stop sequence, however it is spelled
    for name in defaults.keys() & request.keys():
        if _same(request[name], defaults[name]):
            del request[name]


def _chat(request: dict[str, Any], text: TextFn | None, parts: bool) -> None:
    _unify_max_tokens(request)
    _elide_choice(request, items="tools", choice="tool_choice")
    _elide_choice(request, items="functions", choice="function_call")  # the legacy spelling
    messages = request.get("messages")
    if isinstance(messages, list):
        request["messages"] = [_message(m, text, parts) for m in messages]


def _unify_max_tokens(request: dict[str, Any]) -> None:
    """`max_completion_tokens` replaced `max_tokens`; one name in the key. Two different values stay apart."""
    if "max_completion_tokens" not in request:
        return
    if "max_tokens" in request and not _same(request["max_tokens"], request["max_completion_tokens"]):
        return
    request["max_tokens"] = request.pop("max_completion_tokens")


def _elide_choice(request: dict[str, Any], *, items: str, choice: str) -> None:
    """OpenAI: the choice defaults to "none" without tools and to "auto" with a non-empty tool list."""
    if choice not in request:
        return
    offered = request.get(items)
    if items not in request:
        default = "none"
    elif isinstance(offered, list) and offered:
        default = "auto"
    else:
        return
    if request[choice] == default:
        del request[choice]


def _message(message: Any, text: TextFn | None, parts: bool) -> Any:
    if isinstance(message, dict) and "content" in message:
        message["content"] = _content(message["content"], text, parts)
    return message


def _content(content: Any, text: TextFn | None, fold_parts: bool) -> Any:
    if isinstance(content, str):
        return text(content) if text else content
    if not isinstance(content, list):
        return content
    parts = [_text_part(part, text) for part in content]
    if fold_parts and len(parts) == 1 and _is_bare_text_part(parts[0]):
        return parts[0]["text"]  # [{"type": "text", "text": "x"}] == "x": templates may render them apart
    return parts


def _text_part(part: Any, text: TextFn | None) -> Any:
    if text and isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        part["text"] = text(part["text"])
    return part


def _is_bare_text_part(part: Any) -> bool:
    return (
        isinstance(part, dict)
        and part.keys() == {"type", "text"}
        and part["type"] == "text"
        and isinstance(part["text"], str)
    )


def _strings_field(request: dict[str, Any], name: str, text: TextFn | None) -> None:
    """`prompt` / `input`: a string or a list of strings is text; token-id lists are left untouched."""
    value = request.get(name)
    if text is None or value is None:
        return
    if isinstance(value, str):
        request[name] = text(value)
    elif isinstance(value, list):
        request[name] = [text(item) if isinstance(item, str) else item for item in value]


def _text_normalizer(level: Level) -> tuple[TextFn | None, bool]:
    """(the text rewrite, whether a lone text part folds into a string) of a level."""
    match level:
        case Level.EXACT:
            return None, False
        case Level.TOKENS:
            raise ValueError("the tokens level is built from the model's ids: use tokens_form")
        case Level.NORMALIZED:
            return normalized_text, True
        case Level.AGGRESSIVE:
            return aggressive_text, True
        case _:
            assert_never(level)
