"""The streamed-request driver: a fresh entry is replayed as SSE, a miss joins or starts a coalesced stream.

Called by the completions route for a cacheable (`Lookup`) request with `stream: true`; it returns the response and
the metric labels (result, reason), like the JSON path. Errors before the first byte behave like the JSON path:
an upstream failure raises (the middleware renders JSON) or serves a stale entry inside stale-if-error, and a
non-200 upstream answer passes through with its body, unstored. After the first byte the status is sent: a failure
becomes an error event followed by a clean end (see `gateway.misses.tee`).

A `stream: false` request never joins a stream in flight: it takes the JSON path (its own single-flight call),
which stores the same key; both answers are complete, so whichever is stored last wins, as for two JSON fills.

Headers (design §5): a streamed hit carries the entry's headers (Cache-Status, Age, ETag, Cache-Control,
CDN-Cache-Control, Surrogate-Key, X-Cache-Key, ...); §5's `private` / `public, max-age=0, s-maxage` already keeps
browsers from reusing it. A streamed miss cannot know before its first byte whether it will be stored or how its
body will hash, so it sends what is known (Cache-Status `fwd=miss`, X-Cache-Key, Age 0) with `Cache-Control:
no-cache` for browsers and `CDN-Cache-Control: no-store` so no edge keeps a stream that may yet be cut. Every SSE
response adds `X-Accel-Buffering: no` and is never compressed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import assert_never

from aiohttp import web

from gateway.hits import headers as hdr
from gateway.hits import record, render, respond
from gateway.hits.lookup import read_cache
from gateway.keys.cache_control import RequestDirectives
from gateway.keys.derive import PUBLIC_SCOPE
from gateway.keys.entry import Entry
from gateway.keys.policy import Lookup, Reason, Result
from gateway.misses import answer
from gateway.misses.answer import Answered, FillRequest
from gateway.misses.lease_fill import leased_tee
from gateway.misses.needs import MissState
from gateway.misses.streaming.broadcast import Head, StreamFlight
from gateway.misses.streaming.recorder import json_object
from gateway.misses.streaming.replay import replay_frames
from gateway.misses.streaming.sse import HEARTBEAT_FRAME
from gateway.ops import tracing
from gateway.ops.dashboard.hotkeys import PROMPT
from gateway.ops.timing import lap, timer_of
from gateway.web.errors import NotCached, UpstreamError
from tokenedge_wire.held_head import HeldHeadResponse

SSE_HEADERS = {"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}


async def serve_stream(
    request: web.Request,
    state: MissState,
    req: FillRequest,
    lookup: Lookup,
    directives: RequestDirectives,
    *,
    include_usage: bool,
) -> Answered:
    lap(request, "parse", key=req.key.key)  # the key is known: the access log carries it, as on the JSON path
    read = await read_cache(request, state, req.key.key, lookup, directives, req.revision, stream=True)
    if read.hit is not None:
        entry, tier = read.hit.entry, read.hit.tier
        tracing.answered(entry.usage, entry.body, {"tokenedge.cache.tier": tier})
        record.hit(state, entry, read.now, request.get(PROMPT))
        conditional = respond.conditional(request, state, entry, read.now, tier)
        if conditional is not None:
            return Answered(conditional, Result.HIT, tier)
        headers = render.hit_headers(state, entry, read.now, tier)
        response = await replay(request, state, entry, headers, include_usage=include_usage)
        return Answered(response, Result.HIT, tier)
    if lookup.only_if_cached:
        raise NotCached("only-if-cached: no fresh cached answer for this request")
    if read.lacking is not None:  # an entry was there but cannot answer this stream: say why (Cache-Status)
        req = replace(req, lacked=read.lacking.value)
    return await stream_miss(request, state, req, read.stale, include_usage=include_usage)


async def stream_miss(
    request: web.Request,
    state: MissState,
    req: FillRequest,
    stale: Entry | None,
    *,
    include_usage: bool,
    lead: bool = False,
) -> Answered:
    """Join the key's stream in flight, or start one (always, with `lead`), and pipe it to the client."""
    flights = state.stream_flights
    flight = None if lead else flights.join(req.key.key)
    leader = flight is None
    tracing.annotate({"tokenedge.coalesced": not leader})
    if flight is None:
        config = state.config.stream
        flight = flights.start(
            req.key.key,
            complete_abandoned=config.complete_abandoned_streams,
            abandoned_max_s=config.abandoned_stream_max_s,
            producer=lambda f: leased_tee(state, f, req),
        )
    sub = flight.subscribe(lambda: request.transport is not None and not request.transport.is_closing())
    try:
        return await answer_flight(request, state, flight, req, stale, leader, include_usage=include_usage)
    finally:
        flight.unsubscribe(sub)


