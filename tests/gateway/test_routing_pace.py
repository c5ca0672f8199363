"""What the cost policy expects of an engine's time (gateway/upstream/routing/pace.py), and the choices that follow
on real loopback engines whose answers are held by gates (never sleeps): a one-slot engine that holds the prefix and
is busy with a short request is waited for (re-prefilling elsewhere costs more), one busy with a long request is
not, the pile-up budget ends the waiting while another engine sits idle, and so does an engine's share of recent
requests far above its fair share (after an outage). The mutation checks run the same workloads under the old rule
(never wait beside a free slot), which spills the request that should stay, and without the share guard, which
leaves the recovered engine idle."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from backend.engine.outputs import EngineStats
from backend.metrics import BackendMetrics
from gateway.config.upstream import BackendConfig, UpstreamConfig
from gateway.ops.routing_metrics import RoutingMetrics
from gateway.upstream.routing import health, pace
from gateway.upstream.routing.attempt import BACKEND_HEADER, ROUTE_HEADER
from gateway.upstream.routing.build import build_upstream
from gateway.upstream.routing.pace import OVERRUN_SHARE, Pace, PileUp, Recent
from gateway.upstream.routing.pool import UpstreamPool

PATH = "/v1/chat/completions"
PREFIX = "rule " * 800  # 4000 characters: about 1000 tokens, 1 s of prefill at 1000 tokens/s
OTHER = "norm " * 800


def test_the_wait_plays_a_one_slot_queue_forward() -> None:
    p = Pace(s_per_token=0.001, fixed_s=0.1)
    assert p.wait_s(0.0, 1, 0, 1.0) == 0.0  # idle
    short = p.begin(0.0, 0, idle=True)  # 0.1 s expected
    assert p.wait_s(0.05, 1, 0, 1.0) == pytest.approx(0.05)  # the rest of the short one, not a mean
    p.begin(0.01, 900, idle=False)  # 1.0 s expected, queued behind it
    assert p.wait_s(0.05, 1, 0, 1.0) == pytest.approx(1.05)
    assert p.wait_s(0.05, 2, 0, 1.0) == pytest.approx(0.05)  # two slots: the short one's slot frees first
    assert p.wait_s(0.05, 2, 1, 1.0) == pytest.approx(
        0.55
    )  # ... unless another's request (half a mean) takes it next
    p.end(short, 0.5)
    # the long one started at 0.01 and is expected until 1.01; past that it still needs a quarter of its time
    assert p.wait_s(0.5, 1, 0, 1.0) == pytest.approx(0.51)
    assert p.wait_s(2.0, 1, 0, 1.0) == pytest.approx(OVERRUN_SHARE * 1.0)


def test_fixed_time_and_the_prefill_rate_are_learnt_from_requests_sent_idle() -> None:
    p = Pace(s_per_token=0.01)  # configured: 100 tokens/s, ten times too slow
    for i, unmatched in enumerate([0, 500, 100, 800, 50, 300] * 4):
        t0 = float(i)
        ticket = p.begin(t0, unmatched, idle=True)
        ticket.first_byte = t0 + 0.02 + unmatched * 0.001  # really: 20 ms + 1 ms a token
        ticket.ok = True
        p.end(ticket, ticket.first_byte + 0.03)
    assert p.s_per_token == pytest.approx(0.001, rel=0.01)
    assert p.fixed_s == pytest.approx(0.05, rel=0.2)
    busy = p.begin(100.0, 10_000, idle=False)  # not idle: its times say nothing of the engine alone
    busy.ok, busy.first_byte = True, 200.0
    p.end(busy, 300.0)
    assert p.s_per_token == pytest.approx(0.001, rel=0.01) and p.fixed_s < 0.1


@pytest.mark.parametrize("recounted", [True, False], ids=["recounted", "mutation"])
def test_the_fixed_time_is_recounted_at_a_rate_learnt_later(
    monkeypatch: pytest.MonkeyPatch, recounted: bool
) -> None:
    """Two misses sent idle (500 tokens at 10 ms a token and 20 ms more: 5.02 s each) while the rate is still the
    configured 2000 tokens/s, then the engine's counters say 100 tokens/s: the fixed part is what the misses leave
    at that rate, a few tens of ms. The mutation keeps it as learnt at the configured rate (1.75 s: the misses'
    prefill taken as fixed time), so a cached request's expected wait was 3-4x its real one on llama-server."""
    if not recounted:
        real = Pace.engine_counters

        def kept(self: Pace, tokens: float, seconds: float) -> None:
            fixed = self.fixed_s
            real(self, tokens, seconds)
            self.fixed_s = fixed

        monkeypatch.setattr(Pace, "engine_counters", kept)
    p = Pace(s_per_token=1 / 2000)
    for i in range(2):
        miss = p.begin(10.0 * i, 500, idle=True)
        miss.ok = True
        p.end(miss, 10.0 * i + 5.02)
    p.engine_counters(1000.0, 10.0)  # 1000 prompt tokens computed in 10 s
    assert p.s_per_token == pytest.approx(0.01)
    assert (p.fixed_s < 0.1) is recounted


