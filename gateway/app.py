"""The aiohttp application: routes, the error middleware, and one cleanup_ctx per resource.

`create_app(config)` is all a test, a worker or an embedding program needs; nothing is built at import time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import aiohttp
from aiohttp import web

from cdn.purge import CdnConfig, build_purge_clients, fan_out
from gateway.config.cost import parse_prices
from gateway.config.settings import GatewayConfig
from gateway.edge.bodies import edge_middleware
from gateway.edge.needs import EDGE_STATE
from gateway.handlers import admin, alias, completions, dashboard, ops, relay, tenancy
from gateway.keys.policy import CACHEABLE_ENDPOINTS
from gateway.misses.lease_fill import lease_ctx
from gateway.misses.warm import warm_ctx
from gateway.ops.dashboard.sampler import sampler as dashboard_sampler
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.tracing import tracing_ctx
from gateway.state import STATE, GatewayState
from gateway.tiers.coherence.bus import Bus
from gateway.tiers.coherence.coherence import Coherence
from gateway.tiers.coherence.local_bus import LocalBus, LocalBusEnd
from gateway.tiers.coherence.redis_bus import RedisBus
from gateway.tiers.coherence.revisions import RevisionWatcher
from gateway.tiers.factory import build_l1, build_l2
from gateway.tiers.placement import placement_store
from gateway.tiers.redis_cluster import is_cluster_url, node_urls
from gateway.tiers.tiered import TieredCache
from gateway.tokens.path import tokens_ctx
from gateway.upstream.catalog import ModelCatalog
from gateway.upstream.http import Upstream
from gateway.upstream.routing.build import build_upstream, is_pool, routing_ctx
from gateway.web.errors import GatewayError, error_response

log = logging.getLogger("tokenedge.gateway")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_HTTP_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as OpenAI-style JSON; an unexpected exception is a logged 500 JSON, never a bare page."""
    try:
        response = await handler(request)
    except GatewayError as exc:
        return exc.to_response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_error(exc)
    except (ConnectionResetError, asyncio.CancelledError) as exc:  # the client left: not a gateway error
        log.debug("client went away during %s %s", request.method, request.path)
        if isinstance(exc, asyncio.CancelledError):
            raise
        gone = web.Response(status=499)
        gone.force_close()
        return gone  # never written: aiohttp notes the reset at debug level
    except Exception:  # the one place a gateway bug is caught: logged in full, rendered as JSON
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(
            500,
            "internal gateway error; the request was not cached",
            type_="internal_error",
            code="internal_error",
        )
    if isinstance(response, web.HTTPException) and response.status >= 400:
        return _http_error(response)  # aiohttp's router returns (not raises) some of its own errors
    return response


def _http_error(exc: web.HTTPException) -> web.Response:
    response = error_response(
        exc.status,
        exc.reason,
        type_=_HTTP_ERROR_TYPES.get(exc.status, "invalid_request_error"),
        code=exc.reason.lower().replace(" ", "_"),
    )
    if "Allow" in exc.headers:
        response.headers["Allow"] = exc.headers["Allow"]
    return response


def _cdn_ctx(cdn: CdnConfig):
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        session = aiohttp.ClientSession()
        clients = build_purge_clients(cdn, session)

        async def purge_cdns(keys: Sequence[str], tags: Sequence[str]) -> dict[str, object]:
            results = await fan_out(clients, keys, tags)
            return {name: dataclasses.asdict(result) for name, result in results.items()}

        app[STATE].cdn_purge = purge_cdns
        try:
            yield
        finally:
            await session.close()

    return ctx


def _bus(config: GatewayConfig, local_bus: LocalBusEnd | None) -> Bus | None:
    """Redis pub/sub when there is a Redis (every worker and replica); else the parent's relay under --workers N."""
    if config.cache.redis_url:
        # Redis Cluster broadcasts PUBLISH to every node: the bus talks to the first listed node. While that node
        # is down, the subscription is lost and L1 stays off (never stale), until it is back.
        url = (
            node_urls(config.cache.redis_url)[0]
            if is_cluster_url(config.cache.redis_url)
            else config.cache.redis_url
        )
        return RedisBus(
            url, timeout_s=config.cache.redis_timeout_s, ping_interval_s=config.cache.bus_ping_interval_s
        )
    if local_bus is not None:
        return LocalBus(local_bus.sock, local_bus.peers)
    return None


def _revision_watcher(
    config: GatewayConfig, session: aiohttp.ClientSession, catalog: ModelCatalog
) -> asyncio.Task[None] | None:
    if not config.upstream.revision_push or is_pool(config.upstream):
        return None  # many backends: revisions come from their health checks and answers (gateway.upstream.routing)
    headers = {"Authorization": f"Bearer {config.upstream.api_key}"} if config.upstream.api_key else {}
    return asyncio.ensure_future(
        RevisionWatcher(config.upstream.primary_url, session, catalog, headers).run()
    )


