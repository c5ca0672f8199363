"""Active health checks: every `health_interval_s`, GET `health_path` on each backend not in its ejection backoff,
each backend on its own task and each check bounded by `health_timeout_s`.

A hung engine (SIGSTOPped, wedged) still completes TCP handshakes, so only a check's own short timeout finds it;
and since every backend has its own loop, one hung check never delays another backend's. A 2xx-4xx answer closes
a half-open circuit (the probe that lets an ejected backend back in) and, for `/v1/models`, reports the backend's
models and revisions to the book. A connect failure, timeout or 5xx counts towards ejection like a failed request.
With `engine_state`, a passing check also reads what the engine says of itself: llama-server's `/slots` (its slot
count and busy slots), and the Prometheus `/metrics` of llama-server (`--metrics`), vLLM, SGLang and the tokenedge
backend (requests running + waiting, `ENGINE_LOAD`; the tokenedge backend's batch size as its slot count,
`ENGINE_CAPACITY`), and llama-server's prompt tokens and seconds (its prefill rate, `PROMPT_COUNTERS`). The load beyond this process's own outstanding requests is other
workers', replicas' or direct clients', which the cost policy adds. A route that answers with anything else is not
asked again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping

import orjson

from gateway.upstream.routing.backend import Backend
from gateway.upstream.routing.book import served_models
from gateway.upstream.routing.breaker import BreakerState
from gateway.upstream.routing.pool import MODELS_PATH, UpstreamPool
from gateway.web.errors import UpstreamError

log = logging.getLogger("tokenedge.routing")
SLOTS_PATH = "/slots"
METRICS_PATH = "/metrics"
# Each engine's own gauges of requests running and requests waiting (queued, deferred).
ENGINE_LOAD: dict[str, tuple[str, str]] = {
    "llama.cpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    "tokenedge": ("tokenedge_backend_running_requests", "tokenedge_backend_waiting_requests"),
}
_LOAD_NAMES = frozenset(name for pair in ENGINE_LOAD.values() for name in pair)
# How many requests an engine runs at once, where its /metrics says (a batching engine is not one slot: without
# it the cost policy would play a one-slot queue forward and spill away from the engine holding the prefix).
ENGINE_CAPACITY = frozenset({"tokenedge_backend_max_running_requests"})
# Prompt tokens computed (cached ones excluded) and the seconds spent on them, cumulative: the prefill rate.
PROMPT_COUNTERS = ("llamacpp:prompt_tokens_total", "llamacpp:prompt_seconds_total")


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


def _samples(text: str, names: frozenset[str]) -> Iterator[float]:
    """The values of the samples of `names` (any labels) in an engine's Prometheus text; unreadable ones skipped."""
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name.partition("{")[0] in names:
            try:
                yield float(rest.split()[0])
            except (ValueError, IndexError):
                continue


def metrics_load(text: str) -> int | None:
    """Requests running + waiting from an engine's Prometheus text (`ENGINE_LOAD`); None when it names none."""
    values = list(_samples(text, _LOAD_NAMES))
    return round(sum(values)) if values else None


def metrics_capacity(text: str) -> int | None:
    """The requests an engine runs at once from its Prometheus text (`ENGINE_CAPACITY`); None when it names none."""
    return next((round(v) for v in _samples(text, ENGINE_CAPACITY) if round(v) > 0), None)


def prompt_counters(text: str) -> tuple[float, float] | None:
    """(prompt tokens computed, seconds spent computing them) from an engine's Prometheus text; None when it
    reports no such pair (`PROMPT_COUNTERS`)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name in PROMPT_COUNTERS:
            try:
                found[name] = float(rest.split()[0])
            except (ValueError, IndexError):
                return None
    if len(found) != len(PROMPT_COUNTERS):
        return None
    return found[PROMPT_COUNTERS[0]], found[PROMPT_COUNTERS[1]]


async def _get(pool: UpstreamPool, backend: Backend, path: str, headers: Mapping[str, str]) -> bytes | None:
    """A 200 answer's body; b"" when it failed or timed out (ask again next time), None for another status (the
    engine does not serve this route). Bounded like a check; never a health failure."""
    try:
        resp = await asyncio.wait_for(
            backend.upstream.request("GET", path, headers), pool.config.health_timeout_s
        )
    except (TimeoutError, UpstreamError):
        return b""
    return resp.body if resp.status == 200 else None


async def read_state(pool: UpstreamPool, backend: Backend, headers: Mapping[str, str]) -> None:
    """What the engine says of its own slots and load; a route it does not serve is not asked again."""
    load: int | None = None
    if backend.has_slots:
        body = await _get(pool, backend, SLOTS_PATH, headers)
        report = slots_report(body) if body else None
        backend.has_slots = body == b"" or report is not None
        if report is not None:
            load, backend.reported_slots = report
    if backend.has_metrics:
        body = await _get(pool, backend, METRICS_PATH, headers)
        text = body.decode("utf-8", "replace") if body else ""
        counted = metrics_load(text) if text else None
        backend.has_metrics = body == b"" or counted is not None
        load = counted if counted is not None else load
        capacity = metrics_capacity(text) if counted is not None else None
        if capacity is not None:
            backend.reported_slots = capacity
        counters = prompt_counters(text) if counted is not None else None
        if counters is not None:  # the engine's own prefill rate, for the cost policy
            backend.pace.engine_counters(*counters)
    if load is not None:
        backend.foreign_busy = max(0, load - backend.outstanding)


async def watch(pool: UpstreamPool, backend: Backend, headers: Mapping[str, str]) -> None:
    """One backend's check loop, paced by the interval from each check's start, not by its answer."""
    loop = asyncio.get_running_loop()
    path, interval_s = pool.config.health_path, pool.config.health_interval_s
    while True:
        started = loop.time()
        if await check(pool, backend, path, headers) and pool.config.engine_state:
            await read_state(pool, backend, headers)
        await asyncio.sleep(max(0.0, interval_s - (loop.time() - started)))


async def run(pool: UpstreamPool, headers: Mapping[str, str]) -> None:
    """Every backend's loop (a task for the app's lifetime)."""
    await asyncio.gather(*(watch(pool, b, headers) for b in pool.backends))