def test_the_engines_own_counters_set_the_rate_and_a_restart_starts_over() -> None:
    p = Pace(s_per_token=0.0005)
    p.engine_counters(10, 1.0)  # too few tokens to say
    assert p.s_per_token == 0.0005 and not p.reported
    p.engine_counters(1000, 2.0)  # 990 more tokens in 1 s
    assert p.s_per_token == pytest.approx(1 / 990) and p.reported
    p.engine_counters(0, 0.0)  # restarted: counters went back
    p.engine_counters(2000, 4.0)
    assert p.s_per_token == pytest.approx(1 / 990 + 0.2 * (0.002 - 1 / 990))
    text = "# TYPE x counter\nllamacpp:prompt_tokens_total 1234\nllamacpp:prompt_seconds_total 2.5\n"
    assert health.prompt_counters(text) == (1234.0, 2.5)
    assert health.prompt_counters("llamacpp:prompt_tokens_total 1\n") is None


def test_pile_up_is_the_decayed_share_of_busy_time_spent_queueing_beside_an_idle_engine() -> None:
    p = PileUp(horizon_s=10.0)
    p.observe(0.0, busy=True, piled=False)
    p.observe(3.0, busy=True, piled=True)
    p.observe(4.0, busy=False, piled=False)
    busy = 10 * (1 - math.exp(-0.4))  # 4 s busy, seen from t = 4
    piled = 10 * (1 - math.exp(-0.1))  # the last 1 s of it piled
    assert p.share(4.0) == pytest.approx(piled / busy)
    assert p.share(100.0) == pytest.approx(piled / busy)  # idle time does not dilute it
    p.observe(100.0, busy=True, piled=False)
    assert p.share(200.0) < 0.01  # a long spell without pile-up: forgotten


@dataclass
class Engine:
    name: str
    gate: asyncio.Event = field(default_factory=asyncio.Event)  # set: it answers; clear: it holds answers
    calls: int = 0
    tokenized: int = 0
    url: str = ""
    metrics: bytes = b""  # its /metrics text (none: 404)

    def __post_init__(self) -> None:
        self.gate.set()

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    async def chat(self, request: web.Request) -> web.Response:
        await request.read()
        self.calls += 1
        await self.gate.wait()
        return web.json_response({"choices": [{"message": {"content": self.name}, "finish_reason": "stop"}]})

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics, status=200 if self.metrics else 404)

    async def tokenize(self, request: web.Request) -> web.Response:
        """Answered at once, busy or not, as engines answer their tokenizer routes (no slot, no model)."""
        await request.read()
        self.tokenized += 1
        return web.json_response({"tokens": [1, 2, 3]})


@asynccontextmanager
async def gated_engines() -> AsyncIterator[list[Engine]]:
    """Engines a and b on loopback ports (also the `engines` of `test_routing_budget`)."""
    made, servers = [Engine("a"), Engine("b")], []
    for e in made:
        app = web.Application()
        app.router.add_get("/v1/models", e.models)
        app.router.add_post(PATH, e.chat)
        app.router.add_get("/metrics", e.prometheus)
        app.router.add_post("/tokenize", e.tokenize)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        e.url = str(server.make_url("")).rstrip("/")
        servers.append(server)
    yield made
    for e in made:
        e.gate.set()
    for server in servers:
        await server.close()


@pytest.fixture
async def engines() -> AsyncIterator[list[Engine]]:
    async with gated_engines() as made:
        yield made


def make_pool(session: aiohttp.ClientSession, engines: list[Engine], **extra: Any) -> UpstreamPool:
    backends = tuple(BackendConfig(e.url, name=e.name, prefill_tokens_per_s=1000.0) for e in engines)
    config = UpstreamConfig(url=tuple(e.url for e in engines), backends=backends, health_path="", **extra)
    pool = build_upstream(config, session, RoutingMetrics(CollectorRegistry()))
    assert isinstance(pool, UpstreamPool)
    return pool


def ask(pool: UpstreamPool, text: str) -> asyncio.Future[Any]:
    body = orjson.dumps({"model": "m", "messages": [{"role": "system", "content": text}]})
    return asyncio.ensure_future(pool.request("POST", PATH, {}, body))


async def until(condition: Any, *, limit_s: float = 10.0) -> None:
    """Poll `condition` (bounded): for state another task changes."""
    end = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.005)