async def answer_flight(
    request: web.Request,
    state: MissState,
    flight: StreamFlight,
    req: FillRequest,
    stale: Entry | None,
    leader: bool,
    *,
    include_usage: bool,
) -> Answered:
    """Wait for the flight's head, then do what `after_upstream` decides about it."""
    public = req.key.scope == PUBLIC_SCOPE
    try:
        head = await flight.wait_head()
        lap(request, "upstream")  # time to the upstream's response head
    except UpstreamError as exc:
        failed = answer.after_upstream(
            None, leader=leader, public_scope=public, has_stale=stale is not None, error_code=exc.code or ""
        )
        if stale is None or not isinstance(failed, answer.ServeStale):
            raise
        return await serve_stale(request, state, stale, failed, include_usage)
    decision = answer.after_upstream(
        head.status, leader=leader, public_scope=public, has_stale=stale is not None
    )
    match decision:
        case answer.AskAgain():
            return await stream_miss(request, state, req, stale, include_usage=include_usage, lead=True)
        case answer.ServeStale():
            assert stale is not None
            return await serve_stale(request, state, stale, decision, include_usage)
        # a whole answer (non-200, non-SSE): relayed, never stored
        case answer.Serve(result=result) if head.body is not None:
            return Answered(passthrough(head, req, collapsed=not leader), result, passthrough_reason(head))
        case answer.Serve(result=result):
            return await relay_flight(request, state, flight, head, req, result, include_usage=include_usage)
        case _ as unreachable:
            assert_never(unreachable)


async def relay_flight(
    request: web.Request,
    state: MissState,
    flight: StreamFlight,
    head: Head,
    req: FillRequest,
    result: Result,
    *,
    include_usage: bool,
) -> Answered:
    """The flight's event stream, piped to this client from its first frame."""
    collapsed = result is Result.COALESCED
    vary = "Accept-Encoding" if req.key.scope == PUBLIC_SCOPE else render.credential_vary(state)
    headers = miss_headers(head, req, collapsed=collapsed, vary=vary)
    first = flight.frames[0] if flight.frames else None
    ready = first is not None and (include_usage or not first.usage_only)  # pipe writes it at once
    response = HeldHeadResponse(headers=headers) if ready else web.StreamResponse(headers=headers)
    await response.prepare(request)
    try:
        await pipe(state, flight, response, include_usage=include_usage, on_first=_first_token(request))
        await response.write_eof()
    except ConnectionResetError:  # the flight goes on for the others (or is abandoned)
        return Answered(response, Result.CLIENT_GONE, result)
    return Answered(response, result, flight.outcome)


async def pipe(
    state: MissState,
    flight: StreamFlight,
    response: web.StreamResponse,
    *,
    include_usage: bool,
    on_first: Callable[[], None] | None = None,
) -> None:
    """Write the flight's frames from the first, then the live tail; a heartbeat comment covers each silence."""
    pos, first = 0, True
    heartbeat_s = state.config.stream.heartbeat_s
    while True:
        end = len(flight.frames)
        # The frames published since the last write go out in one write (one send, not one per frame).
        ready = [f.data for f in flight.frames[pos:end] if include_usage or not f.usage_only]
        if ready:
            await response.write(ready[0] if len(ready) == 1 else b"".join(ready))
            if first:
                first = False
                if on_first is not None:
                    on_first()
        pos = end
        if flight.done and pos == len(flight.frames):
            return
        if not await flight.wait(pos, heartbeat_s):
            await response.write(HEARTBEAT_FRAME)


