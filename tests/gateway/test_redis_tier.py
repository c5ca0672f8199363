"""L2 against a real redis-server: sharing across gateways, purge by tag, the purge discipline's scripts (P1, P2 of
docs/coherence.md) and degrading through an outage."""

from __future__ import annotations

import time
from dataclasses import replace

import redis.asyncio as aioredis
from prometheus_client.samples import Sample

from gateway.keys.entry import Entry
from gateway.tiers.redis_tier import EPOCH_KEY, TAG_PREFIX, RedisTier
from harness.gateway import FakeClock, RunningGateway
from harness.services import RedisServer
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.gateway.test_entry import entry
from tests.support.fake_upstream import FakeUpstream


def sample(gw: RunningGateway, name: str, **labels: str) -> float:
    gw.state.metrics.tally.flush()  # as a scrape does first: hot-path counts are tallied, then folded in
    for metric in gw.state.metrics.registry.collect():
        for s in metric.samples:
            if (
                isinstance(s, Sample)
                and s.name == name
                and all(s.labels.get(k) == v for k, v in labels.items())
            ):
                return float(s.value)
    return 0.0


async def test_l2_is_shared_between_gateways_and_backfills_l1(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str
) -> None:
    one = await make_gateway(cache={"redis_url": redis_url})
    two = await make_gateway(cache={"redis_url": redis_url})
    first = await one.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    from_l2 = await two.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    from_l1 = await two.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert from_l2.headers["Cache-Status"].endswith("detail=l2")
    assert from_l1.headers["Cache-Status"].endswith("detail=l1")
    assert await from_l2.read() == await first.read()
    assert fake.calls["chat"] == 1


async def test_l2_only_gateway_serves_hits_from_redis(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str
) -> None:
    gw = await make_gateway(cache={"redis_url": redis_url, "l1_max_bytes": 0})
    await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    resp = await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert resp.headers["Cache-Status"].endswith("detail=l2")
    assert sample(gw, "tokenedge_cache_lookups_total", tier="l2", outcome="hit") == 1
    assert fake.calls["chat"] == 1


async def test_redis_outage_degrades_and_recovers_without_restart(
    make_gateway: GatewayFactory,
    fake: FakeUpstream,
    redis_server: RedisServer,
    redis_url: str,
    clock: FakeClock,
) -> None:
    gw = await make_gateway(cache={"redis_url": redis_url, "l1_max_bytes": 0, "redis_retry_after_s": 1.0})
    redis_server.stop()
    try:
        for i in range(3):
            resp = await gw.client.post(
                "/v1/chat/completions",
                json={**CHAT, "messages": [{"role": "user", "content": f"outage {i}"}]},
                headers=AUTH_A,
            )
            assert resp.status == 200
            clock.advance(2)  # past the breaker window: every request tries Redis again
        assert sample(gw, "tokenedge_cache_errors_total", tier="l2") >= 3
    finally:
        redis_server.start()
    clock.advance(2)
    await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    again = await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert again.headers["Cache-Status"].endswith("detail=l2")
    assert fake.calls["chat"] == 4


async def test_breaker_skips_redis_after_a_failure(
    make_gateway: GatewayFactory, redis_server: RedisServer, redis_url: str
) -> None:
    gw = await make_gateway(cache={"redis_url": redis_url, "l1_max_bytes": 0, "redis_retry_after_s": 60})
    redis_server.stop()
    try:
        for i in range(5):
            resp = await gw.client.post(
                "/v1/chat/completions",
                json={**CHAT, "messages": [{"role": "user", "content": f"q{i}"}]},
                headers=AUTH_A,
            )
            assert resp.status == 200
    finally:
        redis_server.start()
    # one failed get opens the breaker; the remaining lookups and stores are skipped, not retried
    assert sample(gw, "tokenedge_cache_errors_total", tier="l2") == 1


async def test_corrupt_or_foreign_values_read_as_misses(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str
) -> None:
    import redis.asyncio as aioredis

    gw = await make_gateway(cache={"redis_url": redis_url, "l1_max_bytes": 0})
    first = await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    key = first.headers["X-Cache-Key"]
    client = aioredis.Redis.from_url(redis_url)
    await client.set(key, b"TE\x09garbage-from-a-future-version")
    await client.aclose()
    resp = await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert resp.headers["Cache-Status"].startswith("tokenedge; fwd=miss; stored")
    assert fake.calls["chat"] == 2