def _cache_ctx(
    metrics: GatewayMetrics, clock: Callable[[], float], config: GatewayConfig, local_bus: LocalBusEnd | None
):
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        session = Upstream.make_session(config.upstream)
        upstream = build_upstream(config.upstream, session, metrics.routing)  # one URL: a plain Upstream
        l2 = build_l2(config.cache, metrics, clock)  # Redis, Memcached or none (cache.l2)
        cache = TieredCache(build_l1(config.cache, clock), l2, metrics)
        catalog = ModelCatalog(
            upstream,
            ttl_s=config.upstream.models_ttl_s,
            fallback_revision=config.upstream.model_revision,
            clock=clock,
        )
        coherence = Coherence(cache.l1, catalog, _bus(config, local_bus), clock)
        await coherence.start()
        watcher = _revision_watcher(config, session, catalog)
        app[STATE] = state = GatewayState(
            config=config,
            metrics=metrics,
            clock=clock,
            cache=cache,
            upstream=upstream,
            catalog=catalog,
            coherence=coherence,
        )
        app[EDGE_STATE] = state  # the edge finds its part of the state here (gateway.edge.needs)
        metrics.prices = parse_prices(config.dashboard.prices)
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
            await coherence.close()
            await session.close()
            if l2 is not None:
                await l2.close()

    return ctx


def _on_state(
    ctx: Callable[[GatewayState], AsyncIterator[None]],
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A layer's cleanup_ctx takes the part of the state it uses, never the app: run it on this app's state (which
    the cache ctx, first in the list, has built by then)."""

    def ctx_on(app: web.Application) -> AsyncIterator[None]:
        return ctx(app[STATE])

    return ctx_on


def _with_state(
    handler: Callable[[web.Request, GatewayState], Awaitable[web.StreamResponse]],
) -> Handler:
    """A route whose handler takes the part of the state it uses next to the request, not the app's key."""

    async def handle(request: web.Request) -> web.StreamResponse:
        return await handler(request, request.app[STATE])

    return handle


def create_app(
    config: GatewayConfig,
    *,
    clock: Callable[[], float] = time.time,
    metrics: GatewayMetrics | None = None,
    cdn: CdnConfig | None = None,
    local_bus: LocalBusEnd | None = None,
) -> web.Application:
    """The gateway app; `cdn` lists the CDNs that `/admin/purge` fans out to (none by default); `local_bus` is
    this worker's end of the parent's invalidation relay (`--workers N` without Redis)."""
    app = web.Application(
        middlewares=[error_middleware, relay.path_guard, edge_middleware],
        client_max_size=config.server.max_body_bytes,
    )
    app.cleanup_ctx.append(_cache_ctx(metrics or GatewayMetrics(), clock, config, local_bus))
    app.cleanup_ctx.append(
        _on_state(
            lambda s: routing_ctx(
                s.upstream,
                s.catalog,
                placement_store(config.cache, config.upstream),
                config.cache.redis_retry_after_s,
            )
        )
    )  # many backends: health checks, revisions into the catalog, placement shared through a Redis L2
    app.cleanup_ctx.append(_on_state(lease_ctx))  # cross-replica leases on L2 misses (Redis L2 only)
    app.cleanup_ctx.append(
        _on_state(tenancy.tenancy_ctx)
    )  # the scope secret (config, Redis or the state file)
    app.cleanup_ctx.append(_on_state(tokens_ctx))  # the token path: counts, budgets, the binary transport
    app.cleanup_ctx.append(_on_state(warm_ctx))  # the hot-key record and the start-up L1 fill (Redis L2 only)
    app.cleanup_ctx.append(_on_state(tracing_ctx))  # OpenTelemetry spans, when `[tracing]` or OTEL_* ask
    if cdn is not None and cdn.enabled:
        app.cleanup_ctx.append(_cdn_ctx(cdn))
    for endpoint in CACHEABLE_ENDPOINTS:  # responses: cached only when stateless (policy)
        app.router.add_post(f"/v1/{endpoint}", completions.make_handler(endpoint))
    app.router.add_get("/v1/models", ops.models)
    app.router.add_get(
        "/v1/models/{model:.+}", ops.model
    )  # the upstream's, else its list's object (llama-server)
    app.router.add_post("/v1/cache/explain", alias.explain)
    app.router.add_get("/v1/cache/{key}", alias.get_alias)
    app.router.add_post("/admin/purge", admin.purge)
    app.router.add_get("/health", ops.health)
    app.router.add_get("/ready", ops.ready)
    app.router.add_get("/metrics", ops.metrics)
    app.router.add_get("/dashboard", _with_state(dashboard.page))
    app.router.add_get("/dashboard/data", _with_state(dashboard.data))
    app.cleanup_ctx.append(ops.gauge_refresher)  # after the cache ctx: it reads the state
    app.cleanup_ctx.append(
        _on_state(dashboard_sampler)
    )  # the dashboard's history: a baseline now, then every step
    app.on_response_prepare.append(ops.on_response_prepare)  # Server-Timing and the per-request record
    app.router.add_route("*", "/v1/{tail:.*}", _with_state(relay.passthrough))  # known or listed routes only
    return app
