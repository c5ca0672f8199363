"""Coherence across processes: a purge on one gateway reaches every other L1 over the bus, a lost subscription
turns L1 off until it is back, and a worker relay keeps `--workers N` coherent without Redis.

Two gateways on one real Redis stand for two replicas (or two workers: each has its own L1). The fake upstream
numbers every answer, so a body seen before the purge identifies a purged entry being served.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis

from gateway.tiers.coherence.local_bus import LocalBus, LocalHub
from gateway.tiers.coherence.message import Invalidation, decode, encode
from harness.gateway import RunningGateway
from harness.services import RedisServer
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream

ADMIN = {"Authorization": "Bearer admin-secret"}
OTHER = {**CHAT, "messages": [{"role": "user", "content": "something else"}]}


async def ask(gw: RunningGateway, body: dict[str, Any] = CHAT) -> tuple[str, bytes]:
    resp = await gw.client.post("/v1/chat/completions", json=body, headers=AUTH_A)
    assert resp.status == 200
    return resp.headers["Cache-Status"], await resp.read()


async def two_replicas(make_gateway: GatewayFactory, redis_url: str) -> tuple[RunningGateway, RunningGateway]:
    sections: dict[str, Any] = {"cache": {"redis_url": redis_url}, "server": {"admin_token": "admin-secret"}}
    a, b = await make_gateway(**sections), await make_gateway(**sections)
    await a.state.coherence.wait_subscribed(True)
    await b.state.coherence.wait_subscribed(True)
    return a, b


async def warm_both(a: RunningGateway, b: RunningGateway, body: dict[str, Any]) -> bytes:
    _, first = await ask(a, body)
    await ask(b, body)  # an L2 hit, back-filled into b's L1
    status, again = await ask(b, body)
    assert status.endswith("detail=l1") and again == first
    return first


def test_invalidation_wire_form_round_trips_and_rejects_unknown_versions() -> None:
    msg = Invalidation.purge("o", 1.5, ("te1:pub:" + "0" * 64,), ("model:my model",))
    assert decode(encode(msg)) == msg
    rev = Invalidation.new_revision("o", 2.0, "m", "r2")
    assert decode(encode(rev)) == rev
    assert decode(encode(msg).replace(b'"v":1', b'"v":9')) is None
    assert decode(b"not json") is None


async def test_purge_on_one_replica_reaches_the_other_l1(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str
) -> None:
    a, b = await two_replicas(make_gateway, redis_url)
    for purge in ({"keys": "KEY"}, {"tags": ["model:test-model"]}, {"tags": ["tenant:*"]}):
        old = await warm_both(a, b, CHAT)
        key = (await a.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)).headers["X-Cache-Key"]
        scope = key.split(":")[1]
        body = (
            {"keys": [key]} if "keys" in purge else {"tags": [t.replace("*", scope) for t in purge["tags"]]}
        )
        resp = await a.client.post("/admin/purge", json=body, headers=ADMIN)
        assert (await resp.json())["purged"]["bus"] == 1  # b confirmed before the purge answered
        for gw in (b, a, b):
            status, answer = await ask(gw)
            assert answer != old, f"{purge}: purged entry served ({status})"


async def test_lost_subscription_turns_l1_off_until_it_is_back(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str, redis_server: RedisServer
) -> None:
    a, b = await two_replicas(make_gateway, redis_url)
    old = await warm_both(a, b, CHAT)
    other_old = await warm_both(a, b, OTHER)
    admin = redis.Redis(host="127.0.0.1", port=redis_server.port)
    try:
        assert admin.client_kill_filter(_type="pubsub") >= 2  # both gateways' subscriptions, cut by Redis
        await b.state.coherence.wait_subscribed(False)
        resp = await a.client.post("/admin/purge", json={"tags": ["model:test-model"]}, headers=ADMIN)
        assert resp.status == 200  # published to nobody: b missed it
        for _ in range(3):
            down_before = not b.state.coherence.subscribed
            status, answer = await ask(b)
            assert answer != old, status
            if down_before and not b.state.coherence.subscribed:
                assert "detail=l1" not in status  # while down, nothing at all is served from L1
        await b.state.coherence.wait_subscribed(True)
        for body, before in ((CHAT, old), (OTHER, other_old)):
            status, answer = await ask(b, body)
            assert answer != before, f"purged entry served after resubscribing ({status})"
    finally:
        admin.close()


async def test_worker_relay_delivers_to_every_other_worker() -> None:
    hub = LocalHub(3)
    got: list[list[bytes]] = [[], [], []]
    arrived = asyncio.Event()

    class Sink:
        def __init__(self, i: int) -> None:
            self.i = i

        def message(self, raw: bytes) -> None:
            got[self.i].append(raw)
            if all(got[j] for j in (1, 2)):
                arrived.set()

        def up(self) -> None: ...

        def down(self) -> None: ...

    buses = [LocalBus(end.sock, end.peers) for end in hub.worker_ends]
    hub._thread.start()  # in-process: the workers' ends stay open here
    for i, bus in enumerate(buses):
        await bus.start(Sink(i))
    try:
        assert await buses[0].publish(b"x" * 100_000) == 2  # larger than one socket read: framed
        await asyncio.wait_for(arrived.wait(), 10)
        assert got == [[], [b"x" * 100_000], [b"x" * 100_000]]
    finally:
        for bus in buses:
            await bus.close()


async def test_the_alias_serves_no_entry_of_a_revision_known_to_be_replaced(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str
) -> None:
    """P6 (docs/coherence.md): `GET /v1/cache/{key}` judges with the model's current revision, as a lookup does; the
    old revision's entry is still in L2 (keys carry the revision, nothing purged it) but is no answer."""
    a, b = await two_replicas(make_gateway, redis_url)
    first = await a.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    key = first.headers["X-Cache-Key"]  # stored by a, under rev-1
    assert (await b.client.get(f"/v1/cache/{key}", headers=AUTH_A)).status == 200  # from L2, then b's L1
    fake.revision = "rev-2"
    b.state.catalog.learn("test-model", "rev-2")  # as from a new revision's answer; dropped from b's L1 too
    assert await b.state.cache.l2.get(key) is not None  # type: ignore[union-attr]
    assert (await b.client.get(f"/v1/cache/{key}", headers=AUTH_A)).status == 404
