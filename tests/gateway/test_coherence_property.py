"""Purges are final, as a property (issue 35; the invariants P1-P6 of docs/coherence.md).

Two workers (two L1s and two clients of one real Redis, Redis Cluster or Memcached, joined by an invalidation bus
as `--workers 2` are) run a seeded random schedule in concurrent rounds: fills (a store ticket, the upstream, the
store), hits, lease reads, warm fills, purges by key and by `key:`, `tenant:`, `model:` and `rev:` tag, and clock
ticks past the TTL. Every round trip to the shared tier parks before it is sent and after its answer until the
`Interleaver` (tests/support/interleave.py) releases it, one at a time in an order the seed draws, so a purge can
land between any read and its use, between a fill's ticket and its store, or between two round trips of one purge;
the same seed gives the same interleaving.

The property: once a purge has returned, no answer is an entry the purge names whose upstream call began before
the purge began. Mutation checks: a tag purge in two round trips (read the members, then delete), a back-fill
without the generation (the lease reader's old way) and a store without the epoch of its start (the old fill) each
make it fail.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from gateway.hits.verdict import Verdict, judge
from gateway.keys.derive import entry_tags
from gateway.keys.entry import Entry, make_etag
from gateway.misses.warm import fill_l1
from gateway.ops.metrics import GatewayMetrics
from gateway.tiers.base import Tier
from gateway.tiers.coherence.coherence import Coherence, purge_everywhere
from gateway.tiers.hotrecord import Warmup
from gateway.tiers.memcached_tier import MemcachedTier
from gateway.tiers.memory import MemoryTier
from gateway.tiers.redis_cluster import RedisClusterTier, cluster_client
from gateway.tiers.redis_tier import EPOCH_KEY, TAG_PREFIX, RedisTier
from gateway.tiers.tiered import Ticket, TieredCache
from gateway.upstream.catalog import ModelCatalog
from harness.gateway import FakeClock
from harness.services import MemcachedServer
from tests.support.cluster import LocalCluster
from tests.support.interleave import Interleaver, MemoryBus, MemoryHub, Slowed

TTL_S = 60
SCOPES = ("pub", "t00000000000000a1")
KEYS = [  # (key, tags): two tenants, two models, two revisions
    (
        f"te1:{SCOPES[i % 2]}:{digest}",
        entry_tags(model=f"m{i // 2 % 2}", revision=f"r{i // 4}", scope=SCOPES[i % 2], digest=digest),
    )
    for i, digest in enumerate(hashlib.sha256(str(i).encode()).hexdigest() for i in range(6))
]


@dataclass
class Worker:
    cache: TieredCache
    coherence: Coherence


@dataclass
class History:
    """Logical time and what happened: fills (when each began), purges (began, returned) and answers."""

    clock: FakeClock
    time: Iterator[int] = field(default_factory=itertools.count)
    # serial -> key, tags, when its upstream call began
    fills: dict[int, tuple[str, tuple[str, ...], int]] = field(default_factory=dict)
    purges: list[tuple[tuple[str, ...], tuple[str, ...], int, int]] = field(default_factory=list)
    answers: list[tuple[int, int, str]] = field(default_factory=list)  # serial, at, how
    violations: list[str] = field(default_factory=list)
    serials: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def answered(self, entry: Entry | None, how: str) -> None:
        """An answer the worker gives now: checked against every purge returned so far (each is appended when
        it returns, so all of them returned before this answer)."""
        if entry is None or judge(entry, self.clock(), needs_usage=False) is not Verdict.HIT:
            return
        assert entry.age_s(self.clock()) <= entry.ttl_s  # TTL: an expired entry is never an answer
        serial, at = orjson.loads(entry.body)["serial"], next(self.time)
        self.answers.append((serial, at, how))
        key, tags, began = self.fills[serial]
        for keys, purged_tags, p_began, p_returned in self.purges:
            if (key in keys or not set(tags).isdisjoint(purged_tags)) and began < p_began:
                self.violations.append(
                    f"{how} answered fill {serial} (began {began}) after purge [{p_began}, {p_returned}]"
                )


async def fill(w: Worker, h: History, gate: Interleaver, key: str, tags: tuple[str, ...]) -> None:
    serial = next(h.serials)
    ticket = await w.cache.ticket(key, tags)  # P2: before the upstream call, as `store_ticket`
    h.fills[serial] = (key, tags, next(h.time))  # the upstream call begins: its answer is no older than this
    await gate.point()  # the upstream answers
    body = orjson.dumps({"serial": serial})
    model, revision = tags[0].removeprefix("model:"), tags[1].removeprefix("rev:")
    entry = Entry(key, "chat/completions", body, model, revision, h.clock(), TTL_S, 0, make_etag(body), tags)
    await w.cache.put(entry, ticket)


async def hit(w: Worker, h: History, key: str) -> None:
    found = await w.cache.get(key)
    h.answered(found.entry if found is not None else None, "hit")


async def lease_read(w: Worker, h: History, key: str) -> None:
    h.answered(await w.cache.fetch(key), "lease")


async def warm(w: Worker, h: History, keys: list[str]) -> None:
    async def top(n: int) -> list[str]:
        return keys[:n]

    state = SimpleNamespace(cache=w.cache, clock=h.clock)
    await fill_l1(state, SimpleNamespace(top=top), len(keys), Warmup())  # type: ignore[arg-type]


async def purge(w: Worker, h: History, keys: tuple[str, ...], tags: tuple[str, ...]) -> None:
    began = next(h.time)
    await purge_everywhere(w.cache, w.coherence, keys, tags, ack_timeout_s=60.0)
    h.purges.append((keys, tags, began, next(h.time)))


# Operation weights: every kind, and a hostile mix (for the mutation checks: fills and purges racing on two keys).
MIX = {"fill": 30, "hit": 25, "lease": 10, "warm": 5, "purge": 25, "tick": 5}
HOSTILE = {"fill": 40, "hit": 20, "lease": 5, "warm": 0, "purge": 35, "tick": 0}


async def an_op(rng: random.Random, workers: list[Worker], h: History, gate: Interleaver, run: Run) -> None:
    """One operation, drawn now; it begins when the interleaver says (as a request arrives), like its round trips."""
    op = drawn(rng, rng.choice(workers), h, gate, run)
    await gate.point()
    await op


def drawn(
    rng: random.Random, w: Worker, h: History, gate: Interleaver, run: Run
) -> Coroutine[Any, Any, None]:
    key, tags = rng.choice(run.keys)
    kind = rng.choices(list(run.mix), weights=list(run.mix.values()))[0]
    if kind == "fill":
        return fill(w, h, gate, key, tags)
    if kind == "hit":
        return hit(w, h, key)
    if kind == "lease":
        return lease_read(w, h, key)
    if kind == "warm":
        return warm(w, h, [k for k, _ in run.keys])
    if kind == "purge":
        if rng.random() < 0.25:
            return purge(w, h, (key,), ())
        return purge(w, h, (), (rng.choice(tags),))

    async def tick() -> None:
        h.clock.advance(rng.choice((5, 25, 45)))

    return tick()


Build = Callable[[Interleaver, FakeClock], Awaitable[Tier]]


@dataclass(frozen=True)
class Run:
    seed: int
    rounds: int
    keys: list[tuple[str, tuple[str, ...]]] = field(default_factory=lambda: KEYS)
    mix: dict[str, int] = field(default_factory=lambda: MIX)
    ops: tuple[int, int] = (2, 6)  # concurrent operations per round
    stop_early: bool = False  # at the first violation (the mutation checks)


async def schedule(build: Build, run: Run) -> History:
    """Two workers on tiers from `build`, `run.rounds` rounds of concurrent operations: the history."""
    rng = random.Random(run.seed)
    gate = Interleaver(rng)
    clock = FakeClock()
    history = History(clock)
    hub = MemoryHub()
    workers, tiers = [], []
    for _ in range(2):
        l2 = await build(gate, clock)
        tiers.append(l2)
        l1 = MemoryTier(1 << 20, clock)
        catalog = ModelCatalog(None, ttl_s=30.0, fallback_revision="r0", clock=clock)  # type: ignore[arg-type]
        coherence = Coherence(l1, catalog, MemoryBus(hub), clock)  # type: ignore[arg-type]
        await coherence.start()
        workers.append(Worker(TieredCache(l1, l2, GatewayMetrics()), coherence))
    try:
        for _ in range(run.rounds):
            await gate.run([an_op(rng, workers, history, gate, run) for _ in range(rng.randint(*run.ops))])
            if run.stop_early and history.violations:
                break
    finally:
        gate.on = False
        for worker in workers:
            await worker.coherence.close()
        for tier in tiers:
            await tier.close()
    return history


# The shared tiers, as two workers would each open them.
def on_redis(url: str) -> Build:
    async def build(gate: Interleaver, clock: FakeClock) -> Tier:
        client: Any = Slowed(aioredis.Redis.from_url(url), gate)
        return RedisTier(url, timeout_s=30.0, retry_after_s=1.0, clock=clock, on_error=failed, client=client)

    return build


def on_cluster(url: str) -> Build:
    async def build(gate: Interleaver, clock: FakeClock) -> Tier:
        client: Any = Slowed(cluster_client(url, timeout_s=30.0), gate)
        return RedisClusterTier(
            url, timeout_s=30.0, retry_after_s=1.0, clock=clock, on_error=failed, client=client, buckets=8
        )

    return build


def on_memcached(server: str) -> Build:
    async def build(gate: Interleaver, clock: FakeClock) -> Tier:
        tier = MemcachedTier(
            [server],
            timeout_s=30.0,
            retry_after_s=1.0,
            max_item_bytes=1 << 20,
            clock=clock,
            on_error=failed,
            on_refusal=lambda reason: None,
        )
        for shard in tier._shards:
            shard.cache = Slowed(shard.cache, gate)  # type: ignore[assignment]
        return tier

    return build


def failed() -> None:
    raise AssertionError("a shared tier failed during the schedule")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    running = LocalCluster(masters=3)
    running.start()
    try:
        yield running
    finally:
        running.stop()


async def test_purges_are_final_on_redis(redis_url: str) -> None:
    history = await schedule(on_redis(redis_url), Run(seed=35, rounds=400))
    assert history.violations == []
    assert len(history.answers) > 50 and len(history.purges) > 50  # it did exercise the property


async def test_purges_are_final_on_a_redis_cluster(cluster: LocalCluster) -> None:
    for node in cluster.masters():
        client = node.client()
        client.flushall()
        client.close()
    history = await schedule(on_cluster(cluster.url), Run(seed=36, rounds=200))
    assert history.violations == []
    assert len(history.answers) > 30 and len(history.purges) > 30


async def test_purges_are_final_on_memcached(memcached: MemcachedServer) -> None:
    history = await schedule(on_memcached(memcached.server), Run(seed=37, rounds=400))
    assert history.violations == []
    assert len(history.answers) > 50 and len(history.purges) > 50


async def two_round_trips(self: RedisTier, tags: Any) -> tuple[int, list[str]]:
    """The old tag purge: read the members, then (another round trip) delete them and the tag sets."""
    if not tags:
        return 0, []
    tag_keys = [TAG_PREFIX + t for t in tags]
    members = await self._call("purge", lambda: self._client.sunion(tag_keys))
    names = [m.decode() for m in members]

    async def rest() -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        pipe.incr(EPOCH_KEY)
        if names:
            pipe.delete(*names)
        pipe.delete(*tag_keys)
        return await pipe.execute()

    await self._call("purge", rest)
    return len(names), names


def backfill_without_generation(self: TieredCache, entry: Entry, generation: int) -> bool:
    """The old lease reader: back-filled L1 whatever happened since its read began, and answered."""
    self.l1.set(entry)
    return True


PUT = TieredCache.put


async def store_under_the_epoch_of_the_store(self: TieredCache, entry: Entry, ticket: Ticket) -> None:
    """The old fill: no epoch from before the upstream call; what holds when it stores is taken instead."""
    await PUT(self, entry, await self.ticket(entry.key, entry.tags))


@pytest.mark.parametrize(
    "mutation",
    [
        (RedisTier, "purge_tags", two_round_trips),
        (TieredCache, "backfill", backfill_without_generation),
        (TieredCache, "put", store_under_the_epoch_of_the_store),
    ],
    ids=["tag-purge-in-two-round-trips", "backfill-without-generation", "store-without-its-epoch"],
)
async def test_each_mutation_breaks_the_property(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, mutation: tuple[type, str, Callable[..., Any]]
) -> None:
    owner, name, broken = mutation
    monkeypatch.setattr(owner, name, broken)
    run = Run(seed=35, rounds=600, keys=KEYS[:2], mix=HOSTILE, ops=(3, 8), stop_early=True)
    history = await schedule(on_redis(redis_url), run)
    assert history.violations != []
