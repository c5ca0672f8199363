"""The `tokens` key level (DESIGN §2): the cache key holds the exact token ids the model will receive.

Only a tokenedge backend's own tokenizer qualifies (its ids are the backend's, byte for byte; an estimate such as
cl100k for an OpenAI model would not do), and a chat also needs the model's chat template. Where either is
missing, or a request is not renderable exactly as the backend would render it, a route's `auto` (or `tokens`)
level falls back to `exact`; the level actually used is part of the key, so the two never share an entry.
The ids come from the token path's encoder and its token cache, so repeated text is encoded once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gateway.canonical import AUTO, Level, canonicalize, tokens_form
from gateway.state import GatewayState
from gateway.tokens.encoder import ModelEncoder, Unrenderable

TOKEN_LEVELS = frozenset({AUTO, Level.TOKENS.value})


async def key_encoder(
    state: GatewayState, model: Any, headers: Callable[[], Mapping[str, str]]
) -> ModelEncoder | None:
    """The encoder whose ids are exactly the backend's for `model`, or None. No await once it is loaded, and
    `headers` (for the one `GET /v1/tokenizer`) is only built when the tokenizer must be fetched."""
    path = state.tokens
    if path is None or not isinstance(model, str):
        return None
    info = path.catalog.known.get(model)
    if info is None or not info.tokenizer:
        return None
    spec = path.registry.known(info.tokenizer)
    if spec is None:
        spec = await path.registry.backend(info.tokenizer, headers())
    if spec is None or spec.source != "backend":
        return None
    return path.encoder(spec)


def model_input(encoder: ModelEncoder, endpoint: str, body: Mapping[str, Any]) -> list[Any] | None:
    """The ids the backend feeds the model for this request (backend/server/protocol.py's reading of it), or
    None when the gateway cannot know them exactly (no chat template, non-text parts, a shape the backend refuses).
    """
    match endpoint:
        case "chat/completions":
            messages = body.get("messages")
            if not isinstance(messages, list):
                return None
            try:
                return list(encoder.encode_chat(messages))
            except Unrenderable:
                return None
        case "completions":
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
                prompt = prompt[0]  # the backend reads a one-prompt batch as that prompt
            if isinstance(prompt, str):
                return list(encoder.encode(prompt))
            return list(prompt) if _is_ids(prompt) and prompt else None
        case "embeddings":
            return _embeddings_input(encoder, body.get("input"))
    return None


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _embeddings_input(encoder: ModelEncoder, value: Any) -> list[Any] | None:
    """One input (a string or one id array) -> its ids; a batch -> one id list per input, the shape kept."""
    if isinstance(value, str):
        return list(encoder.encode(value))
    if _is_ids(value) and value:
        return list(value)
    if isinstance(value, list) and value and all(isinstance(v, str) or (_is_ids(v) and v) for v in value):
        return [list(encoder.encode(v)) if isinstance(v, str) else list(v) for v in value]
    return None


def canonical_form(
    route_level: str, endpoint: str, body: Mapping[str, Any], encoder: ModelEncoder | None
) -> tuple[Level, dict[str, Any]]:
    """(the level used, the canonical request) for a route's configured level; raises CanonicalizationError."""
    if route_level not in TOKEN_LEVELS:
        level = Level(route_level)
        return level, canonicalize(endpoint, body, level)
    exact = canonicalize(endpoint, body, Level.EXACT)
    ids = None if encoder is None else model_input(encoder, endpoint, body)
    if encoder is None or ids is None:
        return Level.EXACT, exact
    return Level.TOKENS, tokens_form(endpoint, exact, ids, encoder.version)
