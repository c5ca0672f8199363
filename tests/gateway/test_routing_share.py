"""Placement shared across workers and replicas (gateway/upstream/routing/share.py, gateway/tiers/placement.py).

End to end: two gateway replicas (separate processes) on one real redis-server, in front of two fake prefix-cache
engines (harness/prefix_backend.py, each its own process): prefixes placed through the first replica are routed by
the second to the same engines. The mutation check runs it with sharing off: the second replica then places them on
its own (its smooth round-robin, shifted by one request) and every one lands on the other engine. Redis stopped
mid-run: no request fails and the replica routes on its own table. Two workers (`--workers 2`, connections spread by
the kernel) reach the reuse of one within 5%. In process, with a store in memory: what is written and read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway.upstream.routing.affinity import AffinityTable, checkpoints, text_chain
from gateway.upstream.routing.attempt import BACKEND_HEADER
from gateway.upstream.routing.share import KEY_PREFIX, SharedPlacement, StoreError
from harness.conversations import BackendProc, chat_body, prefix_backends, stats
from harness.replicas import replicas, start_replica, stop_replica
from harness.services import RedisServer
from harness.workers import gateway_workers

BACKEND_ARGS = ("--capacity", "8192", "--prefill-us", "20", "--base-ms", "5")
GROUPS = 6
AUTH = {"Authorization": "Bearer share-test"}


def system(g: int) -> str:
    return (f"Group {g} rules: answer as team {g} does, citing handbook chapter {g}. " * 12)[:640]


def messages(g: int, q: int, run: str = "") -> list[dict[str, str]]:
    """Group g's system prompt and question q (`run` keeps runs' questions apart: an answer cached in the shared
    L2 by one run would be a hit in the next, and never reach an engine)."""
    question = f"{run}question {q} for group {g}"
    return [{"role": "system", "content": system(g)}, {"role": "user", "content": question}]


def env(redis_url: str, **extra: str) -> dict[str, str]:
    return {
        "TOKENEDGE_CACHE_REDIS_URL": redis_url,
        "TOKENEDGE_UPSTREAM_HEALTH_INTERVAL_S": "0.2",
        "TOKENEDGE_UPSTREAM_PLACEMENT_WAIT_S": "0.5",  # generous: the box is shared; the default is 20 ms
        **extra,
    }


async def ask(session: aiohttp.ClientSession, url: str, msgs: list[dict[str, str]]) -> str:
    """The engine that answered (the route header); any non-200 fails the test."""
    async with session.post(url + "/v1/chat/completions", json=chat_body(msgs), headers=AUTH) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        return resp.headers[BACKEND_HEADER]


async def placement_count(session: aiohttp.ClientSession, url: str, op: str, outcome: str) -> float:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    line = f'tokenedge_routing_placement_total{{op="{op}",outcome="{outcome}"}} '
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(line))


@pytest.fixture
async def engines() -> AsyncIterator[list[BackendProc]]:
    async with prefix_backends(2, *BACKEND_ARGS) as started:
        yield started


@pytest.mark.parametrize("shared", [True, False])
async def test_a_second_replica_routes_a_shared_prefix_to_the_engine_the_first_placed_it_on(
    redis_url: str, engines: list[BackendProc], shared: bool
) -> None:
    upstream = ",".join(e.url for e in engines)
    flag = {"TOKENEDGE_UPSTREAM_SHARE_PLACEMENT": "true" if shared else "false"}
    async with (
        replicas(upstream, 2, env(redis_url, **flag)) as (first, second),
        aiohttp.ClientSession() as session,
    ):
        placed = [await ask(session, first.url, messages(g, 0)) for g in range(GROUPS)]
        await ask(session, second.url, [{"role": "user", "content": "an unrelated prompt " * 20}])
        followed = [await ask(session, second.url, messages(g, 1)) for g in range(GROUPS)]
        hits = await placement_count(session, second.url, "read", "hit")
    assert len(set(placed)) == 2  # the first replica spread the new prefixes over both engines
    same = sum(p == f for p, f in zip(placed, followed, strict=True))
    if shared:
        assert same == GROUPS and hits >= GROUPS
    else:  # the mutation: on its own, the second replica's round-robin puts every group on the other engine
        assert same == 0 and hits == 0


async def test_redis_stopped_mid_run_degrades_to_local_placement_without_errors(
    redis_server: RedisServer, redis_url: str, engines: list[BackendProc]
) -> None:
    replica = await start_replica(",".join(e.url for e in engines), env(redis_url))
    try:
        async with aiohttp.ClientSession() as session:
            before = [await ask(session, replica.url, messages(g, 0)) for g in range(GROUPS)]
            redis_server.stop()
            after = [await ask(session, replica.url, messages(g, 1)) for g in range(GROUPS)]
            new = [await ask(session, replica.url, messages(g, 0)) for g in range(GROUPS, GROUPS + 2)]
            failed = await placement_count(session, replica.url, "read", "error")
            skipped = await placement_count(session, replica.url, "read", "skipped")
    finally:
        await stop_replica(replica)
        redis_server.start()
    assert after == before  # each group stays on its engine: the local table still knows
    assert len(set(new)) == 2  # new prefixes still spread
    assert failed >= 1 and failed + skipped >= 2  # the failure was seen, then reads were skipped a while


async def _reuse(upstream: str, engines: list[BackendProc], workers: int, extra: Mapping[str, str]) -> float:
    """Prefix-hit share of the engines' prompt tokens for 8 groups x 4 questions, two at a time, each request on a
    new connection (so the kernel spreads them over the workers), in a fixed interleaved order."""
    async with aiohttp.ClientSession() as session:
        await stats(session, engines, reset=True)
        async with gateway_workers(upstream, workers, extra) as url:
            order = [(g, q) for q in range(4) for g in range(8)]
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector) as fresh:
                for i in range(0, len(order), 2):
                    await asyncio.gather(
                        *(
                            ask(fresh, url, messages(g, q, f"{workers} workers: "))
                            for g, q in order[i : i + 2]
                        )
                    )
        counts = await stats(session, engines)
    return sum(c["hit_tokens"] for c in counts) / sum(c["prompt_tokens"] for c in counts)


async def test_two_workers_reach_the_reuse_of_one(redis_url: str, engines: list[BackendProc]) -> None:
    upstream = ",".join(e.url for e in engines)
    one = await _reuse(upstream, engines, 1, env(redis_url))
    two = await _reuse(upstream, engines, 2, env(redis_url))
    print(f"prefix reuse: one worker {one:.3f}, two workers {two:.3f}")
    assert two >= 0.95 * one


class MemoryStore:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.writes = 0
        self.gate: asyncio.Event | None = None  # set: reads wait for it
        self.broken = False

    async def read(self, keys: Sequence[str]) -> list[bytes | None]:
        if self.gate is not None:
            await self.gate.wait()
        if self.broken:
            raise StoreError("down")
        return [self.data.get(k) for k in keys]

    async def write(self, items: Mapping[str, bytes], ttl_s: float) -> None:
        if self.broken:
            raise StoreError("down")
        self.writes += 1
        self.data.update(items)

    async def close(self) -> None:
        return None


def shared(store: MemoryStore, clock: list[float]) -> SharedPlacement:
    outcomes = Counter("p", "p", ["op", "outcome"], registry=CollectorRegistry())
    return SharedPlacement(
        store,
        ["a", "b"],
        ttl_s=60.0,
        wait_s=0.05,
        retry_after_s=1.0,
        outcomes=outcomes,
        clock=lambda: clock[0],
    )


async def test_checkpoints_are_written_once_per_half_ttl_and_read_into_the_table() -> None:
    store, clock = MemoryStore(), [1000.0]
    writer = shared(store, clock)
    chain = text_chain("p" * 64 * 40, 64)  # 40 blocks: 15 + 8 + 3 checkpoints
    writer.publish(chain, 1)
    await writer.flush()
    assert len(store.data) == len(checkpoints(40)) == 26 and all(k.startswith(KEY_PREFIX) for k in store.data)
    writer.publish(chain, 1)  # again within half the TTL: nothing new to send
    await writer.flush()
    assert store.writes == 1
    clock[0] += 31.0
    writer.publish(chain, 1)
    await writer.flush()
    assert store.writes == 2
    reader, table = shared(store, clock), AffinityTable(1000)
    await reader.learn(chain + text_chain("q" * 640, 64), table)  # a longer prompt sharing the 40 blocks
    assert table.depths(chain, [0, 1]) == {0: 0, 1: 40}
    clock[0] += 1.0
    reader.ejected(1)  # b came back empty: what was published before is not trusted
    fresh = AffinityTable(1000)
    await reader.learn(chain, fresh)
    assert fresh.depths(chain, [0, 1]) == {0: 0, 1: 0}


async def test_a_late_read_is_not_waited_for_but_still_teaches_and_a_broken_store_turns_sharing_off() -> None:
    store, clock = MemoryStore(), [1000.0]
    chain = text_chain("r" * 64 * 20, 64)
    writer = shared(store, clock)
    writer.publish(chain, 0)
    await writer.flush()
    store.gate = asyncio.Event()
    reader, table = shared(store, clock), AffinityTable(1000)
    await reader.learn(chain, table)  # returns after wait_s: the read is still out
    assert table.depths(chain, [0, 1])[0] == 0
    store.gate.set()
    for _ in range(100):  # the late answer lands (bounded)
        if table.depths(chain, [0, 1])[0]:
            break
        await asyncio.sleep(0.01)
    assert table.depths(chain, [0, 1])[0] == 20
    store.gate, store.broken = None, True
    other = text_chain("s" * 64 * 20, 64)
    await reader.learn(other, AffinityTable(10))
    writes = store.writes
    reader.publish(other, 1)
    await reader.flush()  # off after the failed read: skipped, not sent
    assert store.writes == writes
    store.broken = False
    clock[0] += 2.0  # the retry interval passed: on again, and the skipped checkpoints go out
    reader.publish(other, 1)
    await reader.flush()
    assert store.writes == writes + 1
