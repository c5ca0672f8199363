"""The `tokens` key level (design §2): the cache key holds the exact token ids the model will receive.

Only a tokenedge backend's own tokenizer qualifies (its ids are the backend's, byte for byte; an estimate such as
cl100k for an OpenAI model would not do), and a chat also needs the model's chat template. Where either is
missing, or a request is not renderable exactly as the backend would render it, a route's `auto` (or `tokens`)
level falls back to `exact`; the level actually used is part of the key, so the two never share an entry.
The ids come from the token path's encoder and its token cache, so repeated text is encoded once.
Any other upstream may still key at the `tokens` level where its engine's own tokenize routes passed a probe
(`gateway.tokens.remote`); there each new request body is tokenized by the engine once, and a failure keys it
`exact`. Every fallback to `exact` under an `auto`/`tokens` route carries its reason (explain, and
`tokenedge_key_level_fallbacks_total{reason}`, counted once per new canonical form).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.keys.canonical import AUTO, Fallback, Level, canonicalize, tokens_form
from gateway.tokens.encoder import ModelEncoder, Unrenderable
from gateway.tokens.needs import TokenState
from gateway.tokens.probe import Refused, Verified
from gateway.tokens.remote import remote_input

TOKEN_LEVELS = frozenset({AUTO, Level.TOKENS.value})


async def key_encoder(
    state: TokenState, model: Any, headers: Callable[[], Mapping[str, str]]
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


@dataclass(frozen=True, slots=True)
class KeyTokenizer:
    """Where a request under an `auto`/`tokens` route gets its ids: the backend's own encoder, a verified remote
    engine, or neither (`refused` says why)."""

    encoder: ModelEncoder | None = None
    remote: Verified | None = None
    refused: Refused | None = None

    @property
    def version(self) -> str:
        """What the key's ids are meaningful under ("" where there are none)."""
        if self.encoder is not None:
            return self.encoder.version
        return self.remote.identity if self.remote is not None else ""


NOT_TOKEN_LEVEL = KeyTokenizer()


@dataclass(frozen=True, slots=True)
class KeyForm:
    level: Level
    form: dict[str, Any]
    tokenizer: str  # what the canonical bytes were built with; "" after a transient failure (asked again)
    fallback: Refused | None = None  # why an auto/tokens route keyed this request `exact`


async def key_tokenizer(
    state: TokenState, endpoint: str, model: Any, revision: str, headers: Callable[[], Mapping[str, str]]
) -> KeyTokenizer:
    """The backend's encoder (GET /v1/tokenizer), else a remote engine whose tokenize routes verified for
    (model, revision); no await once both are known."""
    encoder = await key_encoder(state, model, headers)
    if encoder is not None:
        return KeyTokenizer(encoder=encoder)
    remote = state.tokens.remote if state.tokens is not None else None
    if remote is None or not isinstance(model, str):
        return KeyTokenizer(refused=Refused(Fallback.NO_TOKENIZER, "the token path is off for this model"))
    verdict = await remote.verdict(endpoint, model, revision, headers())
    return KeyTokenizer(remote=verdict) if isinstance(verdict, Verified) else KeyTokenizer(refused=verdict)


def key_tokenizer_now(state: TokenState, endpoint: str, model: Any, revision: str) -> KeyTokenizer | None:
    """`key_tokenizer`'s answer when it needs no await, else None: the fast lane checks a memoized key's
    tokenizer identity with it (a key is reused only under the identity it was derived with)."""
    path = state.tokens
    if path is not None and isinstance(model, str):
        info = path.catalog.known.get(model)
        if info is not None and info.tokenizer:
            spec = path.registry.known(info.tokenizer)
            if spec is None:
                return None  # key_encoder would fetch it
            if spec.source == "backend":
                return KeyTokenizer(encoder=path.encoder(spec))
    remote = path.remote if path is not None else None
    if remote is None or not isinstance(model, str):
        return KeyTokenizer(refused=Refused(Fallback.NO_TOKENIZER, "the token path is off for this model"))
    verdict = remote.known_verdict(endpoint, model, revision)
    if verdict is None:
        return None
    return KeyTokenizer(remote=verdict) if isinstance(verdict, Verified) else KeyTokenizer(refused=verdict)


async def key_form(
    state: TokenState,
    route_level: str,
    endpoint: str,
    body: Mapping[str, Any],
    tok: KeyTokenizer,
    headers: Callable[[], Mapping[str, str]],
) -> KeyForm:
    """The canonical form for the key (raises CanonicalizationError); a remote engine is asked here, once per new
    body, and whatever goes wrong keys the request `exact`."""
    remote = state.tokens.remote if state.tokens is not None else None
    if route_level not in TOKEN_LEVELS or tok.remote is None or remote is None:
        level, form = canonical_form(route_level, endpoint, body, tok.encoder)
        fallback = None
        if route_level in TOKEN_LEVELS and level is Level.EXACT:
            fallback = tok.refused or Refused(
                Fallback.UNSUPPORTED_REQUEST, "the model's template or tokenizer cannot render it exactly"
            )
        return _counted(state, KeyForm(level, form, tok.version, fallback))
    exact = canonicalize(endpoint, body, Level.EXACT)
    value = remote_input(endpoint, body)
    if value is None:
        why = Refused(Fallback.UNSUPPORTED_REQUEST, "fields or content parts the engine's ids would not show")
        return _counted(state, KeyForm(Level.EXACT, exact, tok.version, why))
    ids = await remote.ids(tok.remote, endpoint, body["model"], value, headers())
    if isinstance(ids, Fallback):
        why = Refused(ids, f"{tok.remote.kind}: {ids.value.replace('_', ' ')}")
        return _counted(state, KeyForm(Level.EXACT, exact, "", why))
    return KeyForm(Level.TOKENS, tokens_form(endpoint, exact, ids, tok.remote.identity), tok.remote.identity)


def _counted(state: TokenState, form: KeyForm) -> KeyForm:
    if form.fallback is not None:
        state.metrics.key_level_fallbacks.labels(form.fallback.reason.value).inc()
    return form
