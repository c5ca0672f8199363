"""The tee: drive one upstream stream into a flight and a recorder, and store the entry on a clean end only.

The stream it opens asks for usage whatever the client asked (`gateway.misses.streaming.usage`), so the entry is whole;
the usage chunk is published as a usage-only frame, which `pipe` gives only to the clients that asked for it.

Each upstream event is published to the flight as soon as it is parsed (no buffering beyond one SSE event) and fed
to the recorder. design §4: the entry is written only after `[DONE]`, with no error event, every choice finished
(not by the content filter) and under `cache.max_entry_bytes`; it is written *before* the `[DONE]` frame is
published, so a client that saw the end and asks again gets a hit. The recorder's partial data is dropped in
`finally`, whatever happened: an upstream error, a cancelled (abandoned) stream, or a refusal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

import aiohttp
import orjson

from gateway.keys.entry import Entry
from gateway.keys.policy import RESPONSES, Outcome, Reason, store_refusal
from gateway.misses.answer import FillRequest, make_entry, revision_moved
from gateway.misses.fill import store_ticket
from gateway.misses.needs import MissState
from gateway.misses.streaming.broadcast import Frame, Head, StreamFlight
from gateway.misses.streaming.recorder import Kind, Recorder, StreamRecorder
from gateway.misses.streaming.responses import ResponsesRecorder
from gateway.misses.streaming.sse import DONE, DONE_FRAME, Event, SSEParser, data_frame, error_frame
from gateway.misses.streaming.usage import asking_usage
from gateway.ops import tracing
from gateway.tokens.path import TokenUpstream
from gateway.upstream.http import finish_body, translate
from gateway.upstream.transport import OpenResponse
from gateway.web.errors import UpstreamError

log = logging.getLogger("tokenedge.stream")


async def tee(state: MissState, flight: StreamFlight, req: FillRequest) -> None:
    req = usage_asked(req)
    cap = state.config.cache.max_entry_bytes
    recorder: StreamRecorder = (
        ResponsesRecorder(cap) if req.endpoint == RESPONSES else Recorder(req.endpoint, cap)
    )
    started = time.perf_counter()
    last: bytes | None = error_frame(
        "the upstream stream was interrupted", type_="upstream_error", code="bad_gateway"
    )
    outcome: Reason | Outcome = Reason.INCOMPLETE
    try:
        ticket = await store_ticket(state, req)  # P2: before the upstream call (docs/coherence.md)
        async with (req.via or state.upstream).open_stream(
            "POST", req.path_qs, req.headers, req.body
        ) as resp:
            event_stream = resp.headers.get("Content-Type", "").startswith("text/event-stream")
            if resp.status != 200 or not event_stream:
                body = await resp.read()
                flight.set_head(Head(resp.status, resp.headers, body))
                last, outcome = None, (Reason.STATUS if resp.status != 200 else Reason.INCOMPLETE)
                return
            flight.set_head(Head(resp.status, resp.headers))
            moved = revision_moved(state, req, resp.headers)
            closing = await _pump(resp, flight, recorder, cap)
            if closing is not None:
                await finish_body(resp)  # its connection goes back to the pool (gateway.upstream.http)
        if flight.cancelled:  # abandoned while the last events were being read: store nothing
            last, outcome = None, Outcome.ABANDONED
            return
        state.metrics.upstream_duration.labels(req.endpoint).observe(time.perf_counter() - started)
        if not recorder.done or closing is None:
            end = "its terminal response event" if req.endpoint == RESPONSES else "[DONE]"
            last = error_frame(
                f"the upstream closed the stream without {end}", type_="upstream_error", code="bad_gateway"
            )
            return
        entry, refusal = (None, Reason.REVISION) if moved else _stored_entry(state, req, recorder)
        if entry is not None:
            tracing.answered(entry.usage, entry.body, {})
            with tracing.span("tokenedge.cache.store"):
                await state.cache.put(entry, ticket)
        last, outcome = closing, (refusal or Outcome.STORED)
    except (TimeoutError, aiohttp.ClientError, UpstreamError) as exc:
        error = exc if isinstance(exc, UpstreamError) else translate(exc)
        if not flight.head.done():
            flight.set_head(error)  # before the first byte: the JSON path's error (or stale)
            last = None
        else:
            log.warning("upstream stream failed on %s: %s", req.path_qs, error.message)
            last = error_frame(error.message, type_=error.type, code=error.code)
    except asyncio.CancelledError:
        last, outcome = None, Outcome.ABANDONED
        raise
    finally:
        recorder.discard()
        if not flight.head.done():
            flight.set_head(UpstreamError("the upstream stream ended before its headers"))
        flight.finish(last, outcome)


async def _pump(resp: OpenResponse, flight: StreamFlight, recorder: StreamRecorder, cap: int) -> bytes | None:
    """Publish the events up to the stream's end; its closing frame (`[DONE]`, or the terminal Responses event,
    which carries the whole response) is returned for `tee` to publish after the store. None: no end was seen."""
    parser = SSEParser()
    first = True
    async for data in resp.content.iter_any():  # each read is bounded by sock_read, never a total timeout
        for event in parser.feed(data):
            kind = recorder.feed(event.data)
            if kind is Kind.DONE:
                return _closing(event)
            if first:
                first = False
                tracing.event("first_token")  # the time to first token, as the gateway sees it
            flight.publish(
                Frame(data_frame(event.data, event.name), usage_only=kind is Kind.USAGE), cap_bytes=cap
            )
            if flight.cancelled:
                return None
    for event in parser.close():
        if recorder.feed(event.data) is Kind.DONE:
            return _closing(event)
        flight.publish(Frame(data_frame(event.data, event.name)), cap_bytes=cap)
    return None


def _closing(event: Event) -> bytes:
    """The stream's last frame: `[DONE]` as every client reads it, or the terminal Responses event as sent."""
    return DONE_FRAME if event.data.strip() == DONE else data_frame(event.data, event.name)


