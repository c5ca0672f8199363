"""The cacheable routes (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`).

parse+validate -> canonicalize -> policy.decide -> Bypass: relay | Lookup: L1 -> L2 -> single-flight -> upstream.
The upstream always receives the client's own bytes; only the key is built from the canonical form.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any, assert_never

from aiohttp import web

from gateway.handlers.relay import relay
from gateway.hits import headers as hdr
from gateway.hits import record
from gateway.hits.lookup import read_cache
from gateway.hits.respond import json_answer
from gateway.hits.scope import key_scope, scope_of
from gateway.keys.cache_control import NO_DIRECTIVES, RequestDirectives, parse_request_cache_control
from gateway.keys.canonical import CanonicalizationError, Level, canonical_json
from gateway.keys.derive import PUBLIC_SCOPE, CacheKey, derive_key_from_bytes
from gateway.keys.entry import Entry
from gateway.keys.memo import ParsedRequest
from gateway.keys.policy import Bypass, Lookup, Outcome, Result, confirm_seeded, decide, wants_usage
from gateway.keys.validate import check_content_type, parse_object, read_body, validate
from gateway.misses.answer import (
    Answered,
    AskAgain,
    FillRequest,
    Serve,
    ServeStale,
    after_upstream,
    miss_reason,
    stale_headers,
    stored_miss_response,
)
from gateway.misses.fill import FillResult, fill
from gateway.misses.lease_fill import leased_fill
from gateway.misses.stream import serve_stream
from gateway.ops.dashboard.hotkeys import PROMPT, prompt_text
from gateway.ops.reqrecord import handler_done
from gateway.ops.timing import lap, start_timer, timer_of
from gateway.state import STATE, GatewayState
from gateway.tokens.keyform import NOT_TOKEN_LEVEL, TOKEN_LEVELS, key_form, key_tokenizer
from gateway.tokens.path import check_bypass, upstream_for
from gateway.upstream.http import forward_headers
from gateway.web.errors import BadRequest, GatewayError, NotCached, UpstreamError


@dataclass(frozen=True, slots=True)
class Prepared:
    endpoint: str
    raw: bytes
    body: dict[str, Any]
    directives: RequestDirectives
    decision: Lookup | Bypass
    parsed: ParsedRequest


async def read_request(request: web.Request, state: GatewayState) -> bytes:
    check_content_type(request)
    return await read_body(request, state.config.server.max_body_bytes)


def prepare(request: web.Request, state: GatewayState, endpoint: str, raw: bytes) -> Prepared:
    parsed = state.memo.get(endpoint, raw)
    if parsed is None:  # first sight of these exact bytes: parse and validate them
        body = parse_object(raw)
        validate(endpoint, body)
        parsed = ParsedRequest(endpoint, body)
        state.memo.put(endpoint, raw, parsed)
    cache_control, pragma = request.headers.get("Cache-Control"), request.headers.get("Pragma")
    directives = (
        NO_DIRECTIVES
        if cache_control is None and pragma is None
        else parse_request_cache_control(cache_control, pragma)
    )
    decision = decide(endpoint, parsed.body, directives, state.policies[endpoint])
    return Prepared(endpoint, raw, parsed.body, directives, decision, parsed)


async def confirmed(request: web.Request, state: GatewayState, prep: Prepared) -> Prepared:
    """A seeded sampled request stays a Lookup only where the upstream promises invariant seeded sampling
    (`policy.confirm_seeded`); the catalog is asked for those requests only."""
    decision = prep.decision
    assert isinstance(decision, Lookup)
    fwd = forward_headers(request.headers, api_key=state.config.upstream.api_key, identity=True)
    promised = await state.catalog.seeded_invariant(prep.body["model"], fwd)
    return replace(prep, decision=confirm_seeded(decision, promised=promised))


async def cache_key(
    request: web.Request, state: GatewayState, prep: Prepared, revision: str
) -> tuple[CacheKey, Level]:
    """The request's key and the level it was built at (the route's level; `auto` resolved per model).

    Repeated bytes find both in the request memo: no canonicalization, no tokenization, no await once the
    model's tokenizer is loaded.
    """
    route = state.config.routes[prep.endpoint]
    scope = key_scope(request, state, prep.endpoint)

    def upstream_headers() -> Any:
        return forward_headers(request.headers, api_key=state.config.upstream.api_key, identity=True)

    tok = NOT_TOKEN_LEVEL
    if route.level in TOKEN_LEVELS:
        tok = await key_tokenizer(state, prep.endpoint, prep.body.get("model"), revision, upstream_headers)
    tokenizer = tok.version
    parsed = prep.parsed
    context = (scope, revision, tokenizer)
    if parsed.key is not None and parsed.key_level is not None and parsed.key_context == context:
        return parsed.key, parsed.key_level
    canonical, level = parsed.canonical, parsed.canonical_level
    if canonical is None or level is None or parsed.canonical_tokenizer != tokenizer:
        try:  # at most one remote tokenization per new body (a remote engine's ids)
            form = await key_form(state, route.level, prep.endpoint, prep.body, tok, upstream_headers)
        except CanonicalizationError as exc:
            raise BadRequest(str(exc)) from None
        level, tokenizer = form.level, form.tokenizer  # "" after a transient failure: asked again next time
        canonical = state.memo.set_canonical(parsed, canonical_json(form.form), level, tokenizer)
    key = derive_key_from_bytes(
        scope=scope, endpoint=prep.endpoint, level=level, model_revision=revision, canonical_bytes=canonical
    )
    state.memo.set_key(
        parsed, key, level, (scope, revision, tokenizer)
    )  # the last (tenant, revision, tokenizer) seen for these bytes
    return key, level


def make_handler(endpoint: str):
    async def handler(request: web.Request) -> web.StreamResponse:
        state = request.app[STATE]
        lane = timer_of(request)  # set when the fast lane tried this request first (gateway.edge.fastlane)
        timer = lane if lane is not None else start_timer(request, endpoint)
        result: str = Result.ERROR
        reason: str = Outcome.FAILED
        try:
            raw = await read_request(request, state)
            prep = prepare(request, state, endpoint, raw)
            if isinstance(prep.decision, Lookup) and prep.decision.seeded:  # on the upstream's promise only
                prep = await confirmed(request, state, prep)
            if (
                state.config.dashboard.show_prompts
            ):  # the operator opted in: the hot-keys table shows the text
                request[PROMPT] = prompt_text(prep.body) or ""
            timer.lap("parse")
            match prep.decision:
                case Bypass(reason=why):
                    result, reason = Result.BYPASS, why
                    if prep.directives.only_if_cached:
                        raise NotCached("only-if-cached: this request is not cacheable")
                    return await bypass(request, state, prep, why)
                case Lookup() as lookup:
                    if prep.body.get("stream") is True and endpoint == "embeddings":
                        result, reason = Result.BYPASS, Outcome.STREAM
                        return await bypass(request, state, prep, Outcome.STREAM)
                    if prep.body.get("stream") is True:
                        response, result, reason = await streamed(request, state, prep, lookup)
                        return response
                    response, result, reason = await lookup_or_fill(request, state, prep, lookup)
                    return response
                case _ as unreachable:
                    assert_never(unreachable)
        except GatewayError:
            result = Result.ERROR
            raise
        except (ConnectionResetError, asyncio.CancelledError):
            result, reason = Result.CLIENT_GONE, Outcome.CLIENT_GONE  # counted, never an error
            raise
        finally:
            handler_done(state, timer, endpoint, result, reason)

    return handler


async def bypass(
    request: web.Request, state: GatewayState, prep: Prepared, reason: str
) -> web.StreamResponse:
    fwd = forward_headers(request.headers, api_key=state.config.upstream.api_key, identity=False)
    await check_bypass(
        state, prep.endpoint, prep.body, scope_of(request, state), fwd
    )  # context length, token budget
    return await relay(
        request,
        state,
        method="POST",
        path_qs=request.path_qs,
        headers=fwd,
        body=prep.raw,
        extra_headers={
            hdr.CACHE_STATUS: hdr.bypass_status(reason),
            "Cache-Control": hdr.BYPASS_CACHE_CONTROL,
        },
    )


@dataclass(frozen=True, slots=True)
class Resolved:
    model: str
    revision: str
    key: CacheKey
    level: Level  # the level the key was built at (Cache-Status detail on misses)
    forward: Any  # the upstream request headers when already built (a catalog refresh needed them), else None


async def resolve_key(request: web.Request, state: GatewayState, prep: Prepared) -> Resolved:
    """The model revision (no await, no header work while the catalog is fresh) and the request's key."""
    model = prep.body["model"]
    revision = state.catalog.fresh_revision(model)
    fwd: Any = None
    if revision is None:
        fwd = forward_headers(request.headers, api_key=state.config.upstream.api_key, identity=True)
        revision = await state.catalog.revision(model, fwd)
    key, level = await cache_key(request, state, prep, revision)
    return Resolved(model, revision, key, level, fwd)


