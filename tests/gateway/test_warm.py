"""Warm-up of a new replica: L1 filled from L2's hottest entries before `/ready` says yes (bounded)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson
import pytest

from gateway.keys.entry import Entry
from gateway.misses import warm
from gateway.misses.warm import hot_record_of
from gateway.state import GatewayState
from gateway.tiers.hotrecord import HotRecord, Warmup
from gateway.tiers.redis_tier import RedisTier
from harness.gateway import RunningGateway
from tests.gateway.conftest import CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream

JSON = {"Content-Type": "application/json"}


def chat(text: str) -> bytes:
    return orjson.dumps({**CHAT, "messages": [{"role": "user", "content": text}]})


async def ask(gw: RunningGateway, body: bytes) -> str:
    resp = await gw.client.post("/v1/chat/completions", data=body, headers=JSON)
    assert resp.status == 200
    await resp.read()
    return resp.headers["Cache-Status"]


def warmup_of(gw: RunningGateway) -> Warmup:
    found = gw.state.warmup
    assert found is not None
    return found


async def test_a_replica_started_against_a_warm_l2_answers_hot_keys_from_l1(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str
) -> None:
    first = await make_gateway(cache={"redis_url": redis_url})
    hot = [chat(f"hot question {i}") for i in range(3)]
    for body in hot:
        await ask(first, body)
    record = hot_record_of(first.state)
    assert isinstance(record, HotRecord)
    await record.flush()
    calls = fake.calls["chat"]

    second = await make_gateway(cache={"redis_url": redis_url})
    warmup = warmup_of(second)
    await warmup.done.wait()
    ready = await second.client.get("/ready")
    assert ready.status == 200 and (await ready.json())["status"] == "ready"
    assert warmup.outcome == "filled" and warmup.filled == 3
    for body in hot:
        assert (await ask(second, body)).endswith("detail=l1")  # its very first requests: no L2 read
    assert fake.calls["chat"] == calls


async def test_the_fill_keeps_the_hottest_when_l1_cannot_hold_them_all(
    make_gateway: GatewayFactory, redis_url: str
) -> None:
    first = await make_gateway(cache={"redis_url": redis_url})
    bodies = [chat(f"question {i}") for i in range(4)]
    for i, body in enumerate(bodies):
        for _ in range(i + 1):  # question 3 is the hottest
            await ask(first, body)
    record = hot_record_of(first.state)
    assert record is not None
    await record.flush()
    entry_bytes = first.state.cache.l1.bytes_used() // 4
    second = await make_gateway(
        cache={"redis_url": redis_url, "l1_max_bytes": entry_bytes * 2 + entry_bytes // 2}
    )
    await warmup_of(second).done.wait()
    assert (await ask(second, bodies[3])).endswith("detail=l1")
    assert (await ask(second, bodies[0])).endswith("detail=l2")


def gated_fill(gate: asyncio.Event):
    async def fill(state: GatewayState, record: HotRecord, top: int, warmup: Warmup) -> None:
        await gate.wait()
        warmup.filled = top

    return fill


async def test_ready_says_warming_until_the_fill_is_done(
    make_gateway: GatewayFactory, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = asyncio.Event()
    monkeypatch.setattr(warm, "fill_l1", gated_fill(gate))
    gw = await make_gateway(cache={"redis_url": redis_url})
    resp = await gw.client.get("/ready")
    assert resp.status == 503 and (await resp.json())["status"] == "warming"
    gate.set()
    await warmup_of(gw).done.wait()
    resp = await gw.client.get("/ready")
    assert resp.status == 200 and (await resp.json())["status"] == "ready"


async def test_ready_waits_for_the_fill_no_longer_than_the_timeout(
    make_gateway: GatewayFactory, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(warm, "fill_l1", gated_fill(asyncio.Event()))  # never released
    gw = await make_gateway(cache={"redis_url": redis_url, "warm_fill_timeout_s": 0.05})
    warmup = warmup_of(gw)
    await warmup.done.wait()
    assert warmup.outcome == "timeout"
    assert (await gw.client.get("/ready")).status == 200


async def test_without_a_redis_l2_there_is_no_record_and_ready_does_not_wait(gw: RunningGateway) -> None:
    assert hot_record_of(gw.state) is None and gw.state.warmup is None
    assert (await gw.client.get("/ready")).status == 200


async def test_an_entry_purged_while_the_fill_runs_is_not_left_in_l1(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await make_gateway(cache={"redis_url": redis_url})
    bodies = [chat("kept"), chat("purged")]
    keys = []
    for body in bodies:
        resp = await first.client.post("/v1/chat/completions", data=body, headers=JSON)
        keys.append(resp.headers["X-Cache-Key"])
    record = hot_record_of(first.state)
    assert record is not None
    await record.flush()
    original = RedisTier.get_many
    reads = 0

    async def purge_after_first_read(self: RedisTier, wanted: Sequence[str]) -> list[Entry | None]:
        nonlocal reads
        found = await original(self, wanted)
        reads += 1
        if reads == 1:  # a purge lands between the fill's read and its L1 write
            await first.state.cache.purge([keys[1]], [])
        return found

    monkeypatch.setattr(RedisTier, "get_many", purge_after_first_read)
    second = await make_gateway(cache={"redis_url": redis_url})
    await warmup_of(second).done.wait()
    assert warmup_of(second).filled == 1
    assert second.state.cache.l1.get(keys[0]) is not None
    assert second.state.cache.l1.get(keys[1]) is None
    assert "fwd=miss" in await ask(second, bodies[1])


async def test_a_request_with_a_query_string_is_never_written_to_the_shared_record(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str
) -> None:
    """`?key=` may carry the caller's credential (scope material): the shared tier never holds it (design §2.1)."""
    import redis.asyncio as aioredis

    from gateway.tiers.hotrecord import REQUESTS

    gw = await make_gateway(cache={"redis_url": redis_url})
    for target in ("/v1/chat/completions?key=secret-one", "/v1/chat/completions?api-version=1"):
        resp = await gw.client.post(target, data=chat("with a query"), headers=JSON)
        assert resp.status == 200 and "stored" in resp.headers["Cache-Status"]
    await ask(gw, chat("without one"))  # the record does keep a plain anonymous request
    record = hot_record_of(gw.state)
    assert isinstance(record, HotRecord)
    await record.flush()
    client = aioredis.from_url(redis_url)
    try:
        kept = list((await client.hgetall(REQUESTS)).values())
    finally:
        await client.aclose()
    assert len(kept) == 1 and b"without one" in kept[0]
    assert not any(b"secret-one" in value for value in kept)
