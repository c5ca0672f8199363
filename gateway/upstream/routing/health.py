"""Active health checks: every `health_interval_s`, GET `health_path` on each backend not in its ejection backoff,
each backend on its own task and each check bounded by `health_timeout_s`.

A hung engine (SIGSTOPped, wedged) still completes TCP handshakes, so only a check's own short timeout finds it;
and since every backend has its own loop, one hung check never delays another backend's. A 2xx-4xx answer closes
a half-open circuit (the probe that lets an ejected backend back in) and, for `/v1/models`, reports the backend's
models and revisions to the book. A connect failure, timeout or 5xx counts towards ejection like a failed request.
With `engine_state`, a passing check also reads llama-server's `/slots` (busy slots, slot count): the busy slots
beyond this process's own outstanding requests are other replicas' or direct clients' load, which the cost policy
adds. A backend without `/slots` (404, not a list) is not asked again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import orjson

from gateway.upstream.routing.backend import Backend
from gateway.upstream.routing.book import served_models
from gateway.upstream.routing.breaker import BreakerState
from gateway.upstream.routing.pool import MODELS_PATH, UpstreamPool
from gateway.web.errors import UpstreamError

log = logging.getLogger("tokenedge.routing")
SLOTS_PATH = "/slots"


async def check(pool: UpstreamPool, backend: Backend, path: str, headers: Mapping[str, str]) -> bool:
    """One probe; True when the backend answered below 500 within `health_timeout_s`."""
    if backend.breaker.state is BreakerState.OPEN:
        return False  # still in its backoff: probed once the backoff is over
    failures = pool.metrics.health_failures
    try:
        resp = await asyncio.wait_for(
            backend.upstream.request("GET", path, headers), pool.config.health_timeout_s
        )
    except TimeoutError:
        failures.labels(backend.url, "timeout").inc()
        backend.fault(f"health check: no answer in {pool.config.health_timeout_s:g} s")
        return False
    except UpstreamError as exc:
        failures.labels(backend.url, "error").inc()
        backend.failed(f"health check: {exc.message}", retried=False)
        return False
    if resp.status >= 500:
        failures.labels(backend.url, "status").inc()
        backend.failed(f"health check: HTTP {resp.status}", retried=False)
        return False
    backend.probe_ok()
    if path == MODELS_PATH and resp.status == 200:
        pool.book.report(backend.index, served_models(resp.body))
    return True


def slots_report(body: bytes) -> tuple[int, int] | None:
    """(busy slots, slots) from llama-server's `/slots` answer; None when it is not one."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, list) or not all(isinstance(s, dict) for s in doc):
        return None
    return sum(1 for s in doc if s.get("is_processing") is True), len(doc)


async def read_state(pool: UpstreamPool, backend: Backend, headers: Mapping[str, str]) -> None:
    """What the engine says of its own slots, bounded like a check; a failure here is not a health failure."""
    try:
        resp = await asyncio.wait_for(
            backend.upstream.request("GET", SLOTS_PATH, headers), pool.config.health_timeout_s
        )
    except (TimeoutError, UpstreamError):
        return
    report = slots_report(resp.body) if resp.status == 200 else None
    if report is None:
        backend.has_slots = False
        return
    busy, slots = report
    backend.reported_slots = slots
    backend.foreign_busy = max(0, busy - backend.outstanding)


async def watch(pool: UpstreamPool, backend: Backend, headers: Mapping[str, str]) -> None:
    """One backend's check loop, paced by the interval from each check's start, not by its answer."""
    loop = asyncio.get_running_loop()
    path, interval_s = pool.config.health_path, pool.config.health_interval_s
    while True:
        started = loop.time()
        if await check(pool, backend, path, headers) and pool.config.engine_state and backend.has_slots:
            await read_state(pool, backend, headers)
        await asyncio.sleep(max(0.0, interval_s - (loop.time() - started)))


async def run(pool: UpstreamPool, headers: Mapping[str, str]) -> None:
    """Every backend's loop (a task for the app's lifetime)."""
    await asyncio.gather(*(watch(pool, b, headers) for b in pool.backends))