async def test_a_value_read_again_is_decoded_once_and_a_changed_or_deleted_one_never_reused(
    redis_url: str,
) -> None:
    tier = RedisTier(redis_url, timeout_s=1.0, retry_after_s=1.0, clock=time.time, on_error=lambda: None)
    try:
        first = entry(created_at=time.time())
        await tier.set(first, await tier.epoch(first.key, first.tags))
        read = await tier.get(first.key)
        assert read == first
        assert await tier.get(first.key) is read  # the same bytes again: the decoded entry, not a new decode
        second = replace(first, body=b'{"id":"y","choices":[]}', created_at=first.created_at + 1)
        await tier.set(
            second, await tier.epoch(first.key, first.tags)
        )  # re-stored under the same key: other bytes, decoded anew
        assert await tier.get(first.key) == second
        await tier.delete([first.key])
        assert await tier.get(first.key) is None
    finally:
        await tier.close()


def tagged(i: int, *tags: str) -> Entry:
    base = entry(created_at=time.time())
    return replace(base, key=f"{base.key[:-4]}{i:04d}", tags=tags)


async def test_a_store_whose_epoch_moved_is_neither_written_nor_indexed(redis_url: str) -> None:
    refused: list[str] = []
    tier = RedisTier(
        redis_url,
        timeout_s=1.0,
        retry_after_s=1.0,
        clock=time.time,
        on_error=lambda: None,
        on_refusal=refused.append,
    )
    client = aioredis.Redis.from_url(redis_url)
    try:
        late, fresh = tagged(1, "model:m"), tagged(2, "model:m")
        before = await tier.epoch(late.key, late.tags)  # '' : no purge ever ran
        await tier.purge_tags(["model:other"])  # any purge moves the one epoch
        assert not await tier.set(late, before)
        assert refused == ["purged"]
        assert await client.exists(late.key) == 0 and await client.smembers(TAG_PREFIX + "model:m") == set()
        assert await tier.set(fresh, await tier.epoch(fresh.key, fresh.tags))
        await client.delete(
            EPOCH_KEY
        )  # evicted: a purge recreates it at a random value, never back at `taken`
        taken = await tier.epoch(fresh.key, fresh.tags)
        await tier.delete(["te1:pub:nothing"])
        assert await tier.epoch(fresh.key, fresh.tags) not in ("", taken)
        assert not await tier.set(fresh, taken)
    finally:
        await client.aclose()
        await tier.close()


async def test_a_tag_purge_deletes_every_member_and_the_tag_sets_in_one_script(redis_url: str) -> None:
    tier = RedisTier(redis_url, timeout_s=5.0, retry_after_s=1.0, clock=time.time, on_error=lambda: None)
    client = aioredis.Redis.from_url(redis_url)
    try:
        entries = [tagged(i, "tenant:a" if i % 2 else "tenant:b", "model:m") for i in range(2500)]
        await tier.purge_tags(["model:nothing"])  # the script is loaded (a first EVALSHA may find it absent)
        epoch = await tier.epoch(entries[0].key, ())
        for e in entries:
            assert await tier.set(e, epoch)
        await client.config_resetstat()
        count, keys = await tier.purge_tags(["tenant:a", "model:nothing"])
        calls = {name: stat["calls"] for name, stat in (await client.info("commandstats")).items()}
        assert calls["cmdstat_evalsha"] == 1  # one script did it all: its DELs ran inside, in one step
        assert calls["cmdstat_sunion"] == 1 and calls["cmdstat_del"] == 3 and calls["cmdstat_incr"] == 1
        assert count == 1250 and keys == sorted(e.key for e in entries if e.tags[0] == "tenant:a")
        assert await client.exists(TAG_PREFIX + "tenant:a") == 0
        left = await client.exists(*(e.key for e in entries))  # 1,250 deleted, in DELs of at most 1,000
        assert left == 1250
        count, _ = await tier.purge_tags(["model:m"])
        assert count == 1250
        many = [f"te1:pub:{i:064x}" for i in range(10_000)]  # /admin/purge's most keys, more than Lua unpacks
        assert await tier.delete(many) == 0
        assert sorted(await client.keys()) == [EPOCH_KEY.encode(), (TAG_PREFIX + "tenant:b").encode()]
    finally:
        await client.aclose()
        await tier.close()
