"""The cacheable routes (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`).

intake (gateway.intake.pipeline: parse, decide, scope, key) -> Bypass: relay | Lookup: L1 -> L2 -> single-flight ->
upstream. The upstream always receives the client's own bytes; only the key is built from the canonical form.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, assert_never

from aiohttp import web

from gateway.handlers.relay import relay
from gateway.hits import headers as hdr
from gateway.hits import record
from gateway.hits.lookup import read_cache
from gateway.hits.respond import json_answer
from gateway.hits.scope import key_scope, scope_of, tenancy_of
from gateway.intake.pipeline import Prepared, Resolved, admit, parsed_of, resolve_key
from gateway.keys.derive import PUBLIC_SCOPE
from gateway.keys.entry import Entry
from gateway.keys.policy import Bypass, Lookup, Outcome, Result, wants_usage
from gateway.keys.validate import check_content_type, read_body
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
from gateway.ops import tracing
from gateway.ops.dashboard.hotkeys import PROMPT, prompt_text
from gateway.ops.reqrecord import handler_done
from gateway.ops.timing import lap, start_timer, timer_of
from gateway.state import STATE, GatewayState
from gateway.tokens.path import check_bypass, upstream_for
from gateway.upstream.http import forward_headers
from gateway.upstream.routing.salt import for_scope, salted
from gateway.web.errors import GatewayError, NotCached, UpstreamError


async def read_request(request: web.Request, state: GatewayState) -> bytes:
    check_content_type(request)
    return await read_body(request, state.config.server.max_body_bytes)


def make_handler(endpoint: str):
    async def handler(request: web.Request) -> web.StreamResponse:
        state = request.app[STATE]
        lane = timer_of(request)  # set when the fast lane tried this request first (gateway.edge.fastlane)
        timer = lane if lane is not None else start_timer(request, endpoint)
        tracer = state.tracing  # off: this check is all tracing costs a request
        trace = None if tracer is None else tracer.begin(request.headers, endpoint)
        result: str = Result.ERROR
        reason: str = Outcome.FAILED
        try:
            raw = await read_request(request, state)
            prep = await admit(request, state, endpoint, parsed_of(state, endpoint, raw), raw)
            if trace is not None:
                trace.model(prep.body.get("model"))
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
            if trace is not None:
                trace.finish(result, reason)

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
        body=engine_request(state, key_scope(request, state, prep.endpoint), prep)[0],
        extra_headers={
            hdr.CACHE_STATUS: hdr.bypass_status(reason),
            "Cache-Control": hdr.BYPASS_CACHE_CONTROL,
        },
    )


def upstream_target(request: web.Request, endpoint: str) -> str:
    """The target a miss asks the upstream: the route's own path (the key names the endpoint, so every spelling the
    router takes for it, `%63ompletions` or an absolute-form target, is sent one way), then the raw query string as
    the client sent it (key or scope material, gateway.keys.parts)."""
    query = request.rel_url.raw_query_string
    return f"/v1/{endpoint}?{query}" if query else f"/v1/{endpoint}"


def fill_request(
    request: web.Request, state: GatewayState, prep: Prepared, lookup: Lookup, resolved: Resolved
) -> FillRequest:
    """What a miss sends upstream: the client's own bytes and headers (minus hop-by-hop), for this key."""
    fwd = resolved.forward
    if fwd is None:
        fwd = forward_headers(request.headers, api_key=state.config.upstream.api_key, identity=True)
    raw, body = engine_request(state, resolved.key.scope, prep)
    return FillRequest(
        prep.endpoint,
        resolved.key,
        resolved.model,
        resolved.revision,
        lookup.ttl_s,
        upstream_target(request, prep.endpoint),
        fwd,
        raw,
        upstream_for(state, prep.endpoint, body, scope_of(request, state)),
        level=resolved.level.value,
    )


def engine_request(state: GatewayState, scope: str, prep: Prepared) -> tuple[bytes, Mapping[str, Any]]:
    """The body sent upstream: with the tenant's engine salt, when on (gateway.upstream.routing.salt)."""
    if not state.config.upstream.engine_salt:
        return prep.raw, prep.body
    salt = for_scope(tenancy_of(state).secret, scope, public=scope == PUBLIC_SCOPE)
    return salted(prep.raw, prep.body, salt)


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
        entry = read.hit.entry
        tracing.answered(entry.usage, entry.body, {"tokenedge.cache.tier": read.hit.tier})
        response = json_answer(request, state, entry, read.now, read.hit.tier, request.get(PROMPT))
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
    tracing.annotate({"tokenedge.coalesced": not leader})
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
                stored = outcome.entry
                tracing.answered(stored.usage if stored else None, outcome.response.body, {})
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