def fill_request(
    request: web.Request, state: GatewayState, prep: Prepared, lookup: Lookup, resolved: Resolved
) -> FillRequest:
    """What a miss sends upstream: the client's own bytes and headers (minus hop-by-hop), for this key."""
    fwd = resolved.forward
    if fwd is None:
        fwd = forward_headers(request.headers, api_key=state.config.upstream.api_key, identity=True)
    return FillRequest(
        prep.endpoint,
        resolved.key,
        resolved.model,
        resolved.revision,
        lookup.ttl_s,
        request.path_qs,
        fwd,
        prep.raw,
        upstream_for(state, prep.endpoint, prep.body, scope_of(request, state)),
        level=resolved.level.value,
    )


async def streamed(request: web.Request, state: GatewayState, prep: Prepared, lookup: Lookup) -> Answered:
    """`stream: true`: a hit replayed as SSE, or a miss teed to the client and recorded (gateway.misses.streaming)."""
    resolved = await resolve_key(request, state, prep)
    fill_req = fill_request(request, state, prep, lookup, resolved)  # the tee forwards it upstream on a miss
    return await serve_stream(
        request, state, fill_req, lookup, prep.directives, include_usage=wants_usage(prep.body)
    )


async def lookup_or_fill(
    request: web.Request, state: GatewayState, prep: Prepared, lookup: Lookup
) -> Answered:
    resolved = await resolve_key(request, state, prep)
    key = resolved.key
    lap(request, "parse", key=key.key)
    read = await read_cache(request, state, key.key, lookup, prep.directives, resolved.revision)
    if read.hit is not None:
        response = json_answer(request, state, read.hit.entry, read.now, read.hit.tier, request.get(PROMPT))
        lap(request, "serialize")
        return Answered(response, Result.HIT, read.hit.tier)
    if lookup.only_if_cached:
        raise NotCached("only-if-cached: no fresh cached answer for this request")
    fill_req = fill_request(request, state, prep, lookup, resolved)
    if read.lacking is not None:  # an entry was there but cannot answer this request: Cache-Status says why
        fill_req = replace(fill_req, lacked=read.lacking.value)
    return await fill_miss(request, state, fill_req, read.stale)


