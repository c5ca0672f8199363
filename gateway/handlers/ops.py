"""Liveness, readiness, metrics and `/v1/models`.

Also the two observability hooks the app installs: the per-worker gauge refresher (so L1 gauges stay current in
every worker, not only the one scraped) and the response-prepare signal that sends `Server-Timing` to admin
debug requests and finishes each cacheable request's timing record.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from time import perf_counter

import orjson
from aiohttp import web

from gateway.edge.drain import DRAIN
from gateway.handlers.relay import upstream_target
from gateway.handlers.tenancy import is_admin, require_operator
from gateway.hits.scope import scope_of
from gateway.misses.needs import MissState
from gateway.misses.warm import warming
from gateway.ops.reqrecord import DEBUG_HEADER, finish_request
from gateway.ops.timing import timer_of
from gateway.state import STATE
from gateway.upstream.http import forward_headers, relay_headers
from gateway.web.errors import UpstreamError

GAUGE_REFRESH_S = 1.0


async def health(_request: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


async def probe(state: MissState, headers: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """(upstream answers, Redis state); also sets the `upstream_up` gauge."""
    upstream_ok = True
    try:
        resp = await state.upstream.request(
            "GET",
            "/v1/models",
            forward_headers(headers or {}, api_key=state.config.upstream.api_key, identity=True),
        )
        upstream_ok = resp.status < 500
    except UpstreamError:
        upstream_ok = False
    state.metrics.upstream_up.set(1 if upstream_ok else 0)
    redis: str = "disabled"
    if state.cache.l2 is not None:
        redis = "up" if await state.cache.l2.ping() else "down"
    return upstream_ok, redis


async def ready(request: web.Request) -> web.Response:
    """200 when the upstream answers and the start-up L1 fill is over; Redis down degrades, reported, still ready.
    503 at once, asking nothing, from a SIGTERM on (`gateway.edge.drain`): the balancer stops sending here."""
    drain = request.app.get(DRAIN)
    if drain is not None and drain.draining:
        return web.Response(status=503, body=b'{"status":"draining"}', content_type="application/json")
    state = request.app[STATE]
    upstream_ok, redis = await probe(state, request.headers)
    filling = await warming(state)  # a new replica first fills L1 with L2's hot entries (bounded)
    body = {
        "status": "warming" if upstream_ok and filling else "ready" if upstream_ok else "unready",
        "upstream": "up" if upstream_ok else "down",
        "redis": redis,
    }
    return web.Response(
        status=200 if upstream_ok and not filling else 503,
        body=orjson.dumps(body),
        content_type="application/json",
    )


def update_gauges(state: MissState) -> None:
    """This worker's L1 gauges (livesum over workers in multiprocess mode)."""
    l1 = state.cache.l1
    m = state.metrics
    m.cache_entries.labels("l1").set(l1.entries())
    m.cache_bytes.labels("l1").set(l1.bytes_used())
    m.cache_evictions.labels("l1").set(l1.evictions)


async def gauge_refresher(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: refresh this worker's gauges every second; a scrape reaches one worker, not all."""
    state = app[STATE]

    async def loop() -> None:
        while True:
            update_gauges(state)
            state.metrics.tally.flush()  # other workers' scrapes read the shared files: keep them current
            await asyncio.sleep(GAUGE_REFRESH_S)

    task = asyncio.create_task(loop(), name="tokenedge-gauges")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        state.metrics.tally.flush()


async def shared_tier_sizes(state: MissState) -> dict[str, tuple[int, int]]:
    """L2's (keys, Redis used_memory) read once per scrape; empty when L2 is off, unreachable or breaker-open."""
    if state.cache.l2 is None or not state.cache.l2.available:
        return {}
    stats = await state.cache.l2.stats()
    return {"l2": stats} if stats is not None else {}


async def render_metrics(state: MissState) -> bytes:
    update_gauges(state)
    return state.metrics.render(await shared_tier_sizes(state))


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.config.server.metrics_require_token:
        require_operator(request, state.config.server, "/metrics")
    body = await render_metrics(state)
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def on_response_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """Signal: headers are about to go out. Adds Server-Timing for admin debug requests, never for others."""
    timer = timer_of(request)
    if timer is None:
        return
    state = request.app[STATE]
    timer.status = response.status
    timer.prepared_at = perf_counter()
    if request.headers.get(DEBUG_HEADER) == "1" and is_admin(
        request.headers, state.config.server.admin_token
    ):
        response.headers["Server-Timing"] = timer.server_timing()
    if timer.done:
        finish_request(state, timer)


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    fwd = forward_headers(request.headers, api_key=state.config.upstream.api_key, identity=True)
    scope = scope_of(request, state)
    resp = await state.catalog.models_response(scope, fwd)
    return _answer(resp.status, resp.body, resp.headers)


async def model(request: web.Request) -> web.Response:
    """`GET /v1/models/{id}`: the upstream's own answer. Where the upstream lists models but has no retrieve route
    (llama.cpp's llama-server answers 404 to every `/v1/models/{id}`), the object its `/v1/models` list holds for
    that id (the same per-scope list `models` serves), so `models.retrieve(id)` works wherever `models.list()` lists
    the id; an id the list lacks keeps the upstream's 404."""
    state = request.app[STATE]
    target = upstream_target(request, state)  # the path rules of every relayed route (gateway/web/paths.py)
    fwd = forward_headers(request.headers, api_key=state.config.upstream.api_key, identity=True)
    resp = await state.upstream.request("GET", target, fwd)
    if resp.status == 404:
        listed = await state.catalog.models_response(scope_of(request, state), fwd)
        found = _listed(listed.body, request.match_info["model"]) if listed.status == 200 else None
        if found is not None:
            return _answer(200, orjson.dumps(found), listed.headers)
    return _answer(resp.status, resp.body, resp.headers)


def _listed(body: bytes, model_id: str) -> dict[str, object] | None:
    """The model object a `/v1/models` body lists under `model_id` (None: not listed, or not a list)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    items = data if isinstance(data, list) else []
    return next((m for m in items if isinstance(m, dict) and m.get("id") == model_id), None)


def _answer(status: int, body: bytes, upstream_headers: Mapping[str, str]) -> web.Response:
    headers = relay_headers(upstream_headers)
    headers["Content-Type"] = upstream_headers.get("Content-Type", "application/json")
    headers["Cache-Control"] = "private, max-age=0"
    return web.Response(status=status, body=body, headers=headers)
