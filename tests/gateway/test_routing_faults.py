"""The pool's faults and state over real loopback HTTP servers: a hung backend (it accepts, then says nothing) is
found by its own bounded health checks without stalling the others' and its in-flight work moves elsewhere; a
stream's first-byte deadline; admission (a bounded wait, then 503 with Retry-After, counted); the route headers;
and placement moving back to a recovered backend. Hangs are gates (asyncio.Event), never sleeps."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from gateway.config.upstream import BackendConfig, UpstreamConfig
from gateway.ops.routing_metrics import RoutingMetrics
from gateway.upstream.routing import health
from gateway.upstream.routing.attempt import BACKEND_HEADER, ROUTE_HEADER
from gateway.upstream.routing.breaker import BreakerState
from gateway.upstream.routing.build import build_upstream
from gateway.upstream.routing.pool import Saturated, UpstreamPool

PATH = "/v1/chat/completions"


@dataclass
class Engine:
    name: str
    hung: asyncio.Event = field(default_factory=asyncio.Event)  # set: it answers; clear: it hangs
    calls: Counter[str] = field(default_factory=Counter)
    url: str = ""

    def __post_init__(self) -> None:
        self.hung.set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post(PATH, self.chat)
        return app

    async def models(self, request: web.Request) -> web.Response:
        self.calls["models"] += 1
        await self.hung.wait()
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.calls["chat"] += 1
        if not body.get("stream"):
            await self.hung.wait()
            return web.json_response(
                {"choices": [{"message": {"content": self.name}, "finish_reason": "stop"}]}
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)  # the head at once, as llama-server sends it; the first token later
        await self.hung.wait()
        await resp.write(b'data: {"choices":[{"delta":{"content":"' + self.name.encode() + b'"}}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture
async def engines() -> AsyncIterator[list[Engine]]:
    started, made = [], [Engine("a"), Engine("b")]
    for e in made:
        server = TestServer(e.app(), host="127.0.0.1")
        await server.start_server()
        e.url = str(server.make_url("")).rstrip("/")
        started.append(server)
    yield made
    for e in made:
        e.hung.set()
    for server in started:
        await server.close()


def make_pool(
    session: aiohttp.ClientSession, engines: list[Engine], **extra: Any
) -> tuple[UpstreamPool, CollectorRegistry]:
    registry = CollectorRegistry()
    backends = extra.pop("backends", tuple(BackendConfig(e.url, name=e.name) for e in engines))
    config = UpstreamConfig(
        url=tuple(e.url for e in engines), backends=backends, connect_timeout_s=0.5, **extra
    )
    pool = build_upstream(config, session, RoutingMetrics(registry))
    assert isinstance(pool, UpstreamPool)
    return pool, registry


def chat(content: str, *, stream: bool = False) -> bytes:
    return orjson.dumps({"model": "m", "stream": stream, "messages": [{"role": "user", "content": content}]})


async def until(condition: Any, *, limit_s: float = 10.0) -> None:
    """Poll `condition` (bounded): for state another task changes."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while not condition():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_a_hung_backend_is_ejected_by_its_own_checks_and_its_waiting_request_moves(
    session: aiohttp.ClientSession, engines: list[Engine]
) -> None:
    a, b = engines
    pool, registry = make_pool(
        session,
        engines,
        health_interval_s=0.05,
        health_timeout_s=0.2,
        eject_after_failures=2,
        routing_policy="round_robin",
    )
    a.hung.clear()
    checks = asyncio.ensure_future(health.run(pool, {}))
    try:
        waiting = asyncio.ensure_future(pool.request("POST", PATH, {}, chat("q0")))  # round-robin: engine a
        await until(lambda: a.calls["chat"] == 1)
        before = b.calls["models"]
        await until(lambda: pool.backends[0].breaker.state is not BreakerState.CLOSED, limit_s=5.0)
        assert b.calls["models"] > before + 2  # b's checks kept running while a's hung
        resp = await asyncio.wait_for(waiting, 5.0)  # moved to b at the ejection: not failed, not 120 s
        assert resp.status == 200 and resp.headers[BACKEND_HEADER] == "b"
    finally:
        checks.cancel()
        await asyncio.gather(checks, return_exceptions=True)
    timeouts = registry.get_sample_value(
        "tokenedge_backend_health_failures_total", {"backend": a.url, "kind": "timeout"}
    )
    assert timeouts is not None and timeouts >= 2
    assert (
        registry.get_sample_value(
            "tokenedge_backend_health_failures_total", {"backend": b.url, "kind": "timeout"}
        )
        is None
    )


