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

import os
import time
from importlib import resources

import orjson
from aiohttp import web

from gateway.handlers import ops
from gateway.handlers.tenancy import require_operator
from gateway.misses.needs import MissState
from gateway.ops.dashboard.history import WINDOWS, snapshot
from gateway.ops.dashboard.hotkeys import merged, other_workers
from gateway.ops.dashboard.summary import summarize
from gateway.web.errors import BadRequest

DEFAULT_WINDOW = "5m"
PROBE_EVERY_S = 5.0  # upstream health is probed at most this often per worker, however many pages are open
_PAGE_HEADERS = {
    "Content-Type": "text/html; charset=utf-8",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    # Everything is inline: nothing may load from anywhere, the gateway included, but the data endpoint.
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'",
}


def check_access(request: web.Request, state: MissState) -> None:
    require_operator(request, state.config.server, "the dashboard")


async def page(request: web.Request, state: MissState) -> web.Response:
    check_access(request, state)
    html = resources.files("gateway.handlers").joinpath("dashboard.html").read_bytes()
    return web.Response(body=html, headers=_PAGE_HEADERS)


async def _upstream_health(state: MissState) -> dict[str, object]:
    cached = state.dashboard.probe
    now = time.monotonic()
    if cached is not None and now - cached[0] < PROBE_EVERY_S:
        return cached[1]
    upstream_ok, redis = await ops.probe(state)
    health: dict[str, object] = {"up": upstream_ok, "url": state.config.upstream.url, "redis": redis}
    state.dashboard.probe = (now, health)
    return health


async def data(request: web.Request, state: MissState) -> web.Response:
    """Since-start numbers, the chosen window's series and totals (`?window=5m|1h|24h`), hot keys."""
    check_access(request, state)
    name = request.query.get("window", DEFAULT_WINDOW)
    if name not in WINDOWS:
        raise BadRequest(f"window must be one of {', '.join(WINDOWS)}, got {name!r}", param="window")
    upstream = await _upstream_health(state)
    ops.update_gauges(state)
    parsed = state.metrics.samples(await ops.shared_tier_sizes(state))  # what /metrics would render now
    now = state.clock()
    current = snapshot(parsed)
    state.dashboard.history.record(now, current)  # when a step is due: the series never lag the counters
    body = summarize(parsed, now=now, upstream=upstream)
    body["window"] = state.dashboard.history.window(name, now, current)
    body["windows"] = list(WINDOWS)
    body["priced"] = bool(state.config.dashboard.prices)
    body["top_keys"] = top_keys(state, now)
    return web.Response(
        body=orjson.dumps(body), content_type="application/json", headers={"Cache-Control": "no-store"}
    )


def top_keys(state: MissState, now: float) -> list[dict[str, object]]:
    config = state.config.dashboard
    tables = [state.dashboard.hot_keys.rows()]
    shared_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if shared_dir:
        tables += other_workers(shared_dir)
    return merged(tables, now=now, top=config.top_keys, show_prompts=config.show_prompts)