async def replay(
    request: web.Request,
    state: MissState,
    entry: Entry,
    headers: dict[str, str],
    *,
    include_usage: bool,
) -> web.StreamResponse:
    """A hit (or a stale answer) as SSE with the entry's `headers`, synthesized from the entry; paced when
    `stream.replay_delay_s` is set.

    Its time to first token is the first frame's write, recorded on the request's timer (`gateway.ops.timing`).
    """
    headers.update(SSE_HEADERS)
    config = state.config.stream
    frames = replay_frames(entry, include_usage=include_usage, chunk_chars=config.replay_chunk_chars)
    response = HeldHeadResponse(headers=headers)  # the first frame is written at once: the head goes with it
    await response.prepare(request)
    on_first = _first_token(request)
    try:
        if config.replay_delay_s <= 0:
            await response.write(b"".join(frames))
            if on_first is not None:
                on_first()
        else:
            for n, frame in enumerate(frames):
                if n:
                    await asyncio.sleep(config.replay_delay_s)  # optional pacing, by configuration
                await response.write(frame)
                if n == 0 and on_first is not None:
                    on_first()
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client left during the replay: nothing to clean up
    return response


async def serve_stale(
    request: web.Request, state: MissState, entry: Entry, decision: answer.ServeStale, include_usage: bool
) -> Answered:
    headers = answer.stale_headers(state, entry, decision.detail)
    record.served(state, entry)
    response = await replay(request, state, entry, headers, include_usage=include_usage)
    return Answered(
        response, Result.STALE, decision.reason
    )  # the JSON path's label (`status`, not `status-502`)


def miss_headers(head: Head, req: FillRequest, *, collapsed: bool, vary: str) -> dict[str, str]:
    """A streamed miss's headers: the leader's upstream fields (a follower gets only `hdr.FOLLOWER_RELAYED`), then
    ours; `vary` names the credential headers on a tenant route (`render.credential_vary`)."""
    headers = dict(hdr.relayed(head.headers, collapsed=collapsed))
    headers.update(SSE_HEADERS)
    headers.update(
        {
            hdr.CACHE_STATUS: hdr.miss_status(stored=False, collapsed=collapsed, level=req.miss_detail),
            "Cache-Control": "no-cache",
            "CDN-Cache-Control": "no-store",  # a stream may still be cut: no edge keeps it (RFC 9213)
            "Surrogate-Control": "no-store",
            "X-Cache-Key": req.key.key,
            "Vary": vary,
            "Age": "0",
        }
    )
    return headers


def passthrough_reason(head: Head) -> Reason:
    """Why a whole (non-SSE) upstream answer to a streamed request was not stored: its status, an error body
    (`policy.error_body`'s `error` member), or no stream at all."""
    if head.status != 200:
        return Reason.STATUS
    doc = json_object(head.body or b"")
    return Reason.ERROR if doc is not None and doc.get("error") is not None else Reason.INCOMPLETE


def passthrough(head: Head, req: FillRequest, *, collapsed: bool) -> web.Response:
    """A non-200 (or non-SSE) upstream answer, relayed with its status and body and never stored."""
    return hdr.unstored_response(
        head.status,
        head.headers,
        head.body or b"",
        collapsed=collapsed,
        detail=passthrough_reason(head),
        level=req.miss_detail,
    )


def _first_token(request: web.Request) -> Callable[[], None] | None:
    """The timer's first-token mark: `gateway.handlers.ops.finish_request` observes the TTFT histogram from it."""
    timer = timer_of(request)
    return timer.first_token if timer is not None else None
