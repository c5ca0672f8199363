"""The cost policy's waiting beside an idle engine (gateway/upstream/routing/cost.py, pace.py), on the loopback
engines of `test_routing_pace` (answers held by gates, never sleeps): the pile-up budget prices a wait and, once
spent, ends all but the cheap ones; the share guard holds only from an ejection until the shares are even; and the
`tokens` key's tokenizer calls take no slot in any of it."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from backend.engine.outputs import EngineStats
from backend.metrics import BackendMetrics
from gateway.upstream.routing import facts, health
from gateway.upstream.routing.attempt import BACKEND_HEADER
from gateway.upstream.routing.cost import PILE_UP_WEIGHT, pile_up_price
from gateway.upstream.routing.pace import Recent
from gateway.upstream.routing.pool import UpstreamPool
from tests.gateway.test_routing_pace import PREFIX, Engine, _busy_with, ask, gated_engines, make_pool, until


@pytest.fixture
async def engines() -> AsyncIterator[list[Engine]]:
    async with gated_engines() as made:
        yield made


@pytest.mark.parametrize(
    ("ahead", "cheap", "expected"),
    [(300, True, "b"), (0, True, "a"), (0, False, "b")],
    ids=["long", "cheap", "mutation"],
)
async def test_waiting_beside_an_idle_engine_stops_once_the_pile_up_budget_is_spent(
    session: aiohttp.ClientSession,
    engines: list[Engine],
    monkeypatch: pytest.MonkeyPatch,
    ahead: int,
    cheap: bool,
    expected: str,
) -> None:
    """With the budget (0.1) spent, a request that would wait 0.3 s (the queued request's 300 new tokens) to save
    1 s of prefill spills to idle b; one whose wait is about nothing (at most 0.1 of the 1 s it saves) still waits
    for a. The mutation drops that exception (`cheap_wait_share` 0): the near-free wait spills too."""
    if not cheap:
        views = UpstreamPool._views
        monkeypatch.setattr(
            UpstreamPool,
            "_views",
            lambda self, *args: [dataclasses.replace(v, cheap_wait_share=0.0) for v in views(self, *args)],
        )
    a, b = engines
    pool = make_pool(session, engines, queue_beside_idle_share=0.1)
    held = await _busy_with(pool, a, PREFIX + "q1")
    queued = ask(pool, PREFIX + "q2" + " new" * ahead)  # waits for a: the budget is untouched
    await until(lambda: a.calls == 3)
    await until(lambda: pool.pile_up.share(time.monotonic()) >= 0.1)  # a holds 2, b idle: the share grows
    third = ask(pool, PREFIX + "q3")
    await until(lambda: a.calls + b.calls == 6)
    assert b.calls == (3 if expected == "b" else 2)
    a.gate.set()
    answers = await asyncio.gather(held, queued, third)
    assert [r.headers[BACKEND_HEADER] for r in answers] == ["a", "a", expected]


@pytest.mark.parametrize("counted", [True, False], ids=["batch", "mutation"])
async def test_a_batch_beside_an_idle_engine_spends_the_pile_up_budget(
    session: aiohttp.ClientSession, engines: list[Engine], monkeypatch: pytest.MonkeyPatch, counted: bool
) -> None:
    """With `pile_up_batches`, a batching engine (8 slots, its /metrics says so) holding two requests of one prefix
    while the other engine sits idle piles up as a queue does: the budget (0.1) fills, and the next request of that
    prefix takes the idle engine (its prefix gets a second home) rather than run 2 s beside a's long request to save
    1 s of prefill. The mutation counts only queues (more requests than slots) as pile-up, the setting ignored: a
    batch never spends the budget, and every request of the prefix joins a while b idles (on two of our backends,
    22% of the busy time)."""
    if not counted:

        def queues_only(self: UpstreamPool) -> None:
            up = [b for b in self.backends if b.breaker.available()]
            piled = any(b.load > b.slots for b in up) and any(b.load == 0 for b in up)
            self.pile_up.observe(time.monotonic(), busy=any(b.load > 0 for b in up), piled=piled)

        monkeypatch.setattr(UpstreamPool, "_observe", queues_only)
    a, b = engines
    stats = EngineStats(1, 0, 64, 64, 0, 0, 0, 0, max_running=8)
    a.metrics = BackendMetrics(lambda: stats).render()
    pool = make_pool(session, engines, queue_beside_idle_share=0.1, pile_up_batches=True)
    held = await _busy_with(pool, a, PREFIX + " new" * 2000)  # expected to run 2 s: no cheap overlap
    await health.read_state(pool, pool.backends[0], {})
    assert pool.backends[0].slots == 8
    joined = ask(pool, PREFIX + "q2")  # the budget is untouched: it joins a's batch
    await until(lambda: a.calls == 3)
    assert pool.pile_up.state == (True, counted)
    if counted:
        await until(lambda: pool.pile_up.share(time.monotonic()) >= 0.1)
    third = ask(pool, PREFIX + "q3")
    await until(lambda: a.calls + b.calls == 6)
    a.gate.set()
    answers = await asyncio.gather(held, joined, third)
    assert [r.headers[BACKEND_HEADER] for r in answers] == ["a", "a", "b" if counted else "a"]


def test_the_share_guard_holds_from_an_ejection_until_the_shares_are_even() -> None:
    """Off in a steady fleet: 7 of 11 recent requests on one engine is noise there. From an ejection it holds while
    the engine that came back has taken nothing, and disarms once every engine has and none is over the factor."""
    both = {0: 1.0, 1: 1.0}
    recent = Recent([0.0, 0.0])
    for t in range(7):
        recent.sent(float(t), 0)
    assert not recent.over(0, both)
    recent.restart()
    for t in range(4):
        recent.sent(10.0 + t, 0)
    assert not recent.over(0, {0: 1.0})  # while 1 is out, 0 is the whole fleet
    assert recent.over(0, both)
    for t in range(3):
        recent.sent(20.0 + t, 1)
    assert not recent.over(0, both) and not recent.armed  # 4 and 3: even, both served: off
    for t in range(5):
        recent.sent(30.0 + t, 0)
    assert not recent.over(0, both)  # off again until the next ejection


def test_the_pile_up_price_is_the_spent_share_of_the_budget() -> None:
    """A wait beside an idle engine costs only itself while the fleet has not piled up lately, and is charged
    PILE_UP_WEIGHT more per second at the budget and past it (`cost.pile_up_price`); budget 0 charges it all."""
    assert pile_up_price(0.0, 0.2) == 0.0
    assert pile_up_price(0.1, 0.2) == pytest.approx(0.5 * PILE_UP_WEIGHT)
    assert pile_up_price(0.5, 0.2) == pytest.approx(PILE_UP_WEIGHT)
    assert pile_up_price(0.0, 0.0) == pytest.approx(PILE_UP_WEIGHT)


def _books(pool: UpstreamPool) -> tuple[Any, ...]:
    """What the cost policy reads of the fleet, but the pile-up share (which moves with the clock)."""
    return (
        list(pool.recent.counts),
        [(b.outstanding, b.load, b.service_s, b.pace.fixed_s, len(b.pace.flying)) for b in pool.backends],
    )


@pytest.mark.parametrize("light", [True, False])
async def test_tokenizer_calls_take_no_slot_in_the_cost_policys_books(
    session: aiohttp.ClientSession, engines: list[Engine], monkeypatch: pytest.MonkeyPatch, light: bool
) -> None:
    """The `tokens` key asks an engine for ids before each miss (`/tokenize`, `/apply-template`), which engines
    answer without a slot: they go to the least loaded engine and change nothing the cost policy reads. The
    mutation routes them as requests (LIGHT_PATHS empty): each counts in the engine's share of recent requests and
    teaches its service time, as two calls per miss did in front of one-slot llama-servers."""
    if not light:
        monkeypatch.setattr(facts, "LIGHT_PATHS", frozenset())
    a, b = engines
    pool = make_pool(session, engines)
    held = await _busy_with(pool, a, PREFIX + "q1")
    before = _books(pool)
    for _ in range(3):
        answer = await pool.request("POST", "/tokenize", {}, orjson.dumps({"content": "x"}))
        assert answer.status == 200
    assert (b.tokenized, a.tokenized) == (3, 0)  # a holds a request: b is the least loaded
    assert (_books(pool) == before) is light
    a.gate.set()
    assert (await held).headers[BACKEND_HEADER] == "a"