async def fill_miss(
    request: web.Request, state: GatewayState, fill_req: FillRequest, stale: Entry | None
) -> Answered:
    """The single-flight fill, then what `after_upstream` decides about its answer."""
    key = fill_req.key
    public = key.scope == PUBLIC_SCOPE
    try:
        outcome, leader = await state.flights.do(key.key, lambda: leased_fill(state, fill_req))
        lap(request, "upstream")
    except UpstreamError as exc:
        decision = after_upstream(
            None, leader=True, public_scope=public, has_stale=stale is not None, error_code=exc.code or ""
        )
        if stale is None or not isinstance(decision, ServeStale):
            raise
        return serve_stale(state, stale, decision)
    assert isinstance(outcome, FillResult)
    leader = leader and not outcome.collapsed  # another replica's fill (cross-replica lease): coalesced here
    while True:
        decision = after_upstream(
            outcome.response.status, leader=leader, public_scope=public, has_stale=stale is not None
        )
        match decision:
            case AskAgain():
                outcome, leader = await fill(state, fill_req), True
            case ServeStale():
                assert stale is not None
                return serve_stale(state, stale, decision)
            case Serve(result=result):
                response = miss_response(state, outcome, collapsed=not leader, level=fill_req.miss_detail)
                lap(request, "serialize")
                return Answered(response, result, miss_reason(outcome.entry, outcome.refusal))
            case _ as unreachable:
                assert_never(unreachable)


def serve_stale(state: GatewayState, entry: Entry, decision: ServeStale) -> Answered:
    response = web.Response(body=entry.body, headers=stale_headers(state, entry, decision.detail))
    record.served(state, entry)
    return Answered(response, Result.STALE, decision.reason)


def miss_response(state: GatewayState, outcome: FillResult, *, collapsed: bool, level: str) -> web.Response:
    upstream = outcome.response
    if outcome.entry is not None:
        return stored_miss_response(state, outcome.entry, upstream.headers, collapsed=collapsed, level=level)
    return hdr.unstored_response(
        upstream.status,
        upstream.headers,
        upstream.body,
        collapsed=collapsed,
        detail=outcome.refusal.value if outcome.refusal else None,
        level=level,
    )