async def test_a_stream_without_a_first_byte_by_its_deadline_is_retried_elsewhere(
    session: aiohttp.ClientSession, engines: list[Engine]
) -> None:
    a, _ = engines
    pool, registry = make_pool(session, engines, first_byte_timeout_s=0.3, routing_policy="round_robin")
    a.hung.clear()
    async with pool.open_stream("POST", PATH, {}, chat("q", stream=True)) as resp:
        body = await resp.read()
    assert b'"b"' in body and a.calls["chat"] == 1 and resp.headers[BACKEND_HEADER] == "b"
    assert registry.get_sample_value("tokenedge_backend_first_byte_timeouts_total", {"backend": a.url}) == 1
    # a non-streamed answer is not held to it (the head of a whole answer comes after the whole generation)
    pool2, _ = make_pool(session, engines, first_byte_timeout_s=0.05, routing_policy="round_robin")
    pending = asyncio.ensure_future(pool2.request("POST", PATH, {}, chat("long")))
    await until(lambda: a.calls["chat"] == 2)
    a.hung.set()
    assert (await asyncio.wait_for(pending, 5.0)).status == 200


async def test_an_ejection_cuts_a_stream_already_flowing_with_a_clean_error(
    session: aiohttp.ClientSession, engines: list[Engine]
) -> None:
    a, _ = engines
    pool, _ = make_pool(
        session, engines, first_byte_timeout_s=0, routing_policy="round_robin", eject_after_failures=1
    )
    a.hung.clear()
    async with pool.open_stream("POST", PATH, {}, chat("q", stream=True)) as resp:
        reading = asyncio.ensure_future(resp.read())
        await until(lambda: a.calls["chat"] == 1)
        pool.backends[0].fault("test: hung")
        with pytest.raises(aiohttp.ClientError):
            await asyncio.wait_for(reading, 5.0)


async def test_admission_waits_then_answers_503_with_retry_after_and_counts(
    session: aiohttp.ClientSession, engines: list[Engine]
) -> None:
    a, b = engines
    caps = tuple(BackendConfig(e.url, name=e.name, max_outstanding=1) for e in engines)
    pool, registry = make_pool(session, engines, backends=caps, admission_wait_s=0.2)
    a.hung.clear()
    b.hung.clear()
    held = [asyncio.ensure_future(pool.request("POST", PATH, {}, chat(f"h{i}"))) for i in range(2)]
    await until(lambda: a.calls["chat"] + b.calls["chat"] == 2)
    with pytest.raises(Saturated) as refused:
        await pool.request("POST", PATH, {}, chat("third"))
    assert refused.value.status == 503 and refused.value.headers["Retry-After"] == "1"
    assert registry.get_sample_value("tokenedge_routing_rejected_total") == 1
    waiting = asyncio.ensure_future(pool.request("POST", PATH, {}, chat("fourth")))
    await until(lambda: pool.backends[0].outstanding + pool.backends[1].outstanding == 2)
    a.hung.set()  # one frees within the wait: the fourth goes through
    assert (await asyncio.wait_for(waiting, 5.0)).status == 200
    b.hung.set()
    assert [r.status for r in await asyncio.gather(*held)] == [200, 200]