async def _busy_with(pool: UpstreamPool, a: Engine, text: str) -> asyncio.Future[Any]:
    """`a` holds PREFIX (answered once) and b another prefix (answered twice: the two share the recent requests
    evenly), then `a` is held busy answering `text`."""
    assert (await ask(pool, PREFIX + "q0")).headers[BACKEND_HEADER] == "a"
    for q in range(2):
        assert (await ask(pool, OTHER + f"q{q}")).headers[BACKEND_HEADER] == "b"
    a.gate.clear()
    held = ask(pool, text)
    await until(lambda: a.calls == 2)
    return held


@pytest.mark.parametrize(("budget", "expected"), [(0.1, "a"), (0.0, "b")])
async def test_a_one_slot_engine_busy_with_a_short_request_is_waited_for(
    session: aiohttp.ClientSession, engines: list[Engine], budget: float, expected: str
) -> None:
    """Waiting for the short cached request ahead costs less than prefilling the 1000-token prefix on the idle
    engine (1 s), so the request stays. Budget 0 is the mutation: the old rule spills it."""
    a, b = engines
    pool = make_pool(session, engines, queue_beside_idle_share=budget)
    held = await _busy_with(pool, a, PREFIX + "q1")
    follower = ask(pool, PREFIX + "q2")
    await until(lambda: a.calls + b.calls == 5)
    a.gate.set()
    first, second = await asyncio.gather(held, follower)
    assert first.headers[BACKEND_HEADER] == "a"
    assert second.headers[BACKEND_HEADER] == expected
    if expected == "a":
        assert "reason=prefix" in second.headers[ROUTE_HEADER] and "wait_ms=" in second.headers[ROUTE_HEADER]


async def test_a_one_slot_engine_busy_with_a_long_request_is_not_waited_for(
    session: aiohttp.ClientSession, engines: list[Engine]
) -> None:
    """Ahead of it: 8000 characters it never saw (2 s of prefill); prefilling the prefix elsewhere costs 1 s."""
    a, _ = engines
    pool = make_pool(session, engines)
    held = await _busy_with(pool, a, PREFIX + "new " * 2000)
    spilled = await ask(pool, PREFIX + "q2")
    assert spilled.headers[BACKEND_HEADER] == "b" and "reason=spill" in spilled.headers[ROUTE_HEADER]
    a.gate.set()
    assert (await held).headers[BACKEND_HEADER] == "a"


@pytest.mark.parametrize("batch", [8, 0])
async def test_a_batching_engine_that_says_its_batch_size_takes_its_prefix_while_busy(
    session: aiohttp.ClientSession, engines: list[Engine], batch: int
) -> None:
    """Our backend batches and says how many it runs at once (`tokenedge_backend_max_running_requests`, its real
    /metrics text here): busy with a long request, it still has a free slot, so the request sharing its prefix joins
    it. Batch 0 is the mutation (the gauge not read, or absent): played as one slot, the request spills."""
    a, b = engines
    stats = EngineStats(1, 0, 64, 64, 0, 0, 0, 0, max_running=batch)
    a.metrics = BackendMetrics(lambda: stats).render()
    pool = make_pool(session, engines)
    held = await _busy_with(pool, a, PREFIX + "new " * 2000)
    await health.read_state(pool, pool.backends[0], {})
    assert pool.backends[0].slots == (batch or 1)
    follower = ask(pool, PREFIX + "q2")
    await until(lambda: a.calls + b.calls == 5)
    a.gate.set()
    answer = await follower
    assert answer.headers[BACKEND_HEADER] == ("a" if batch else "b")
    assert ("reason=prefix" if batch else "reason=spill") in answer.headers[ROUTE_HEADER]
    assert (await held).headers[BACKEND_HEADER] == "a"


def test_engine_capacity_is_read_where_an_engine_says_it() -> None:
    assert health.metrics_capacity("tokenedge_backend_max_running_requests 16.0\n") == 16
    assert health.metrics_capacity("tokenedge_backend_running_requests 3.0\n") is None
    assert health.metrics_capacity("tokenedge_backend_max_running_requests 0\n") is None


