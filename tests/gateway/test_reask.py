"""`python -m gateway warm`: the top N recorded requests re-asked through the gateway, rate-limited."""

from __future__ import annotations

import asyncio
import os
import sys

import orjson
import pytest

from gateway.misses.reask import main, reask, select
from gateway.misses.warm import hot_record_of
from gateway.tiers.hotrecord import Replayable
from harness.gateway import FakeClock, RunningGateway
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream

JSON = {"Content-Type": "application/json"}


def chat(text: str) -> bytes:
    return orjson.dumps({**CHAT, "messages": [{"role": "user", "content": text}]})


def item(key: str, body: bytes, revision: str = "rev-1") -> Replayable:
    return Replayable(key, "chat/completions", "/v1/chat/completions", "test-model", revision, body)


def test_select_takes_the_hottest_distinct_requests_of_the_revision_asked() -> None:
    recorded = [item("k1", b"a", "rev-2"), item("k2", b"a"), None, item("k3", b"b"), item("k4", b"c")]
    assert [r.key for r in select(recorded, 2)] == ["k1", "k3"]  # the same bytes under two revisions: once
    assert [r.key for r in select(recorded, 5, revision="rev-1")] == ["k2", "k3", "k4"]


async def test_sends_start_no_faster_than_the_rate() -> None:
    clock = FakeClock(0.0)
    sleeps: list[float] = []
    started: list[float] = []

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(0)  # the sends already started run now, at the time they were started
        sleeps.append(seconds)
        clock.advance(seconds)

    async def send(req: Replayable) -> str:
        started.append(clock())
        return "stored"

    items = [item(f"k{i}", str(i).encode()) for i in range(5)]
    outcomes = await reask(items, send, rate_per_s=2.0, concurrency=2, clock=clock, sleep=sleep)
    assert outcomes == {"stored": 5}
    assert started == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert sum(sleeps) == 2.0


async def ask(gw: RunningGateway, body: bytes, headers: dict[str, str] = JSON) -> str:
    resp = await gw.client.post("/v1/chat/completions", data=body, headers=headers)
    assert resp.status == 200
    await resp.read()
    return resp.headers["Cache-Status"]


async def test_warm_re_asks_the_top_n_against_the_new_revision(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str
) -> None:
    gw = await make_gateway(cache={"redis_url": redis_url})
    bodies = [chat(f"question {i}") for i in range(3)]
    for i, body in enumerate(bodies):
        for _ in range(3 - i):  # question 0 is the hottest
            await ask(gw, body)
    streamed = orjson.dumps({**orjson.loads(chat("streamed question")), "stream": True})
    for _ in range(2):  # a store then a hit: as hot as question 1, hotter than question 2
        resp = await gw.client.post("/v1/chat/completions", data=streamed, headers=JSON)
        assert resp.status == 200 and b"[DONE]" in await resp.read()
    for _ in range(
        5
    ):  # the hottest of all, but tenant-scoped: never re-asked without the tenant's credential
        await ask(gw, chat("tenant question"), {**JSON, **AUTH_A})
    record = hot_record_of(gw.state)
    assert record is not None
    await record.flush()

    fake.revision = "rev-2"  # a new model is deployed; a replica that knows it is started
    new = await make_gateway(cache={"redis_url": redis_url})
    calls = fake.calls["chat"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "warm",
        "--top",
        "3",
        "--rate",
        "50",
        "--url",
        new.url,
        env={**os.environ, "TOKENEDGE_CACHE_REDIS_URL": redis_url},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    assert out.decode().strip() == "re-asked 3 request(s): stored 3"
    assert fake.calls["chat"] == calls + 3
    asked = sorted(b["messages"][0]["content"] for b in fake.bodies[-3:])
    assert asked == ["question 0", "question 1", "streamed question"]
    assert "authorization" not in {name.lower() for name in fake.headers[-1]}
    for body in bodies[:2]:
        assert "; hit;" in await ask(new, body)  # hot again under rev-2 before any client asked
    resp = await new.client.post("/v1/chat/completions", data=streamed, headers=JSON)
    assert (
        "; hit;" in resp.headers["Cache-Status"] and b"[DONE]" in await resp.read()
    )  # one entry serves both
    assert "fwd=miss" in await ask(new, bodies[2])


def test_the_command_needs_a_redis_l2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--top", "3"], {}) == 2
    assert "needs a Redis L2" in capsys.readouterr().err
