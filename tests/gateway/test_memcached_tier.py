"""L2 against a real memcached: sharing across gateways, purge by key and by tag (namespace versioning), stores
under the tag versions of their start (P2 of docs/coherence.md), oversize refusal, the L1 lifetime cap that bounds cross-worker staleness, and a crash under load."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from harness.gateway import FakeClock, RunningGateway
from harness.services import MemcachedServer
from harness.workers import gateway_workers
from tests.gateway.conftest import AUTH_A, AUTH_B, CHAT, GatewayFactory
from tests.gateway.test_redis_tier import sample
from tests.support.fake_upstream import FakeUpstream

ADMIN = {"Authorization": "Bearer admin-secret"}
OTHER = {**CHAT, "messages": [{"role": "user", "content": "other"}]}


def mc(server: MemcachedServer, **extra: Any) -> dict[str, Any]:
    return {"l2": "memcached", "memcached_servers": [server.server], **extra}


async def status(gw: RunningGateway, body: dict[str, Any], headers: dict[str, str] = AUTH_A) -> str:
    resp = await gw.client.post("/v1/chat/completions", json=body, headers=headers)
    assert resp.status == 200
    await resp.read()
    return resp.headers["Cache-Status"]


async def test_l2_is_shared_between_gateways_and_backfills_l1(
    make_gateway: GatewayFactory, fake: FakeUpstream, memcached: MemcachedServer
) -> None:
    one = await make_gateway(cache=mc(memcached))
    two = await make_gateway(cache=mc(memcached))
    first = await one.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    from_l2 = await two.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    from_l1 = await two.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert from_l2.headers["Cache-Status"].endswith("detail=l2")
    assert from_l1.headers["Cache-Status"].endswith("detail=l1")
    assert await from_l2.read() == await first.read()
    assert fake.calls["chat"] == 1
    assert sample(two, "tokenedge_cache_lookups_total", tier="l2", outcome="hit") == 1


async def test_two_worker_processes_share_entries_through_memcached(
    upstream_url: str, fake: FakeUpstream, memcached: MemcachedServer
) -> None:
    env = {"TOKENEDGE_CACHE_L2": "memcached", "TOKENEDGE_CACHE_MEMCACHED_SERVERS": memcached.server}
    statuses = []
    async with gateway_workers(upstream_url, 2, env) as url:
        for _ in range(16):  # a fresh connection each time, so the kernel spreads them over both workers
            async with (
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
                session.post(f"{url}/v1/chat/completions", json=CHAT, headers=AUTH_A) as resp,
            ):
                assert resp.status == 200
                statuses.append(resp.headers["Cache-Status"])
    assert fake.calls["chat"] == 1  # one worker filled; the other read the entry from Memcached
    assert sum(s.endswith("detail=l2") for s in statuses) >= 1
    assert sum("fwd=miss" in s for s in statuses) == 1


async def test_another_tenants_request_never_reads_the_entry(
    make_gateway: GatewayFactory, fake: FakeUpstream, memcached: MemcachedServer
) -> None:
    one = await make_gateway(cache=mc(memcached))
    two = await make_gateway(cache=mc(memcached))
    await status(one, CHAT, AUTH_A)
    assert (await status(two, CHAT, AUTH_B)).startswith("tokenedge; fwd=miss")
    assert fake.calls["chat"] == 2


async def test_purge_by_key_deletes_it_for_every_gateway(
    make_gateway: GatewayFactory, fake: FakeUpstream, memcached: MemcachedServer
) -> None:
    one = await make_gateway(cache=mc(memcached), server={"admin_token": "admin-secret"})
    two = await make_gateway(cache=mc(memcached, memcached_l1_max_age_s=0))
    first = await one.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    await status(one, OTHER)
    purged = await one.client.post(
        "/admin/purge", json={"keys": [first.headers["X-Cache-Key"]]}, headers=ADMIN
    )
    assert (await purged.json())["purged"] == {"l1": 1, "l2": 1}
    assert (await status(two, CHAT)).startswith("tokenedge; fwd=miss")
    assert (await status(two, OTHER)).endswith("detail=l2")  # only the purged key is gone
    assert fake.calls["chat"] == 3


async def test_purge_by_tag_bumps_its_version_and_spares_other_tags(
    make_gateway: GatewayFactory, fake: FakeUpstream, memcached: MemcachedServer
) -> None:
    one = await make_gateway(cache=mc(memcached), server={"admin_token": "admin-secret"})
    two = await make_gateway(cache=mc(memcached, memcached_l1_max_age_s=0))
    a = await one.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    await status(one, OTHER, AUTH_A)
    await status(one, CHAT, AUTH_B)
    assert (await status(two, CHAT, AUTH_A)).endswith("detail=l2")  # two has now seen the model/rev tags
    tenant_tag = next(t for t in a.headers["Surrogate-Key"].split() if t.startswith("tenant:"))
    purged = await one.client.post("/admin/purge", json={"tags": [tenant_tag]}, headers=ADMIN)
    assert (await purged.json())["purged"] == {"l1": 2, "l2": 1}  # L2 counts the tags invalidated
    assert (await status(two, CHAT, AUTH_A)).startswith("tokenedge; fwd=miss")
    assert (await status(two, OTHER, AUTH_A)).startswith("tokenedge; fwd=miss")
    assert (await status(two, CHAT, AUTH_B)).endswith("detail=l2")  # tenant B's entry carries no purged tag
    assert fake.calls["chat"] == 5


async def test_purge_by_model_tag_reaches_a_gateway_that_never_saw_the_tag(
    make_gateway: GatewayFactory, fake: FakeUpstream, memcached: MemcachedServer
) -> None:
    one = await make_gateway(cache=mc(memcached), server={"admin_token": "admin-secret"})
    await status(one, CHAT)
    await one.client.post("/admin/purge", json={"tags": ["model:test-model"]}, headers=ADMIN)
    fresh = await make_gateway(cache=mc(memcached, memcached_l1_max_age_s=0))
    assert (await status(fresh, CHAT)).startswith("tokenedge; fwd=miss")
    assert (await status(fresh, CHAT)).endswith("detail=l2")  # re-stored under the new version
    assert fake.calls["chat"] == 2


async def big_stream(gw: RunningGateway) -> str:
    resp = await gw.client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH_A)
    assert resp.status == 200
    assert (await resp.read()).endswith(b"data: [DONE]\n\n")
    return resp.headers["Cache-Status"]


async def test_an_entry_over_the_item_limit_is_refused_and_counted(
    make_gateway: GatewayFactory, fake: FakeUpstream, memcached: MemcachedServer
) -> None:
    fake.stream_pieces = ["y" * 200_000] * 3  # body + recorded chunks: about 1.2 MB, over memcached's 1 MiB
    gw = await make_gateway(cache=mc(memcached, memcached_l1_max_age_s=0))
    for _ in range(2):
        assert (await big_stream(gw)).startswith("tokenedge; fwd=miss")
    assert sample(gw, "tokenedge_cache_store_refusals_total", tier="l2", reason="too_large") == 2
    assert sample(gw, "tokenedge_cache_errors_total", tier="l2") == 0  # a refusal is not an outage
    fake.stream_pieces = ["small"]
    assert (await status(gw, OTHER)).startswith("tokenedge; fwd=miss")
    assert (await status(gw, OTHER)).endswith("detail=l2")  # entries under the limit still go through
    assert fake.calls["chat"] == 3


async def test_a_server_with_a_smaller_item_limit_refuses_without_tripping_the_breaker(
    make_gateway: GatewayFactory, fake: FakeUpstream, memcached: MemcachedServer
) -> None:
    fake.stream_pieces = ["y" * 200_000] * 3
    # configured above the server's real -I (1 MiB): memcached itself answers "object too large"
    gw = await make_gateway(cache=mc(memcached, memcached_l1_max_age_s=0, memcached_max_item_bytes=4 << 20))
    assert (await big_stream(gw)).startswith("tokenedge; fwd=miss")
    assert sample(gw, "tokenedge_cache_store_refusals_total", tier="l2", reason="server_refused") == 1
    assert sample(gw, "tokenedge_cache_errors_total", tier="l2") == 0
    assert gw.state.cache.l2 is not None and gw.state.cache.l2.available


async def test_l1_lifetime_is_capped_so_another_gateways_purge_is_seen(
    make_gateway: GatewayFactory, fake: FakeUpstream, memcached: MemcachedServer, clock: FakeClock
) -> None:
    one = await make_gateway(cache=mc(memcached), server={"admin_token": "admin-secret"})
    two = await make_gateway(cache=mc(memcached, memcached_l1_max_age_s=2.0))
    first = await one.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert (await status(two, CHAT)).endswith("detail=l2")
    await one.client.post("/admin/purge", json={"keys": [first.headers["X-Cache-Key"]]}, headers=ADMIN)
    assert (await status(two, CHAT)).endswith("detail=l1")  # inside the documented bound
    clock.advance(2.5)
    assert (await status(two, CHAT)).startswith("tokenedge; fwd=miss")
    assert fake.calls["chat"] == 2


async def test_memcached_crash_and_restart_under_load_fails_no_request(
    make_gateway: GatewayFactory, fake: FakeUpstream, memcached: MemcachedServer
) -> None:
    gw = await make_gateway(cache=mc(memcached, memcached_l1_max_age_s=0, memcached_retry_after_s=0))
    bodies = [{**CHAT, "messages": [{"role": "user", "content": f"load {i % 8}"}]} for i in range(240)]
    done = 0
    progress = asyncio.Condition()

    async def client(mine: list[dict[str, Any]]) -> list[int]:
        nonlocal done
        codes = []
        for body in mine:
            resp = await gw.client.post("/v1/chat/completions", json=body, headers=AUTH_A)
            await resp.read()
            codes.append(resp.status)
            async with progress:
                done += 1
                progress.notify_all()
        return codes

    async def reached(n: int) -> None:
        async with progress:
            await progress.wait_for(lambda: done >= n)

    load = asyncio.gather(*(client(bodies[i::8]) for i in range(8)))
    await reached(60)
    memcached.kill()
    await reached(120)
    memcached.start()
    codes = [c for per_client in await load for c in per_client]
    assert codes == [200] * len(bodies)
    assert sample(gw, "tokenedge_cache_errors_total", tier="l2") >= 1
    assert sample(gw, "tokenedge_cache_lookups_total", tier="l2", outcome="error") >= 1
    await status(gw, CHAT)
    assert (await status(gw, CHAT)).endswith("detail=l2")  # back without a gateway restart


async def test_purging_a_tag_nothing_carries_is_a_no_op_not_an_error(
    make_gateway: GatewayFactory, memcached: MemcachedServer
) -> None:
    gw = await make_gateway(cache=mc(memcached), server={"admin_token": "admin-secret"})
    resp = await gw.client.post("/admin/purge", json={"tags": ["model:never-served"]}, headers=ADMIN)
    assert (await resp.json())["purged"] == {"l1": 0, "l2": 0}
    assert sample(gw, "tokenedge_cache_errors_total", tier="l2") == 0


async def test_keys_spread_over_servers_and_a_tag_purge_reaches_every_server(
    make_gateway: GatewayFactory, fake: FakeUpstream, memcached: MemcachedServer
) -> None:
    second = MemcachedServer()
    second.start()
    try:
        servers = [memcached.server, second.server]
        cache = {"l2": "memcached", "memcached_servers": servers, "memcached_l1_max_age_s": 0}
        one = await make_gateway(cache=cache, server={"admin_token": "admin-secret"})
        two = await make_gateway(cache=cache)
        bodies = [{**CHAT, "messages": [{"role": "user", "content": f"spread {i}"}]} for i in range(12)]
        for body in bodies:
            await status(one, body)
        assert all(s.endswith("detail=l2") for s in [await status(two, body) for body in bodies])
        stats = await asyncio.gather(*(_items(s) for s in (memcached, second)))
        assert all(n > 0 for n in stats)  # both servers hold entries
        await one.client.post("/admin/purge", json={"tags": ["model:test-model"]}, headers=ADMIN)
        assert all(s.startswith("tokenedge; fwd=miss") for s in [await status(two, body) for body in bodies])
        assert fake.calls["chat"] == 24
    finally:
        second.kill()


async def _items(server: MemcachedServer) -> int:
    import aiomcache

    client = aiomcache.Client("127.0.0.1", server.port)
    try:
        return int((await client.stats())[b"curr_items"] or 0)
    finally:
        await client.close()


async def test_a_server_closing_mid_command_degrades_instead_of_hanging() -> None:
    """aiomcache alone spins on EOF in simple commands (delete, incr, set); the tier's client raises instead."""
    from gateway.tiers.base import L2Unavailable
    from gateway.tiers.memcached_tier import MemcachedTier

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    errors: list[int] = []
    tier = MemcachedTier(
        [f"127.0.0.1:{port}"],
        timeout_s=5.0,
        retry_after_s=0,
        max_item_bytes=1 << 20,
        clock=lambda: 0.0,
        on_error=lambda: errors.append(1),
        on_refusal=lambda _r: None,
    )
    try:
        with pytest.raises(L2Unavailable):
            await asyncio.wait_for(
                tier.delete(["te1:pub:" + "0" * 64]), 10
            )  # a hang would fail here, not pass
        assert errors == [1]
    finally:
        await tier.close()
        server.close()


