"""L2 on a real Redis Cluster (3 masters + 3 replicas started by the test): hits, batched reads, purge by key and
tag across slots, leases, and a master killed and failed over with no failed client request."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from gateway.misses.warm import hot_record_of
from gateway.tiers.redis_cluster import RedisClusterTier, stored_name
from harness.gateway import FakeClock, RunningGateway
from tests.gateway.conftest import AUTH_A, CHAT, LOADED_UPSTREAM, GatewayFactory
from tests.support.cluster import LocalCluster
from tests.support.fake_upstream import FakeUpstream

ADMIN = {"Authorization": "Bearer admin-secret"}


# The tests of a healthy cluster (slots, batching, purges, warm-up) give Redis a generous timeout: a slow command
# on a loaded machine would otherwise open the tier's breaker and test the degradation instead, which the
# failover test below does on purpose, with the default timeout.
HEALTHY = {"redis_timeout_s": 5.0}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    running = LocalCluster(masters=3, replicas_per_master=1)
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def cluster_url(cluster: LocalCluster) -> str:
    for node in cluster.masters():
        client = node.client()
        client.flushall()
        client.close()
    return cluster.url


def ask(i: int) -> dict[str, Any]:
    return {**CHAT, "messages": [{"role": "user", "content": f"question {i}"}]}


def masters_holding(cluster: LocalCluster, keys: list[str]) -> int:
    """How many masters hold at least one of the keys (so a test knows its keys really spread)."""
    held = 0
    for node in cluster.masters():
        client = node.client()
        try:
            held += any(_held_here(client, k) for k in keys)
        finally:
            client.close()
    return held


def _held_here(client: redis.Redis, key: str) -> bool:
    try:
        return bool(client.exists(stored_name(key)))
    except redis.ResponseError:  # MOVED: another master owns the slot
        return False


async def test_l1_and_l2_hits_across_gateways_on_a_cluster(
    make_gateway: GatewayFactory, fake: FakeUpstream, cluster_url: str, cluster: LocalCluster
) -> None:
    one = await make_gateway(cache={"redis_url": cluster_url, **HEALTHY})
    two = await make_gateway(cache={"redis_url": cluster_url, **HEALTHY})
    keys: list[str] = []
    while len(keys) < 96 and (len(keys) < 12 or masters_holding(cluster, keys) < 3):
        # Keys hash with this run's scope secret: ask until the entries really span every master (12 usually do).
        first = await one.client.post("/v1/chat/completions", json=ask(len(keys)), headers=AUTH_A)
        assert first.status == 200
        keys.append(first.headers["X-Cache-Key"])
    assert masters_holding(cluster, keys) == 3
    for i in range(len(keys)):
        from_l2 = await two.client.post("/v1/chat/completions", json=ask(i), headers=AUTH_A)
        assert from_l2.headers["Cache-Status"].endswith("detail=l2")
        from_l1 = await two.client.post("/v1/chat/completions", json=ask(i), headers=AUTH_A)
        assert from_l1.headers["Cache-Status"].endswith("detail=l1")
    assert fake.calls["chat"] == len(keys)


async def test_warm_up_on_a_cluster_fills_a_new_replica_from_the_hot_record(
    make_gateway: GatewayFactory, fake: FakeUpstream, cluster_url: str, cluster: LocalCluster
) -> None:
    one = await make_gateway(cache={"redis_url": cluster_url, **HEALTHY})
    for i in range(
        6
    ):  # anonymous: these requests are kept for `gateway warm`, and their entries span the masters
        assert (await one.client.post("/v1/chat/completions", json=ask(i))).status == 200
    record = hot_record_of(one.state)
    assert record is not None
    await record.flush()  # the record's keys share one hash tag: one slot, one script call
    assert len(await record.top(10)) == 6
    assert all(r is not None for r in await record.requests(await record.top(10)))
    two = await make_gateway(cache={"redis_url": cluster_url, **HEALTHY})
    warmup = two.state.warmup
    assert warmup is not None
    await warmup.done.wait()
    assert (warmup.outcome, warmup.filled) == ("filled", 6)
    for i in range(6):
        first = await two.client.post("/v1/chat/completions", json=ask(i))
        assert first.headers["Cache-Status"].endswith("detail=l1")
    assert fake.calls["chat"] == 6


async def test_a_batch_of_reads_is_one_batched_call_over_every_node(
    make_gateway: GatewayFactory, cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = await make_gateway(cache={"redis_url": cluster_url, "l1_max_bytes": 0, **HEALTHY})
    keys = []
    for i in range(12):
        resp = await gw.client.post("/v1/chat/completions", json=ask(i), headers=AUTH_A)
        keys.append(resp.headers["X-Cache-Key"])
    tier = gw.state.cache.l2
    assert isinstance(tier, RedisClusterTier)
    batches: list[int] = []
    original = tier._mget

    async def counting(batch: list[str]) -> list[bytes | None]:
        batches.append(len(batch))
        return await original(batch)

    monkeypatch.setattr(tier, "_mget", counting)
    entries = await tier.get_many([*keys, "te1:tnone:missing"])
    assert [e.key if e else None for e in entries] == [*keys, None]
    assert batches == [13]  # one batched read (one pipeline per node), not one per key


async def test_purge_by_key_and_by_tag_across_slots(
    make_gateway: GatewayFactory, fake: FakeUpstream, cluster_url: str
) -> None:
    gw = await make_gateway(
        cache={"redis_url": cluster_url, "l1_max_bytes": 0, **HEALTHY}, server={"admin_token": "admin-secret"}
    )
    keys = [
        (await gw.client.post("/v1/chat/completions", json=ask(i), headers=AUTH_A)).headers["X-Cache-Key"]
        for i in range(6)
    ]
    by_key = await gw.client.post("/admin/purge", json={"keys": keys[:2]}, headers=ADMIN)
    assert (await by_key.json())["purged"]["l2"] == 2
    for i in range(6):
        resp = await gw.client.post("/v1/chat/completions", json=ask(i), headers=AUTH_A)
        assert resp.headers["Cache-Status"].startswith("tokenedge; fwd=miss" if i < 2 else "tokenedge; hit")
    by_tag = await gw.client.post("/admin/purge", json={"tags": ["model:test-model"]}, headers=ADMIN)
    assert (await by_tag.json())["purged"]["l2"] == 6
    for i in range(6):
        resp = await gw.client.post("/v1/chat/completions", json=ask(i), headers=AUTH_A)
        assert resp.headers["Cache-Status"].startswith("tokenedge; fwd=miss")
    assert fake.calls["chat"] == 14


async def test_concurrent_misses_on_two_gateways_share_one_call_through_cluster_leases(
    make_gateway: GatewayFactory, fake: FakeUpstream, cluster_url: str
) -> None:
    fake.gate = asyncio.Event()
    one = await make_gateway(cache={"redis_url": cluster_url, **HEALTHY}, upstream=LOADED_UPSTREAM)
    two = await make_gateway(cache={"redis_url": cluster_url, **HEALTHY}, upstream=LOADED_UPSTREAM)
    first = asyncio.ensure_future(one.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A))
    await fake.entered.wait()
    second = asyncio.ensure_future(two.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A))
    for _ in range(500):  # bounded: until the second gateway is parked on the lease
        if any(
            s.labels.get("outcome") == "wait" and s.value >= 1
            for m in two.state.metrics.registry.collect()
            for s in m.samples
            if s.name == "tokenedge_lease_total"
        ):
            break
        await asyncio.sleep(0.01)
    fake.gate.set()
    a, b = await asyncio.gather(first, second)
    assert (await a.read()) == (await b.read())
    assert (a.status, b.status) == (200, 200)
    assert "collapsed" in b.headers["Cache-Status"]
    assert fake.calls["chat"] == 1


async def test_a_master_killed_and_failed_over_fails_no_request(
    make_gateway: GatewayFactory,
    fake: FakeUpstream,
    cluster_url: str,
    cluster: LocalCluster,
    clock: FakeClock,
) -> None:
    gw = await make_gateway(cache={"redis_url": cluster_url, "l1_max_bytes": 0, "redis_retry_after_s": 0.5})
    for i in range(12):
        assert (await gw.client.post("/v1/chat/completions", json=ask(i), headers=AUTH_A)).status == 200
    victim = cluster.masters()[0]
    victim.kill()
    statuses = []
    survivors = [n for n in cluster.nodes if n.proc is not None]
    for round_ in range(400):  # requests keep flowing while the replica is promoted (bounded)
        for i in range(12):
            resp = await gw.client.post("/v1/chat/completions", json=ask(i), headers=AUTH_A)
            statuses.append(resp.status)
        clock.advance(1.0)  # past the breaker window: the next request tries the cluster again
        if round_ >= 1 and len(cluster.masters()) == 3 and all(LocalCluster._ok(n) for n in survivors):
            break  # the victim's replica was promoted and the cluster says ok again
        await asyncio.sleep(0.05)
    cluster.wait_ok(survivors)
    assert set(statuses) == {200}  # 0 failed client requests through the outage and the failover
    assert l2_errors(gw) >= 1  # the outage was real: L2 calls failed and degraded
    for i in range(12):  # after the failover the client follows the new slot map: every key hits L2 again
        for _ in range(100):  # bounded; a miss refills the key, so two tries suffice once the map is re-read
            clock.advance(1.0)
            resp = await gw.client.post("/v1/chat/completions", json=ask(i), headers=AUTH_A)
            assert resp.status == 200
            if resp.headers["Cache-Status"].startswith("tokenedge; hit"):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"key {i} never hit L2 after the failover: {resp.headers['Cache-Status']}")


def l2_errors(gw: RunningGateway) -> float:
    return sum(
        s.value
        for m in gw.state.metrics.registry.collect()
        for s in m.samples
        if s.name == "tokenedge_cache_errors_total" and s.labels.get("tier") == "l2"
    )


async def test_a_key_its_tag_sets_and_its_epoch_share_a_slot_and_purges_run_per_bucket(
    cluster_url: str,
) -> None:
    """P1, P2 (docs/coherence.md) on a cluster: one bucket is one slot, so the single-node scripts run per bucket."""
    import time
    from dataclasses import replace

    from gateway.tiers.redis_cluster import BUCKETS, cluster_client
    from tests.gateway.test_entry import entry

    tier = RedisClusterTier(
        cluster_url, timeout_s=5.0, retry_after_s=1.0, clock=time.time, on_error=lambda: None
    )
    client = cluster_client(cluster_url, timeout_s=5.0)
    try:
        base = entry(created_at=time.time())
        one, two = (replace(base, key=f"te1:pub:{i:064x}", tags=("model:m", f"key:{i}")) for i in (1, 2))
        assert tier.epoch_key(one.key) != tier.epoch_key(two.key)  # these two keys fall in different buckets
        names = [tier.stored_name(one.key), tier.epoch_key(one.key), tier.tag_key(one.key, "model:m")]
        assert len({await client.cluster_keyslot(name) for name in names}) == 1
        taken = {e.key: await tier.epoch(e.key, e.tags) for e in (one, two)}
        await tier.delete([one.key])  # moves one's bucket only
        assert not await tier.set(one, taken[one.key])
        assert await tier.set(two, taken[two.key])
        count, keys = await tier.purge_tags(["model:m"])  # every bucket: one script each
        assert (count, keys) == (1, [two.key])
        assert await tier.get(two.key) is None and not await tier.set(two, taken[two.key])
        epochs = await client.mget_nonatomic([f"te1:epoch:{{b{b}}}" for b in range(BUCKETS)])
        assert all(value is not None for value in epochs)  # a tag purge moved every bucket's epoch
    finally:
        await client.aclose()
        await tier.close()
