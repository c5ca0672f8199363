"""Liveness, readiness, metrics and the other `/v1/*` paths (relayed untouched, never cached)."""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.errors import UpstreamError
from gateway.handlers.relay import relay
from gateway.handlers.tenancy import tenant_credential
from gateway.keys import tenant_scope
from gateway.state import STATE
from gateway.upstream import forward_headers, relay_headers


async def health(_request: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


async def ready(request: web.Request) -> web.Response:
    """200 when the upstream answers; Redis being down degrades (reported) but does not make us unready."""
    state = request.app[STATE]
    upstream_ok = True
    try:
        resp = await state.upstream.request("GET", "/v1/models", forward_headers(
            request.headers, api_key=state.config.upstream.api_key, identity=True))
        upstream_ok = resp.status < 500
    except UpstreamError:
        upstream_ok = False
    state.metrics.upstream_up.set(1 if upstream_ok else 0)
    redis: str = "disabled"
    if state.cache.l2 is not None:
        redis = "up" if await state.cache.l2.ping() else "down"
    body = {"status": "ready" if upstream_ok else "unready", "upstream": "up" if upstream_ok else "down",
            "redis": redis}
    return web.Response(status=200 if upstream_ok else 503, body=orjson.dumps(body),
                        content_type="application/json")


async def update_gauges(request: web.Request) -> None:
    state = request.app[STATE]
    l1 = state.cache.l1
    m = state.metrics
    m.cache_entries.labels("l1").set(l1.entries())
    m.cache_bytes.labels("l1").set(l1.bytes_used())
    m.cache_evictions.labels("l1").set(l1.evictions)


async def metrics(request: web.Request) -> web.Response:
    await update_gauges(request)
    state = request.app[STATE]
    return web.Response(body=state.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"})


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    fwd = forward_headers(request.headers, api_key=state.config.upstream.api_key, identity=True)
    scope = tenant_scope(tenant_credential(request.headers, state.config.server.tenant_header))
    resp = await state.catalog.models_response(scope, fwd)
    headers = relay_headers(resp.headers)
    headers["Content-Type"] = resp.headers.get("Content-Type", "application/json")
    headers["Cache-Control"] = "private, max-age=0"
    return web.Response(status=resp.status, body=resp.body, headers=headers)


async def passthrough(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body = await request.read() if request.can_read_body else None
    fwd = forward_headers(request.headers, api_key=state.config.upstream.api_key, identity=False)
    return await relay(request, state, method=request.method, path_qs=request.path_qs, headers=fwd, body=body,
                       extra_headers={"Cache-Control": "no-store"})
