"""`GET /dashboard` and `GET /dashboard/data`: read-only, and guarded the same way.

Access (`gateway.handlers.tenancy.require_operator`): open to loopback clients when
`server.dashboard_public_on_loopback` (the default), but only to direct ones: a request that carries any forwarding
header (`Forwarded`, `X-Forwarded-*`, `Via`, `X-Real-IP`, `True-Client-IP`, `CF-Connecting-IP`, `Fastly-Client-IP`,
`X-Client-IP`) came through a proxy or CDN, which may make every client look local, so it needs the token too.
Otherwise the admin token, as a bearer header or as `?token=` (the page moves it into a header and strips it from
the address bar). With no admin token configured, the dashboard is loopback-only and answers 404 elsewhere, like
the admin endpoints.
"""

from __future__ import annotations

import time
from importlib import resources

import orjson
from aiohttp import web

from gateway.dashboard.summary import summarize
from gateway.handlers import ops
from gateway.handlers.tenancy import require_operator
from gateway.state import STATE, GatewayState

PROBE_EVERY_S = 5.0  # upstream health is probed at most this often per worker, however many pages are open
_PROBE = "dashboard_probe"
_PAGE_HEADERS = {
    "Content-Type": "text/html; charset=utf-8",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    # Everything is inline: nothing may load from anywhere, the gateway included, but the data endpoint.
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'",
}


def check_access(request: web.Request) -> None:
    require_operator(request, "the dashboard")


async def page(request: web.Request) -> web.Response:
    check_access(request)
    html = resources.files("gateway.dashboard").joinpath("page.html").read_bytes()
    return web.Response(body=html, headers=_PAGE_HEADERS)


async def _upstream_health(state: GatewayState) -> dict[str, object]:
    cached = state.extensions.get(_PROBE)
    now = time.monotonic()
    if isinstance(cached, tuple) and now - cached[0] < PROBE_EVERY_S:
        return cached[1]
    upstream_ok, redis = await ops.probe(state)
    health: dict[str, object] = {"up": upstream_ok, "url": state.config.upstream.url, "redis": redis}
    state.extensions[_PROBE] = (now, health)
    return health


async def data(request: web.Request) -> web.Response:
    check_access(request)
    state = request.app[STATE]
    upstream = await _upstream_health(state)
    text = (await ops.render_metrics(state)).decode()
    body = summarize(text, now=time.time(), upstream=upstream)
    return web.Response(body=orjson.dumps(body), content_type="application/json",
                        headers={"Cache-Control": "no-store"})
