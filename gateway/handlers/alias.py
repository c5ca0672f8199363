"""`GET /v1/cache/{key}`: the content-addressed alias any CDN can cache, and `POST /v1/cache/explain`.

The alias answers from L1/L2 only, never the upstream, through the hit core: the same verdict, headers and
counting as any hit, and `If-None-Match` answered 304 (RFC 9110 §13.1.2).
A tenant-scoped key answers only to that tenant's credential; to anyone else it does not exist (404, not 403,
so key existence does not leak).
"""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.config.settings import CACHEABLE_ENDPOINTS
from gateway.hits.respond import json_answer
from gateway.hits.scope import key_scope, scope_of
from gateway.hits.verdict import Verdict, judge
from gateway.keys.cache_control import parse_request_cache_control
from gateway.keys.canonical import CanonicalizationError
from gateway.keys.derive import PUBLIC_SCOPE, derive_key, parse_key
from gateway.keys.policy import USAGE_ENDPOINTS, Lookup, decide
from gateway.keys.validate import parse_object, read_body, validate
from gateway.state import STATE
from gateway.tokens.keyform import NOT_TOKEN_LEVEL, TOKEN_LEVELS, key_form, key_tokenizer
from gateway.upstream.http import forward_headers
from gateway.web.errors import BadRequest, NotFound


async def get_alias(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    parsed = parse_key(request.match_info["key"])
    if parsed is None:
        raise NotFound("no such cache entry")
    if parsed.scope != PUBLIC_SCOPE and scope_of(request, state) != parsed.scope:
        raise NotFound("no such cache entry")
    found = await state.cache.get(parsed.key)
    now = state.clock()
    if (
        found is None
        or judge(found.entry, now, needs_usage=found.entry.endpoint in USAGE_ENDPOINTS) is not Verdict.HIT
    ):
        raise NotFound("no such cache entry")
    return json_answer(request, state, found.entry, now, found.tier, None)


async def explain(request: web.Request) -> web.Response:
    """The canonical form, the level actually used, the key and the decision for a request, without a completion
    call (like a lookup, it may read the upstream's `/v1/models` and, at the `tokens` level, its tokenizer)."""
    state = request.app[STATE]
    doc = parse_object(await read_body(request, state.config.server.max_body_bytes))
    endpoint = doc.get("endpoint", "chat/completions")
    body = doc.get("request")
    if endpoint not in CACHEABLE_ENDPOINTS:
        raise BadRequest(f"'endpoint' must be one of {', '.join(CACHEABLE_ENDPOINTS)}", param="endpoint")
    if not isinstance(body, dict):
        raise BadRequest("'request' must be the request body object to explain", param="request")
    validate(endpoint, body)
    route = state.config.routes[endpoint]
    directives = parse_request_cache_control(
        request.headers.get("Cache-Control"), request.headers.get("Pragma")
    )
    decision = decide(endpoint, body, directives, state.policies[endpoint])
    fwd = forward_headers(request.headers, api_key=state.config.upstream.api_key, identity=True)
    revision = await state.catalog.revision(body["model"], fwd)  # `GET /v1/models` at most, as a lookup does
    tok = NOT_TOKEN_LEVEL
    if route.level in TOKEN_LEVELS:
        tok = await key_tokenizer(state, endpoint, body["model"], revision, lambda: fwd)
    try:
        form = await key_form(state, route.level, endpoint, body, tok, lambda: fwd)
    except CanonicalizationError as exc:
        raise BadRequest(str(exc)) from None
    level, canonical = form.level, form.form
    scope = key_scope(request, state, endpoint)
    key = derive_key(
        scope=scope, endpoint=endpoint, level=level, model_revision=revision, canonical=canonical
    )
    out = {
        "endpoint": endpoint,
        "level": level.value,
        "route_level": route.level,
        "scope": scope,
        "revision": revision,
        "canonical": canonical,
        "tokenizer": form.tokenizer or None,
        "fallback": (
            None
            if form.fallback is None
            else {"reason": form.fallback.reason.value, "detail": form.fallback.detail}
        ),
        "key": key.key,
        "decision": (
            {"action": "lookup", "ttl_s": decision.ttl_s, "read": decision.read}
            if isinstance(decision, Lookup)
            else {"action": "bypass", "reason": decision.reason.value}
        ),
    }
    return web.Response(body=orjson.dumps(out), content_type="application/json")