def usage_asked(req: FillRequest) -> FillRequest:
    """The fill request with the usage ask (`gateway.misses.streaming.usage`), through the token seam as well; a Responses
    stream needs none (its terminal event carries the usage) and has no `stream_options` to ask with."""
    if req.endpoint == RESPONSES:
        return req
    # The token seam holds the intake's parsed body: asking with it keeps its `messages` the same object, so the
    # plan's ids come from the encoder's identity memo instead of a second template render (and no second parse).
    body = req.via.body if isinstance(req.via, TokenUpstream) else orjson.loads(req.body)
    raw, asked = asking_usage(req.body, body)
    if raw is req.body:
        return req
    via = req.via.with_body(asked) if isinstance(req.via, TokenUpstream) else req.via
    return replace(req, body=raw, via=via)


def _stored_entry(
    state: MissState, req: FillRequest, recorder: StreamRecorder
) -> tuple[Entry | None, Reason | None]:
    """The entry to store after [DONE], or why there is none (design §4)."""
    if recorder.too_large:
        return None, Reason.TOO_LARGE
    if recorder.error:
        return None, Reason.ERROR
    stream_only = not recorder.convertible  # no exact JSON form: the entry answers streams only
    body = recorder.body() if recorder.complete and not stream_only else b""
    refusal = store_refusal(
        status=200,
        body_bytes=len(body) + recorder.recorded_bytes,
        max_entry_bytes=state.config.cache.max_entry_bytes,
        complete=recorder.complete,
        finish_reasons=recorder.finish_reasons,
        has_usage=recorder.usage is not None,
        streamed=True,  # stored without usage too: it answers every plain stream (`policy.lacks`)
    )
    if refusal is not None:
        return None, refusal
    chunks = tuple(recorder.chunks)
    return make_entry(state, req, body, recorder.usage, chunks, stream_only=stream_only), None