@pytest.mark.parametrize(("factor", "expected"), [(pace.SHARE_FACTOR, "b"), (100.0, "a")])
async def test_an_engine_that_took_all_recent_requests_is_not_waited_for_beside_an_idle_one(
    session: aiohttp.ClientSession,
    engines: list[Engine],
    monkeypatch: pytest.MonkeyPatch,
    factor: float,
    expected: str,
) -> None:
    """b was out (every request went to a), so a holds every prefix: with the pile-up budget never spent, the share
    guard still sends the request waiting for a to idle b, which then holds the prefix too. Factor 100 is the
    mutation: without the guard it stays on a, and b would stay empty."""
    monkeypatch.setattr(pace, "SHARE_FACTOR", factor)
    a, b = engines
    pool = make_pool(session, engines, queue_beside_idle_share=1.0, eject_after_failures=1, eject_base_s=0.05)
    pool.backends[1].fault("test: down")
    for q in range(3):
        assert (await ask(pool, PREFIX + f"q{q}")).headers[BACKEND_HEADER] == "a"
    await until(lambda: pool.backends[1].breaker.available())
    a.gate.clear()
    held = ask(pool, PREFIX + "held")
    await until(lambda: a.calls == 4)
    waiting = ask(pool, PREFIX + "next")
    await until(lambda: a.calls + b.calls == 5)
    a.gate.set()
    assert [r.headers[BACKEND_HEADER] for r in await asyncio.gather(held, waiting)] == ["a", expected]


@pytest.mark.parametrize("restart", [True, False])
async def test_after_a_short_outage_nothing_queues_beside_the_idle_readmitted_engine(
    session: aiohttp.ClientSession, engines: list[Engine], monkeypatch: pytest.MonkeyPatch, restart: bool
) -> None:
    """The shares were even (4 and 4) when b was ejected; a took the one request of a short outage and holds every
    prefix. Once b is back and idle while a is busy, each request of a steady stream goes to b (prefilling there)
    instead of queueing on a, with the default pile-up budget unspent: the ejection started the share guard's
    window again, so a holds all of it. The mutation (restart a no-op) never arms the guard: every request queues on
    a beside idle b, whose wait is short against the prefill it saves."""
    if not restart:
        monkeypatch.setattr(Recent, "restart", lambda self: None)
    a, b = engines
    pool = make_pool(session, engines, eject_after_failures=1, eject_base_s=0.05)
    for q in range(4):
        assert (await ask(pool, PREFIX + f"q{q}")).headers[BACKEND_HEADER] == "a"
    for q in range(4):
        assert (await ask(pool, OTHER + f"q{q}")).headers[BACKEND_HEADER] == "b"
    pool.backends[1].fault("test: down")
    assert (await ask(pool, PREFIX + "alone")).headers[BACKEND_HEADER] == "a"
    await until(lambda: pool.backends[1].breaker.available())
    a.gate.clear()
    held = ask(pool, PREFIX + "held")
    await until(lambda: a.calls == 6)
    went, queued = [], []
    for q in range(3):  # one at a time: b has answered the one before, so it is idle when the next is sent
        calls = (a.calls, b.calls)
        answer = ask(pool, PREFIX + f"next{q}")
        await until(lambda: a.calls + b.calls > sum(calls))  # noqa: B023 (awaited within the iteration)
        went.append("a" if a.calls > calls[0] else "b")
        if went[-1] == "b":
            assert (await answer).headers[BACKEND_HEADER] == "b"
        else:
            queued.append(answer)  # a holds it until its gate opens
    a.gate.set()
    await asyncio.gather(held, *queued)
    assert went == (["b", "b", "b"] if restart else ["a", "a", "a"])


def test_recent_shares_decay_and_are_weighed() -> None:
    recent = Recent([0.0, 0.0])
    recent.restart()  # an ejection arms the guard
    for t in range(3):
        recent.sent(float(t), 0)
    assert recent.over(0, {0: 1.0, 1: 1.0}) and not recent.over(1, {0: 1.0, 1: 1.0})
    assert not recent.over(0, {0: 5.0, 1: 1.0})  # its weight makes 100% within 1.25 x its share (5/6)
    recent.sent(300.0, 1)  # ten horizons later: the old requests weigh nothing
    assert recent.over(1, {0: 1.0, 1: 1.0}) and not recent.over(0, {0: 1.0, 1: 1.0})


async def test_the_prefill_rate_comes_from_the_engines_own_counters(session: aiohttp.ClientSession) -> None:
    totals = [(100.0, 1.0)]

    async def metrics(request: web.Request) -> web.Response:
        tokens, seconds = totals[-1]
        text = (
            "llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n"
            f"llamacpp:prompt_tokens_total {tokens}\nllamacpp:prompt_seconds_total {seconds}\n"
        )
        return web.Response(text=text)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        url = str(server.make_url("")).rstrip("/")
        config = UpstreamConfig(url=(url, url + "/"), health_path="")
        pool = build_upstream(config, session, RoutingMetrics(CollectorRegistry()))
        assert isinstance(pool, UpstreamPool)
        backend = pool.backends[0]
        await health.read_state(pool, backend, {})
        assert backend.pace.s_per_token == pytest.approx(0.01)  # 100 tokens in 1 s so far
        totals.append((1100.0, 3.0))
        await health.read_state(pool, backend, {})
        assert backend.pace.reported and 1 / backend.pace.s_per_token < 150  # 500 tokens/s since, averaged in
    finally:
        await server.close()
