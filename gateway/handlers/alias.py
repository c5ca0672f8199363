"""`GET /v1/cache/{key}`: the content-addressed alias any CDN can cache, and `POST /v1/cache/explain`.

The alias answers from L1/L2 only, never the upstream, through the hit core: the same verdict, headers and
counting as any hit, and `If-None-Match` answered 304 (RFC 9110 §13.1.2).
A tenant-scoped key answers only to that tenant's credential; to anyone else it does not exist (404, not 403,
so key existence does not leak).
"""

from __future__ import annotations

from dataclasses import replace

import orjson
from aiohttp import web

from gateway.config.settings import CACHEABLE_ENDPOINTS
from gateway.hits.respond import json_answer
from gateway.hits.scope import scope_of
from gateway.hits.verdict import Verdict, judge
from gateway.intake.pipeline import admit, resolve_key
from gateway.keys.derive import PUBLIC_SCOPE, parse_key
from gateway.keys.memo import ParsedRequest
from gateway.keys.policy import USAGE_ENDPOINTS, Lookup
from gateway.keys.validate import parse_object, read_body, validate
from gateway.state import STATE
from gateway.upstream.http import forward_headers
from gateway.web.errors import BadRequest, NotFound


async def get_alias(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    parsed = parse_key(request.match_info["key"])
    if parsed is None:
        raise NotFound("no such cache entry")
    if parsed.scope != PUBLIC_SCOPE and scope_of(request, state) != parsed.scope:
        raise NotFound("no such cache entry")
    found = await state.cache.get(parsed.key)  # P3, P4: back-filled and answered only if no purge raced it
    if found is None:
        raise NotFound("no such cache entry")
    revision = state.catalog.fresh_revision(found.entry.model)
    # Not known without asking: the catalog asks the upstream first, then the cache is read again, so no purge slips
    # between the read and the answer.
    if revision is None:
        fwd = forward_headers(request.headers, api_key=state.config.upstream.api_key, identity=True)
        revision = await state.catalog.revision(found.entry.model, fwd)
        found = await state.cache.get(parsed.key)
    now = state.clock()
    if (
        found is None
        or judge(found.entry, now, revision=revision, needs_usage=found.entry.endpoint in USAGE_ENDPOINTS)
        is not Verdict.HIT
    ):  # P6: an old revision's entry is not served once the new revision is known
        raise NotFound("no such cache entry")
    return json_answer(request, state, found.entry, now, found.tier, None)


async def explain(request: web.Request) -> web.Response:
    """The route's own decision and key for a request, without a completion call: the intake pipeline the route
    runs (gateway.intake.pipeline), with this request's headers and query string as the route would see them
    (like a lookup, it may read the upstream's `/v1/models` and, at the `tokens` level, its tokenizer)."""
    state = request.app[STATE]
    doc = parse_object(await read_body(request, state.config.server.max_body_bytes))
    endpoint = doc.get("endpoint", "chat/completions")
    body = doc.get("request")
    if endpoint not in CACHEABLE_ENDPOINTS:
        raise BadRequest(f"'endpoint' must be one of {', '.join(CACHEABLE_ENDPOINTS)}", param="endpoint")
    if not isinstance(body, dict):
        raise BadRequest("'request' must be the request body object to explain", param="request")
    validate(endpoint, body)
    prep = await admit(request, state, endpoint, ParsedRequest(endpoint, body), b"")
    resolved = await resolve_key(request, state, prep)
    form = resolved.form
    assert form is not None, "a record outside the memo builds its form"
    decision = prep.decision
    if isinstance(decision, Lookup) and decision.seeded:  # admit confirmed it: the upstream promises
        decision = replace(decision, seeded=False)
    out = {
        "endpoint": endpoint,
        "level": resolved.level.value,
        "route_level": state.config.routes[endpoint].level,
        "scope": resolved.key.scope,
        "revision": resolved.revision,
        "canonical": form.form,
        "tokenizer": form.tokenizer or None,
        "fallback": (
            None
            if form.fallback is None
            else {"reason": form.fallback.reason.value, "detail": form.fallback.detail}
        ),
        "key": resolved.key.key,
        "decision": (
            {"action": "lookup", "ttl_s": decision.ttl_s, "read": decision.read}
            if isinstance(decision, Lookup)
            else {"action": "bypass", "reason": decision.reason.value}
        ),
    }
    return web.Response(body=orjson.dumps(out), content_type="application/json")
