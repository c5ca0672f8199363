"""The streamed-request driver: a fresh entry is replayed as SSE, a miss joins or starts a coalesced stream.

Called by the completions route for a cacheable (`Lookup`) request with `stream: true`; it returns the response and
the metric labels (result, reason), like the JSON path. Errors before the first byte behave like the JSON path:
an upstream failure raises (the middleware renders JSON) or serves a stale entry inside stale-if-error, and a
non-200 upstream answer passes through with its body, unstored. After the first byte the status is sent: a failure
becomes an error event followed by a clean end (see `gateway.streaming.tee`).

A `stream: false` request never joins a stream in flight: it takes the JSON path (its own single-flight call),
which stores the same key; both answers are complete, so whichever is stored last wins, as for two JSON fills.

Headers (DESIGN §5): a streamed hit carries the entry's headers (Cache-Status, Age, ETag, Cache-Control,
CDN-Cache-Control, Surrogate-Key, X-Cache-Key, ...); §5's `private` / `public, max-age=0, s-maxage` already keeps
browsers from reusing it. A streamed miss cannot know before its first byte whether it will be stored or how its
body will hash, so it sends what is known (Cache-Status `fwd=miss`, X-Cache-Key, Age 0) with `Cache-Control:
no-cache` for browsers and `CDN-Cache-Control: no-store` so no edge keeps a stream that may yet be cut. Every SSE
response adds `X-Accel-Buffering: no` and is never compressed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from gateway import headers as hdr
from gateway.cache_control import RequestDirectives
from gateway.entry import Entry
from gateway.errors import NotCached, UpstreamError
from gateway.fill import FillRequest
from gateway.keys import PUBLIC_SCOPE
from gateway.lease_fill import leased_tee
from gateway.lookup import read_cache
from gateway.policy import CREDENTIAL_REFUSALS, Lookup
from gateway.state import GatewayState
from gateway.streaming.broadcast import Head, StreamFlight
from gateway.streaming.replay import replay_frames
from gateway.streaming.sse import HEARTBEAT_FRAME
from gateway.timing import lap, timer_of
from gateway.upstream import relay_headers

SSE_HEADERS = {"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}
Outcome = tuple[web.StreamResponse, str, str]


async def serve_stream(
    request: web.Request,
    state: GatewayState,
    req: FillRequest,
    lookup: Lookup,
    directives: RequestDirectives,
    *,
    include_usage: bool,
) -> Outcome:
    lap(request, "parse", key=req.key.key)  # the key is known: the access log carries it, as on the JSON path
    read = await read_cache(request, state, req.key.key, lookup, directives)
    if read.hit is not None:
        status, age_h = hdr.hit_status(read.hit.entry, read.now, tier=read.hit.tier)
        response = await replay(request, state, read.hit.entry, status, age_h, include_usage=include_usage)
        return response, "hit", read.hit.tier
    if lookup.only_if_cached:
        raise NotCached("only-if-cached: no fresh cached answer for this request")
    return await stream_miss(request, state, req, read.stale, include_usage=include_usage)


async def stream_miss(
    request: web.Request,
    state: GatewayState,
    req: FillRequest,
    stale: Entry | None,
    *,
    include_usage: bool,
    lead: bool = False,
) -> Outcome:
    """Join the key's stream in flight, or start one (always, with `lead`), and pipe it to the client."""
    flights = state.stream_flights
    flight = None if lead else flights.join(req.key.key, include_usage=include_usage)
    leader = flight is None
    if flight is None:
        config = state.config.stream
        flight = flights.start(
            req.key.key,
            include_usage=include_usage,
            complete_abandoned=config.complete_abandoned_streams,
            abandoned_max_s=config.abandoned_stream_max_s,
            producer=lambda f: leased_tee(state, f, req),
        )
    result = "miss" if leader else "coalesced"
    sub = flight.subscribe(lambda: request.transport is not None and not request.transport.is_closing())
    try:
        try:
            head = await asyncio.shield(flight.head)
            lap(request, "upstream")  # time to the upstream's response head
        except UpstreamError as exc:
            if stale is None:
                raise
            return await serve_stale(request, state, stale, exc.code or "error", include_usage)
        if head.body is not None:
            if not leader and req.key.scope == PUBLIC_SCOPE and head.status in CREDENTIAL_REFUSALS:
                # On a public route a follower may be another tenant: the leader's credential was refused, not this one.
                return await stream_miss(request, state, req, stale, include_usage=include_usage, lead=True)
            if head.status >= 500 and stale is not None:
                return await serve_stale(request, state, stale, f"status-{head.status}", include_usage)
            return (
                passthrough(head, req, collapsed=not leader),
                result,
                "status" if head.status != 200 else ("incomplete"),
            )
        response = web.StreamResponse(headers=miss_headers(head, req, collapsed=not leader))
        await response.prepare(request)
        try:
            await pipe(state, flight, response, include_usage=include_usage, on_first=_first_token(request))
            await response.write_eof()
        except ConnectionResetError:
            return response, "client_gone", result  # the flight goes on for the others (or is abandoned)
        return response, result, flight.outcome
    finally:
        flight.unsubscribe(sub)


