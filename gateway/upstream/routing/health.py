"""Active health checks: every `health_interval_s`, GET `health_path` on each backend not in its ejection backoff.

A 2xx-4xx answer closes a half-open circuit (the probe that lets an ejected backend back in) and, for
`/v1/models`, reports the backend's models and revisions to the book, so routing by model and revision stays
current without waiting for a miss. A connect failure, timeout or 5xx counts towards ejection like a failed request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from gateway.upstream.routing.backend import Backend
from gateway.upstream.routing.book import served_models
from gateway.upstream.routing.breaker import BreakerState
from gateway.upstream.routing.pool import MODELS_PATH, UpstreamPool
from gateway.web.errors import UpstreamError

log = logging.getLogger("tokenedge.routing")


async def check(pool: UpstreamPool, backend: Backend, path: str, headers: Mapping[str, str]) -> bool:
    """One probe; True when the backend answered below 500."""
    if backend.breaker.state is BreakerState.OPEN:
        return False  # still in its backoff: probed once the backoff is over
    try:
        resp = await backend.upstream.request("GET", path, headers)
    except UpstreamError as exc:
        backend.failed(f"health check: {exc.message}", retried=False)
        return False
    if resp.status >= 500:
        backend.failed(f"health check: HTTP {resp.status}", retried=False)
        return False
    backend.probe_ok()
    if path == MODELS_PATH and resp.status == 200:
        pool.book.report(backend.index, served_models(resp.body))
    return True


async def run(pool: UpstreamPool, headers: Mapping[str, str]) -> None:
    """The check loop (a task for the app's lifetime); paced by the interval, not by the answers."""
    path, interval_s = pool.config.health_path, pool.config.health_interval_s
    while True:
        await asyncio.gather(*(check(pool, b, path, headers) for b in pool.backends))
        await asyncio.sleep(interval_s)