async def test_a_store_records_the_tag_versions_of_its_start_so_a_purge_since_is_never_undone(
    memcached: MemcachedServer,
) -> None:
    """P2 (docs/coherence.md): the versions come from `epoch`, taken before the upstream call, not from the store."""
    import time
    from dataclasses import replace

    from gateway.tiers.memcached_tier import MemcachedTier
    from tests.gateway.test_entry import entry

    refused: list[str] = []
    tier = MemcachedTier(
        [memcached.server],
        timeout_s=5.0,
        retry_after_s=1.0,
        max_item_bytes=1 << 20,
        clock=time.time,
        on_error=lambda: None,
        on_refusal=refused.append,
    )
    try:
        one = entry(created_at=time.time())
        one = replace(one, tags=("model:m", "tenant:pub", "key:" + one.key.rsplit(":", 1)[1]))
        for purge in (tier.purge_tags(["model:m"]), tier.delete([one.key])):
            taken = await tier.epoch(one.key, one.tags)
            await purge  # lands while the upstream answers
            assert await tier.set(one, taken)  # written, under the versions of before the purge
            assert await tier.get(one.key) is None  # so no read ever validates it
        assert await tier.set(one, await tier.epoch(one.key, one.tags))  # a fill begun after the purge
        assert await tier.get(one.key) == one
        assert not await tier.set(replace(one, tags=("model:other",)), await tier.epoch(one.key, one.tags))
        assert refused == ["untagged"]  # a ticket for other tags says nothing about those: refused
    finally:
        await tier.close()
