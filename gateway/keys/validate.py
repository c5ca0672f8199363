"""Request intake for the cacheable routes: read the body within the size limit, parse it, check field types.

User input never reaches an assert: every problem becomes a typed 4xx (gateway.web.errors) naming the field.
Unknown fields are not rejected: they pass to the upstream and stay in the key. Message roles and content follow
`tokenedge_wire.chat_schema`, the rules the backend shares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from gateway.web import aioseam
from gateway.web.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from tokenedge_wire.chat_schema import messages_problem

MAX_DEPTH = 64


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {max_bytes} bytes")
    if max_bytes >= aioseam.client_max_size(request.app):  # aiohttp enforces the same limit while reading
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise PayloadTooLarge(f"request body exceeds the limit of {max_bytes} bytes") from None
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"request body exceeds the limit of {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def is_json_media(media: str) -> bool:
    """A JSON media type (RFC 8259 §11, RFC 6839 §3.1 `+json`), `media` lower-case without parameters."""
    return media == "application/json" or media.endswith("+json")


def check_content_type(request: web.Request) -> None:
    """415 for a declared non-JSON type; a missing Content-Type is accepted and parsed as JSON."""
    if "Content-Type" not in request.headers:
        return
    ctype = request.content_type
    if not is_json_media(ctype):
        raise UnsupportedMediaType(f"Content-Type must be application/json, got {ctype!r}")


def parse_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON (or not valid UTF-8): {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    if _depth(body, 0) > MAX_DEPTH:
        raise BadRequest(f"request body is nested deeper than {MAX_DEPTH} levels")
    return body


def _depth(value: Any, level: int) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fail(param: str, expected: str, value: Any) -> BadRequest:
    shown = orjson.dumps(value)[:80].decode(errors="replace")
    return BadRequest(f"'{param}' must be {expected}, got {shown}", param=param)


_NUMERIC_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}


def _check_common(body: Mapping[str, Any]) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _fail("model", "a non-empty string", model)
    for name, (low, high) in _NUMERIC_RANGES.items():
        value = body.get(name)
        if value is not None and (not _is_number(value) or not low <= value <= high):
            raise _fail(name, f"a number between {low:g} and {high:g}", value)
    for name in ("n", "max_tokens", "max_completion_tokens", "top_k"):
        value = body.get(name)
        if value is not None and (not _is_int(value) or value < (0 if name == "top_k" else 1)):
            raise _fail(name, "a positive integer", value)
    if "seed" in body and body["seed"] is not None and not _is_int(body["seed"]):
        raise _fail("seed", "an integer", body["seed"])
    if "stream" in body and body["stream"] is not None and not isinstance(body["stream"], bool):
        raise _fail("stream", "a boolean", body["stream"])
    stop = body.get("stop")
    if (
        stop is not None
        and not isinstance(stop, str)
        and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise _fail("stop", "a string or a list of strings", stop)
    for name in ("stream_options", "logit_bias", "metadata", "response_format"):
        value = body.get(name)
        if value is not None and not isinstance(value, dict):
            raise _fail(name, "an object", value)
    if body.get("tools") is not None and not isinstance(body["tools"], list):
        raise _fail("tools", "a list", body["tools"])


def _check_messages(messages: Any) -> None:
    problem = messages_problem(messages)  # the rules the backend shares (tokenedge_wire.chat_schema)
    if problem is not None:
        raise _fail(problem.param, problem.expected, problem.value)


def _is_text_or_tokens(value: Any) -> bool:
    if isinstance(value, str):
        return True
    if not isinstance(value, list) or not value:
        return False
    return (
        all(isinstance(v, str) for v in value)
        or all(_is_int(v) for v in value)
        or all(isinstance(v, list) and v and all(_is_int(t) for t in v) for v in value)
    )


def validate(endpoint: str, body: Mapping[str, Any]) -> None:
    _check_common(body)
    if endpoint == "chat/completions":
        _check_messages(body.get("messages"))
    elif endpoint == "completions":
        if not _is_text_or_tokens(body.get("prompt")):
            raise _fail("prompt", "a string, a list of strings or a list of token ids", body.get("prompt"))
    elif endpoint == "embeddings" and not _is_text_or_tokens(body.get("input")):
        raise _fail("input", "a string, a list of strings or a list of token ids", body.get("input"))
    elif endpoint == "responses":
        _check_responses(body)


def _check_responses(body: Mapping[str, Any]) -> None:
    """The shape the policy reads (`store`, `previous_response_id`, `tools`); the rest is the upstream's to judge."""
    value = body.get("input")
    if value is not None and not isinstance(value, str | list):
        raise _fail("input", "a string or a list of input items", value)
    if body.get("store") is not None and not isinstance(body["store"], bool):
        raise _fail("store", "a boolean", body["store"])
    if body.get("previous_response_id") is not None and not isinstance(body["previous_response_id"], str):
        raise _fail("previous_response_id", "a string", body["previous_response_id"])
