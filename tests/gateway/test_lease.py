"""Cross-replica coalescing with leases (gateway/misses/lease.py): real gateway processes on one real redis-server.

The upstream is the scriptable fake in this process; its gate holds the holder's fill until the test has seen
another replica waiting on the lease (read from that replica's /metrics), so the misses really overlap.
"""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import orjson
import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter

from gateway.misses.lease import LEASE_PREFIX, Lease, Leases, LeaseSettings
from harness.gateway import RunningGateway
from harness.replicas import replicas
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream

LEASE_TTL_S = 1.0
HEADERS = {"Authorization": "Bearer sk-lease-test", "Content-Type": "application/json"}


def chat(text: str, *, stream: bool = False) -> bytes:
    return orjson.dumps(
        {
            "model": "test-model",
            "temperature": 0,
            "stream": stream,
            "messages": [{"role": "user", "content": text}],
        }
    )


def env(redis_url: str) -> dict[str, str]:
    return {
        "TOKENEDGE_CACHE_REDIS_URL": redis_url,
        "TOKENEDGE_CACHE_LEASE_TTL_S": str(LEASE_TTL_S),
        "TOKENEDGE_CACHE_LEASE_MAX_WAIT_S": "30",
    }


async def lease_waits(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    found = re.search(r'^tokenedge_lease_total\{outcome="wait"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


async def until_waiting(session: aiohttp.ClientSession, urls: list[str], at_least: float = 1.0) -> None:
    """Bounded wait until the replicas together report `at_least` lease waits."""
    for _ in range(600):
        if sum([await lease_waits(session, u) for u in urls]) >= at_least:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("no replica waited on the lease")


async def post(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, bytes, str]:
    async with session.post(url + "/v1/chat/completions", data=body, headers=HEADERS) as resp:
        return resp.status, await resp.read(), resp.headers.get("Cache-Status", "")


async def test_fifty_misses_over_two_replicas_make_one_upstream_call(
    fake: FakeUpstream, upstream_url: str, redis_url: str
) -> None:
    fake.gate = asyncio.Event()
    async with replicas(upstream_url, 2, env(redis_url)) as (a, b), aiohttp.ClientSession() as session:
        body = chat("one call for fifty")
        calls = [asyncio.ensure_future(post(session, (a, b)[i % 2].url, body)) for i in range(50)]
        await fake.entered.wait()
        await until_waiting(session, [a.url, b.url])  # the other replica is parked on the lease
        fake.gate.set()
        results = await asyncio.gather(*calls)
    assert [status for status, _, _ in results] == [200] * 50
    assert len({orjson.loads(raw)["id"] for _, raw, _ in results}) == 1
    assert fake.calls["chat"] == 1
    assert sum("collapsed" in status for _, _, status in results) >= 48  # all but each replica's leader


async def test_a_killed_holder_delays_the_others_by_at_most_the_lease_ttl(
    fake: FakeUpstream, upstream_url: str, redis_url: str
) -> None:
    fake.gate = asyncio.Event()
    async with replicas(upstream_url, 3, env(redis_url)) as (a, b, c), aiohttp.ClientSession() as session:
        body = chat("the holder dies")
        doomed = asyncio.ensure_future(post(session, a.url, body))
        await fake.entered.wait()  # A holds the lease and is upstream
        waiting = [asyncio.ensure_future(post(session, r.url, body)) for r in (b, c) for _ in range(5)]
        await until_waiting(session, [b.url, c.url], at_least=2)
        a.kill()
        killed_at = time.monotonic()
        fake.gate.set()  # from now on the upstream answers at once
        results = await asyncio.gather(*waiting)
        elapsed = time.monotonic() - killed_at
        with pytest.raises(aiohttp.ClientError):
            await doomed
    assert [status for status, _, _ in results] == [200] * 10
    assert len({orjson.loads(raw)["id"] for _, raw, _ in results}) == 1  # one answer, shared by B and C
    assert fake.calls["chat"] == 2  # the dead holder's call and exactly one more, not one per replica
    assert (
        elapsed < LEASE_TTL_S + 4.0
    )  # bounded by the lease TTL (+ slack for this loaded box), not max-wait 30 s


async def test_a_streamed_miss_on_another_replica_replays_the_holders_entry(
    fake: FakeUpstream, upstream_url: str, redis_url: str
) -> None:
    fake.gate = asyncio.Event()
    async with replicas(upstream_url, 2, env(redis_url)) as (a, b), aiohttp.ClientSession() as session:
        body = chat("stream me once", stream=True)
        first = asyncio.ensure_future(post(session, a.url, body))
        await fake.entered.wait()
        second = asyncio.ensure_future(post(session, b.url, body))
        await until_waiting(session, [b.url])
        fake.gate.set()
        (s1, raw1, _), (s2, raw2, _) = await asyncio.gather(first, second)
    assert (s1, s2) == (200, 200)
    assert fake.calls["chat"] == 1
    assert raw2.rstrip().endswith(b"data: [DONE]")
    text = b"".join(raw1.split(b"data: ")[1:-1])
    assert b"Hello" in raw2 and all(piece.encode() in raw2 for piece in fake.stream_pieces)
    assert text  # the holder streamed real chunks


async def test_a_responses_stream_on_another_replica_replays_the_holders_events(
    fake: FakeUpstream, upstream_url: str, redis_url: str
) -> None:
    fake.gate = asyncio.Event()
    body = orjson.dumps(
        {"model": "test-model", "input": "once", "temperature": 0, "store": False, "stream": True}
    )

    async def respond(session: aiohttp.ClientSession, url: str) -> bytes:
        async with session.post(url + "/v1/responses", data=body, headers=HEADERS) as resp:
            assert resp.status == 200
            return await resp.read()

    async with replicas(upstream_url, 2, env(redis_url)) as (a, b), aiohttp.ClientSession() as session:
        first = asyncio.ensure_future(respond(session, a.url))
        await fake.entered.wait()
        second = asyncio.ensure_future(respond(session, b.url))
        await until_waiting(session, [b.url])
        fake.gate.set()
        raw1, raw2 = await asyncio.gather(first, second)

    def frames(raw: bytes) -> list[bytes]:
        return [f for f in raw.split(b"\n\n") if f and not f.startswith(b":")]

    assert fake.calls["responses"] == 1
    assert frames(raw2) == frames(raw1)  # the holder's events, under their own names, from its entry
    assert frames(raw2)[-1].startswith(b"event: response.completed\n") and b"[DONE]" not in raw2


def make_leases(client: aioredis.Redis, *, ttl_s: float = 5.0, max_wait_s: float = 5.0) -> Leases:
    counter = Counter("tokenedge_lease", "test", ["outcome"], registry=CollectorRegistry())
    return Leases(
        client, LeaseSettings(ttl_s=ttl_s, max_wait_s=max_wait_s, timeout_s=1.0), counter, time.time
    )


async def nothing() -> None:
    return None


async def test_release_is_token_checked_and_not_stored_sends_waiters_upstream(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    leases = make_leases(client)
    listener = asyncio.ensure_future(leases.listen([aioredis.Redis.from_url(redis_url)]))
    try:
        await leases.subscribed.wait()
        held = await leases.acquire_or_wait("k1", nothing)
        assert isinstance(held, Lease)
        await leases.release("k1", "not-the-token", stored=True)
        assert await client.exists(LEASE_PREFIX + "k1") == 1  # a stranger's token releases nothing
        waiter = asyncio.ensure_future(leases.acquire_or_wait("k1", nothing))
        for _ in range(200):  # bounded: until the waiter has registered for the wake-up
            if leases._waiters.get("k1"):
                break
            await asyncio.sleep(0.01)
        await held.release(stored=False)
        assert await asyncio.wait_for(waiter, 2.0) is None  # not stored: the waiter goes upstream itself
        assert await client.exists(LEASE_PREFIX + "k1") == 0
    finally:
        listener.cancel()
        await client.aclose()


async def test_a_waiter_goes_upstream_itself_after_max_wait_while_a_live_holder_renews(
    redis_url: str,
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    holder = make_leases(client, ttl_s=0.3)
    waiter = make_leases(client, ttl_s=0.3, max_wait_s=1.0)
    try:
        held = await holder.acquire_or_wait("k2", nothing)
        assert isinstance(held, Lease)
        started = time.monotonic()
        assert await waiter.acquire_or_wait("k2", nothing) is None  # gave up waiting: goes upstream unleased
        assert time.monotonic() - started >= 1.0  # it did wait out max-wait: the renewed lease never lapsed
        assert await client.exists(LEASE_PREFIX + "k2") == 1  # renewed past three TTLs by the live holder
        await held.release(stored=False)
    finally:
        await client.aclose()


def test_cluster_urls_are_validated() -> None:
    from gateway.config.settings import CacheConfig, ConfigError

    assert CacheConfig(redis_url="redis+cluster://10.0.0.1:6379,10.0.0.2:6380").redis_url
    with pytest.raises(ConfigError, match="host:port"):
        CacheConfig(redis_url="redis+cluster://10.0.0.1")


async def parked(gw: RunningGateway) -> None:
    """Bounded wait until this in-process gateway reports a lease wait."""
    for _ in range(500):
        if any(
            s.labels.get("outcome") == "wait" and s.value >= 1
            for m in gw.state.metrics.registry.collect()
            for s in m.samples
            if s.name == "tokenedge_lease_total"
        ):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the gateway never waited on the lease")


async def test_an_uncacheable_answer_is_not_shared_across_replicas(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str
) -> None:
    fake.gate, fake.status = asyncio.Event(), 500
    one = await make_gateway(cache={"redis_url": redis_url})
    two = await make_gateway(cache={"redis_url": redis_url})
    first = asyncio.ensure_future(one.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A))
    await fake.entered.wait()
    second = asyncio.ensure_future(two.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A))
    await parked(two)
    fake.gate.set()
    a, b = await asyncio.gather(first, second)
    assert (a.status, b.status) == (500, 500)
    assert fake.calls["chat"] == 2  # the waiter asked for itself: an error is never handed to another replica


async def test_lease_streams_off_lets_each_replica_stream_from_the_upstream(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str
) -> None:
    fake.gate = asyncio.Event()
    cache = {"redis_url": redis_url, "lease_streams": False}
    one, two = await make_gateway(cache=cache), await make_gateway(cache=cache)
    body = {**CHAT, "stream": True}
    first = asyncio.ensure_future(one.client.post("/v1/chat/completions", json=body, headers=AUTH_A))
    await fake.entered.wait()
    fake.entered.clear()
    second = asyncio.ensure_future(two.client.post("/v1/chat/completions", json=body, headers=AUTH_A))
    await asyncio.wait_for(fake.entered.wait(), 10)  # the second replica reached the upstream, no lease wait
    fake.gate.set()
    a, b = await asyncio.gather(first, second)
    assert (a.status, b.status) == (200, 200)
    assert (await a.read()).endswith(b"data: [DONE]\n\n") and (await b.read()).endswith(b"data: [DONE]\n\n")
    assert fake.calls["chat"] == 2