async def pipe(
    state: GatewayState,
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
        for frame in flight.frames[pos:end]:
            if frame.usage_only and not include_usage:
                continue
            await response.write(frame.data)
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
    state: GatewayState,
    entry: Entry,
    cache_status: str,
    age: str,
    *,
    include_usage: bool,
    no_store: bool = False,
) -> web.StreamResponse:
    """A hit (or a stale answer) as SSE, synthesized from the entry; paced when `stream.replay_delay_s` is set.

    Its time to first token is the first frame's write, recorded on the request's timer (`gateway.timing`).
    """
    headers, truncated = hdr.entry_headers(entry, tag_targets=state.config.cache.cdn_tag_headers)
    if truncated:
        state.metrics.tag_truncations.inc(truncated)
    headers.update(SSE_HEADERS)
    headers[hdr.CACHE_STATUS] = cache_status
    headers["Age"] = age
    if no_store:
        headers["Cache-Control"] = "no-store"  # a stale answer must not be cached further downstream
    config = state.config.stream
    frames = replay_frames(entry, include_usage=include_usage, chunk_chars=config.replay_chunk_chars)
    state.metrics.served_from_cache(entry.usage, len(entry.body), entry.model)
    response = web.StreamResponse(headers=headers)
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
    request: web.Request, state: GatewayState, entry: Entry, why: str, include_usage: bool
) -> Outcome:
    status, age = hdr.stale_status(entry, state.clock(), why)
    response = await replay(request, state, entry, status, age, include_usage=include_usage, no_store=True)
    return response, "stale", why


def miss_headers(head: Head, req: FillRequest, *, collapsed: bool) -> dict[str, str]:
    headers = dict(relay_headers(head.headers))
    headers.update(SSE_HEADERS)
    headers.update(
        {
            hdr.CACHE_STATUS: hdr.miss_status(stored=False, collapsed=collapsed, level=req.level),
            "Cache-Control": "no-cache",
            "CDN-Cache-Control": "no-store",  # a stream may still be cut: no edge keeps it (RFC 9213)
            "Surrogate-Control": "no-store",
            "X-Cache-Key": req.key.key,
            "Age": "0",
        }
    )
    return headers


def passthrough(head: Head, req: FillRequest, *, collapsed: bool) -> web.Response:
    """A non-200 (or non-SSE) upstream answer, relayed with its status and body and never stored."""
    detail = "status" if head.status != 200 else "incomplete"
    return hdr.unstored_response(
        head.status, head.headers, head.body or b"", collapsed=collapsed, detail=detail, level=req.level
    )


def _first_token(request: web.Request) -> Callable[[], None] | None:
    """The timer's first-token mark: `gateway.handlers.ops.finish_request` observes the TTFT histogram from it."""
    timer = timer_of(request)
    return timer.first_token if timer is not None else None
