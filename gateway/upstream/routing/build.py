"""Building the upstream: one URL -> the plain `Upstream` (today's path, no router cost); several -> a pool.

`routing_ctx` (an app cleanup context, after the cache context) connects a pool to the catalog (revision changes
the book decides go into keys; the book is the catalog's arbiter, so an old revision never comes back) and runs
the health checks for the app's lifetime. It does nothing for a single URL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import aiohttp

from gateway.config.upstream import UpstreamConfig
from gateway.ops.routing_metrics import RoutingMetrics
from gateway.upstream.catalog import ModelCatalog
from gateway.upstream.http import Upstream
from gateway.upstream.routing import health
from gateway.upstream.routing.backend import Backend
from gateway.upstream.routing.pool import UpstreamPool
from gateway.upstream.routing.share import PlacementStore, SharedPlacement
from gateway.upstream.transport import UpstreamTransport


def is_pool(config: UpstreamConfig) -> bool:
    return len(config.targets) > 1


def build_upstream(
    config: UpstreamConfig,
    session: aiohttp.ClientSession,
    metrics: RoutingMetrics,
    clock: Callable[[], float] = time.monotonic,
) -> UpstreamTransport:
    """`clock` times the breakers' backoffs (monotonic: a wall-clock step must not eject or readmit)."""
    if not is_pool(config):
        return Upstream(config, session)
    backends = [
        Backend(i, target, Upstream(config, session, target.url), config, metrics, clock)
        for i, target in enumerate(config.targets)
    ]
    return UpstreamPool(config, backends, metrics)


def connect(pool: UpstreamPool, catalog: ModelCatalog) -> None:
    """The book's current revisions go into the catalog (and so into keys); the catalog asks the book before it
    takes a revision from an answer, so an answer from a backend still at an old revision never moves keys back."""

    def changed(model: str, revision: str) -> None:
        catalog.learn(model, revision)

    pool.book.on_change = changed
    catalog.arbiter = pool.book.arbitrate


def share(pool: UpstreamPool, store: PlacementStore, retry_after_s: float) -> SharedPlacement:
    """Placements shared through `store` (gateway/upstream/routing/share.py): published on every choice, read
    before one, and distrusted for an engine from its ejection on."""
    c = pool.config
    shared = SharedPlacement(
        store,
        [b.name for b in pool.backends],
        ttl_s=c.placement_ttl_s,
        wait_s=c.placement_wait_s,
        retry_after_s=retry_after_s,
        outcomes=pool.metrics.placement,
    )
    pool.share = shared
    return shared


async def routing_ctx(
    pool: UpstreamTransport,
    catalog: ModelCatalog,
    store: PlacementStore | None = None,
    retry_after_s: float = 1.0,
) -> AsyncIterator[None]:
    """For a pool: the catalog connection, the health checks and, with `store`, shared placement."""
    if not isinstance(pool, UpstreamPool):
        if store is not None:
            await store.close()
        yield
        return
    connect(pool, catalog)
    shared = share(pool, store, retry_after_s) if store is not None else None
    headers = {"Authorization": f"Bearer {pool.config.api_key}"} if pool.config.api_key else {}
    task = asyncio.ensure_future(health.run(pool, headers)) if pool.config.health_path else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if shared is not None:
            pool.share = None
            await shared.close()