async def test_answers_name_their_engine_and_why(
    session: aiohttp.ClientSession, engines: list[Engine]
) -> None:
    pool, registry = make_pool(session, engines)
    prompt = "s" * 400
    first = await pool.request("POST", PATH, {}, chat(prompt + "one"))
    second = await pool.request("POST", PATH, {}, chat(prompt + "two"))
    assert first.headers[BACKEND_HEADER] in ("a", "b")
    assert "policy=cost; reason=balance; matched_tokens=0" in first.headers[ROUTE_HEADER]
    assert second.headers[BACKEND_HEADER] == first.headers[BACKEND_HEADER]  # both free: the prefix decides
    assert "reason=prefix; matched_tokens=" in second.headers[ROUTE_HEADER]
    assert "matched_tokens=0" not in second.headers[ROUTE_HEADER]
    url = engines[0].url if first.headers[BACKEND_HEADER] == "a" else engines[1].url
    assert (
        registry.get_sample_value(
            "tokenedge_routing_decisions_total", {"backend": url, "policy": "cost", "reason": "prefix"}
        )
        == 1
    )
    quiet, _ = make_pool(session, engines, route_headers=False)
    assert BACKEND_HEADER not in (await quiet.request("POST", PATH, {}, chat("x"))).headers


async def test_after_recovery_new_and_idle_prefixes_move_back(
    session: aiohttp.ClientSession, engines: list[Engine]
) -> None:
    """With the pile-up budget spent (here: none, `queue_beside_idle_share = 0`), an engine is never waited for while
    another is idle. How the budget is spent is tested in test_routing_pace.py."""
    _, b = engines
    pool, _ = make_pool(
        session, engines, eject_base_s=0.05, eject_after_failures=1, queue_beside_idle_share=0.0
    )
    groups = [f"group {g} " * 40 for g in range(4)]
    pool.backends[0].fault("test: down")
    for g in groups:  # the outage: every group placed on b
        assert (await pool.request("POST", PATH, {}, chat(g + "q0"))).headers[BACKEND_HEADER] == "b"
    await until(lambda: pool.backends[0].breaker.available())
    b.hung.clear()  # b busy with one request: the others go back to the recovered, idle a
    busy = asyncio.ensure_future(pool.request("POST", PATH, {}, chat(groups[0] + "q1")))
    await until(lambda: b.calls["chat"] == 5)
    moved = [
        (await pool.request("POST", PATH, {}, chat(g + "q1" + "x" * 64))).headers[BACKEND_HEADER]
        for g in groups[1:]
    ]
    b.hung.set()
    await busy
    assert moved == ["a", "a", "a"]
    # and they stay there: their prefixes are a's now, and both engines are free
    again = [
        (await pool.request("POST", PATH, {}, chat(g + "q1" + "x" * 64 + "more" * 20))).headers[
            BACKEND_HEADER
        ]
        for g in groups[1:]
    ]
    assert again == ["a", "a", "a"]


def test_slots_reports_are_read_and_anything_else_is_not_one() -> None:
    busy_one = b'[{"id":0,"is_processing":true},{"id":1,"is_processing":false}]'
    assert health.slots_report(busy_one) == (1, 2)
    assert health.slots_report(b'{"error":"not found"}') is None and health.slots_report(b"<html>") is None


@pytest.mark.parametrize(
    ("text", "load"),
    [
        ("# HELP x\nllamacpp:requests_processing 1\nllamacpp:requests_deferred 2\n", 3),
        ('vllm:num_requests_running{model_name="m"} 4.0\nvllm:num_requests_waiting{model_name="m"} 1.0\n', 5),
        ("sglang:num_running_reqs 2\nsglang:num_queue_reqs 0\n", 2),
        ("tokenedge_backend_running_requests 1.0\ntokenedge_backend_waiting_requests 3.0\n", 4),
        ("process_cpu_seconds_total 12.5\n", None),
    ],
)
def test_engine_load_is_read_from_each_engines_own_gauges(text: str, load: int | None) -> None:
    assert health.metrics_load(text) == load
