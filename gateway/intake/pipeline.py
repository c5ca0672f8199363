"""The intake pipeline: parse -> decide -> confirm -> scope -> revision -> key, written once (design §2.1).

The cacheable routes, `POST /v1/cache/explain` and (from its memo) the fast lane all take a request's decision and
key from here, so explain *is* the route's decision and no lane keys a request another way. The parts of the
request are read as the request table classifies them (`gateway.keys.parts`): the body's canonical form and the
headers' and query's key material make the digest, the credentials make the scope. Repeated bytes find their key in
the request memo with the context it was derived for (scope, revision, tokenizer identity, headers' and query's
key material): a key is reused only when all four are this request's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from gateway.hits.scope import key_scope, wire_of
from gateway.intake.needs import IntakeState
from gateway.keys.cache_control import NO_DIRECTIVES, RequestDirectives, parse_request_cache_control
from gateway.keys.canonical import CanonicalizationError, Level, canonical_json
from gateway.keys.derive import CacheKey, derive_key_from_bytes
from gateway.keys.memo import KeyContext, ParsedRequest
from gateway.keys.parts import wire_parts
from gateway.keys.policy import Bypass, Lookup, confirm_seeded, decide
from gateway.keys.validate import parse_object, validate
from gateway.ops import tracing
from gateway.tokens.keyform import NOT_TOKEN_LEVEL, TOKEN_LEVELS, KeyForm, key_form, key_tokenizer
from gateway.upstream.http import forward_headers
from gateway.web.errors import BadRequest


@dataclass(frozen=True, slots=True)
class Prepared:
    endpoint: str
    raw: bytes
    body: dict[str, Any]
    directives: RequestDirectives
    decision: Lookup | Bypass
    parsed: ParsedRequest


@dataclass(frozen=True, slots=True)
class Resolved:
    model: str
    revision: str
    key: CacheKey
    level: Level  # the level the key was built at (Cache-Status detail on misses)
    forward: Any  # the upstream request headers when already built (a catalog refresh needed them), else None
    form: KeyForm | None = None  # the canonical form, when this request built it (not from the memo)


def directives_of(request: web.Request) -> RequestDirectives:
    cache_control, pragma = request.headers.get("Cache-Control"), request.headers.get("Pragma")
    if cache_control is None and pragma is None:
        return NO_DIRECTIVES
    return parse_request_cache_control(cache_control, pragma)


def parsed_of(state: IntakeState, endpoint: str, raw: bytes) -> ParsedRequest:
    """The memo's record of these exact bytes, or a new one (parsed and validated: raises BadRequest)."""
    parsed = state.memo.get(endpoint, raw)
    if parsed is None:  # first sight of these exact bytes: parse and validate them
        body = parse_object(raw)
        validate(endpoint, body)
        parsed = ParsedRequest(endpoint, body)
        state.memo.put(endpoint, raw, parsed)
    return parsed


def prepare(
    request: web.Request, state: IntakeState, endpoint: str, parsed: ParsedRequest, raw: bytes
) -> Prepared:
    directives = directives_of(request)
    decision = decide(endpoint, parsed.body, directives, state.policies[endpoint])
    return Prepared(endpoint, raw, parsed.body, directives, decision, parsed)


def lane_lookup(state: IntakeState, endpoint: str, parsed: ParsedRequest) -> Lookup | None:
    """The fast lane's decision for memoized bytes (no request directives: a request carrying any goes the ordinary
    way), decided once per memo record; None where the lane may not answer."""
    fast = parsed.fast
    if fast is None:
        decision = decide(endpoint, parsed.body, NO_DIRECTIVES, state.policies[endpoint])
        # A seeded lookup is the ordinary path's: it asks the upstream's promise each time (policy.confirm_seeded).
        usable = (
            isinstance(decision, Lookup)
            and decision.read
            and not decision.seeded
            and parsed.body.get("stream") is not True
        )
        fast = parsed.fast = decision if usable else False
    return fast if isinstance(fast, Lookup) else None


def upstream_headers(request: web.Request, state: IntakeState) -> Any:
    return forward_headers(request.headers, api_key=state.config.upstream.api_key, identity=True)


async def admit(
    request: web.Request, state: IntakeState, endpoint: str, parsed: ParsedRequest, raw: bytes
) -> Prepared:
    """The request's decision: the policy's, and for a seeded sampled request the upstream's promise
    (`policy.confirm_seeded`; the catalog is asked for those requests only)."""
    with tracing.span("tokenedge.intake"):
        prep = prepare(request, state, endpoint, parsed, raw)
        decision = prep.decision
        if isinstance(decision, Lookup) and decision.seeded:
            fwd = upstream_headers(request, state)
            promised = await state.catalog.seeded_invariant(prep.body["model"], fwd)
            prep = replace(prep, decision=confirm_seeded(decision, promised=promised))
    return prep


async def resolve_key(request: web.Request, state: IntakeState, prep: Prepared) -> Resolved:
    """The model revision (no await, no header work while the catalog is fresh) and the request's key."""
    model = prep.body["model"]
    with tracing.span("tokenedge.intake.key"):
        revision = state.catalog.fresh_revision(model)
        fwd: Any = None
        if revision is None:
            fwd = upstream_headers(request, state)
            revision = await state.catalog.revision(model, fwd)
        key, level, form = await _cache_key(request, state, prep, revision)
    tracing.annotate({"tokenedge.key.level": level.value})
    return Resolved(model, revision, key, level, fwd, form)


async def _cache_key(
    request: web.Request, state: IntakeState, prep: Prepared, revision: str
) -> tuple[CacheKey, Level, KeyForm | None]:
    """The request's key and the level it was built at (the route's level; `auto` resolved per model).

    Repeated bytes find both in the request memo: no canonicalization, no tokenization, no await once the
    model's tokenizer is loaded.
    """
    route = state.config.routes[prep.endpoint]
    scope = key_scope(request, state, prep.endpoint)
    wire = wire_of(request, state)
    headers: Callable[[], Mapping[str, str]] = lambda: upstream_headers(request, state)  # noqa: E731
    tok = NOT_TOKEN_LEVEL
    if route.level in TOKEN_LEVELS:
        tok = await key_tokenizer(state, prep.endpoint, prep.body.get("model"), revision, headers)
    tokenizer = tok.version
    parsed = prep.parsed
    context: KeyContext = (scope, revision, tokenizer, wire)
    if parsed.key is not None and parsed.key_level is not None and parsed.key_context == context:
        return parsed.key, parsed.key_level, None
    canonical, level, form = parsed.canonical, parsed.canonical_level, None
    if canonical is None or level is None or parsed.canonical_tokenizer != tokenizer:
        try:  # at most one remote tokenization per new body (a remote engine's ids)
            form = await key_form(state, route.level, prep.endpoint, prep.body, tok, headers)
        except CanonicalizationError as exc:
            raise BadRequest(str(exc)) from None
        level, tokenizer = form.level, form.tokenizer  # "" after a transient failure: asked again next time
        canonical = state.memo.set_canonical(parsed, canonical_json(form.form), level, tokenizer)
    key = derive_key_from_bytes(
        scope=scope,
        endpoint=prep.endpoint,
        level=level,
        model_revision=revision,
        canonical_bytes=canonical,
        wire=wire,
    )
    # the last (tenant, revision, tokenizer, wire) seen for these bytes
    state.memo.set_key(parsed, key, level, (scope, revision, tokenizer, wire))
    if (
        wire
    ):  # counted per key derivation (a repeat of these bytes in this context reuses it), not per request
        state.metrics.count_key_parts(wire_parts(wire))
    return key, level, form
