"""Canonical form of an OpenAI-style request: the value a cache key is derived from (DESIGN §2).

Two requests get the same canonical form only when the chosen level says they are equivalent. `exact` removes
JSON-level differences only (key order, number spelling, documented OpenAI defaults, the `max_tokens` alias,
transport and bookkeeping fields); text bytes and content-part structure are never touched. `tokens` replaces the
prompt (the rendered chat template, the completion prompt or the embeddings input) with the exact token ids the
model receives, next to the `exact` form of every other field (`tokens_form`; the ids come from the token path).
`normalized` and `aggressive` (opt-in, never a default) also rewrite text (NFC, zero-width removal, CRLF folding,
trimming; then NFKC, case folding, punctuation and whitespace runs): they change the bytes the tokenizer sees, so
they MAY serve an answer the model would not give to this exact text. Everything not understood is kept, so an
unknown field can only split keys, never merge them. Pure functions: no I/O, the input is never mutated, and
`canonicalize` is idempotent, so a canonical form (as `/v1/cache/explain` shows it) canonicalizes to itself.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, assert_never

import orjson

CANON_VERSION: Final = (
    2  # 2: `exact` keeps content parts; `standard` became the opt-in `normalized`; `tokens`
)


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


class CanonicalizationError(ValueError):
    """The request is not representable as canonical JSON; the message is fit for a 400 response."""


TextFn = Callable[[str], str]

# JSON nesting deeper than this is refused instead of overflowing the Python stack.
MAX_DEPTH: Final = 128
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1  # orjson writes integers in [-2^63, 2^64 - 1]

# Fields that never change the answer, only its transport or bookkeeping (DESIGN §2).
NON_SEMANTIC: Final = frozenset(
    {
        "stream",
        "stream_options",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "metadata",
        "store",
        "service_tier",
        "request_id",
    }
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

_ZERO_WIDTH: Final = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))
_WHITESPACE_RUN: Final = re.compile(r"\s+")
_FOLD_PASSES: Final = 4


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
    for name in NON_SEMANTIC & request.keys():
        del request[name]
    _elide_defaults(request, _DEFAULTS[endpoint])
    match endpoint:
        case "chat/completions":
            _chat(request, text, parts)
        case "completions":
            _strings_field(request, "prompt", text)
        case "embeddings":
            _strings_field(request, "input", text)
    return request


def tokens_form(endpoint: str, exact: Mapping[str, Any], ids: Any, tokenizer: str) -> dict[str, Any]:
    """The `tokens` canonical form: the model's input ids and tokenizer version, beside every other field's
    `exact` form (`exact` is `canonicalize(endpoint, body, Level.EXACT)`). Two requests get the same form iff
    the model receives the same ids with the same parameters. The ids sit apart from the parameters, so no
    client field can collide with them.
    """
    params = {name: value for name, value in exact.items() if name != TEXT_FIELDS[endpoint]}
    return {"input": {"ids": plain_json(ids), "tokenizer": tokenizer}, "params": params}


def canonical_json(obj: Any) -> bytes:
    """Canonical UTF-8 JSON: keys sorted recursively, no spaces, integral floats as ints."""
    try:
        return orjson.dumps(plain_json(obj), option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:  # unreachable after plain_json; kept as the one boundary
        raise CanonicalizationError(f"not representable as JSON: {exc}") from exc


def plain_json(value: Any, depth: int = 0) -> Any:
    """A deep copy of `value` as plain JSON types with numbers normalized; raises CanonicalizationError."""
    if depth > MAX_DEPTH:
        raise CanonicalizationError(f"JSON nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _valid_str(value)
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise CanonicalizationError("integer outside the 64-bit range")
        return int(value)
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalizationError("JSON object keys must be strings")
            out[_valid_str(key)] = plain_json(item, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [plain_json(item, depth + 1) for item in value]
    raise CanonicalizationError(f"not a JSON value: {type(value).__name__}")


def _number(value: float) -> int | float:
    # RFC 8259 §6: NaN and Infinity are not JSON numbers.
    if math.isnan(value) or math.isinf(value):
        raise CanonicalizationError("NaN and Infinity are not valid JSON numbers")
    if value.is_integer() and _INT_MIN <= value < 2**63:
        return int(value)  # 1.0 -> 1 and -0.0 -> 0
    return value


def _valid_str(value: str) -> str:
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise CanonicalizationError("string is not valid Unicode (lone surrogate)") from exc
    return value


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


def normalized_text(value: str) -> str:
    """NFC, zero-width characters removed, CRLF/CR -> LF, outer whitespace stripped; inner whitespace kept.

    Opt-in only: every one of these changes the bytes the tokenizer sees, so the answer may differ.

    Zero-width characters go before NFC, since removing one can bring a letter and its accent together.
    """
    value = value.translate(_ZERO_WIDTH).replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", value).strip()


def aggressive_text(value: str) -> str:
    """`normalized_text` plus NFKC, casefold, punctuation (Unicode P*) stripped, whitespace runs collapsed.

    Repeated until stable (in practice one pass, rarely two): deleting punctuation or casefolding can leave
    a string that NFKC would change again, and the result must be idempotent.
    """
    for _ in range(_FOLD_PASSES):
        folded = _fold_once(value)
        if folded == value:
            break
        value = folded
    return value


def _fold_once(value: str) -> str:
    value = unicodedata.normalize("NFKC", normalized_text(value)).casefold()
    value = "".join(ch for ch in value if not unicodedata.category(ch).startswith("P"))
    return _WHITESPACE_RUN.sub(" ", unicodedata.normalize("NFKC", value)).strip()
