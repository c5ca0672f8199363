"""Tests for gateway/tiers/tiered.py: tiers plug in through the `Tier`/`LocalTier` protocols, every lookup and
store is counted exactly once per tier, and the purge discipline (docs/coherence.md) holds for one process: a store
started before a purge is dropped (P2), a read raced by a purge is neither back-filled nor answered (P3, P4).
The property over real tiers, two workers and every interleaving is tests/gateway/test_coherence_property.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence

import pytest

from gateway.keys.entry import Entry, make_etag
from gateway.ops.metrics import GatewayMetrics
from gateway.tiers.base import L2Unavailable, LocalTier, Tier
from gateway.tiers.memory import MemoryTier
from gateway.tiers.tiered import TieredCache
from harness.gateway import FakeClock


def entry(key: str) -> Entry:
    return Entry(key, "completions", b"{}", "m", "r", 1_800_000_000.0, 60, 0, make_etag(b"{}"), ())


class DictTier:
    """A shared tier in a dict; `down` makes every call fail the way a tier behind an open breaker does."""

    def __init__(self) -> None:
        self.data: dict[str, Entry] = {}
        self.down = False
        self.purges = 0  # the purge epoch
        self.during_get: list[Callable[[], Awaitable[object]]] = []  # run while a read is in flight

    @property
    def available(self) -> bool:
        return not self.down

    def _check(self) -> None:
        if self.down:
            raise L2Unavailable("down")

    async def get(self, key: str) -> Entry | None:
        value = await self.read(key)
        if self.during_get:
            await self.during_get.pop(0)()
        return self.entry_of(value)

    def read(self, key: str) -> asyncio.Future[Entry | None]:
        self._check()
        future: asyncio.Future[Entry | None] = asyncio.get_running_loop().create_future()
        future.set_result(self.data.get(key))
        return future

    @staticmethod
    def entry_of(value: Entry | None) -> Entry | None:
        return value

    async def get_many(self, keys: Sequence[str]) -> list[Entry | None]:
        return [await self.get(k) for k in keys]

    async def epoch(self, key: str, tags: Sequence[str]) -> object:
        self._check()
        return self.purges

    async def set(self, entry: Entry, epoch: object) -> bool:
        self._check()
        if epoch != self.purges:
            return False
        self.data[entry.key] = entry
        return True

    async def delete(self, keys: Iterable[str]) -> int:
        self._check()
        self.purges += 1
        return sum(self.data.pop(k, None) is not None for k in keys)

    async def purge_tags(self, tags: Iterable[str]) -> tuple[int, list[str]]:
        return 0, []

    async def ping(self) -> bool:
        return not self.down

    async def stats(self) -> tuple[int, int] | None:
        return len(self.data), 0

    async def close(self) -> None:
        return None


def counts(metrics: GatewayMetrics) -> dict[tuple[str, ...], float]:
    metrics.tally.flush()  # what a scrape does first
    out: dict[tuple[str, ...], float] = {}
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.name in ("tokenedge_cache_lookups_total", "tokenedge_cache_stores_total") and s.value:
                out[(s.name.split("_")[2], *s.labels.values())] = s.value
    return out


@pytest.fixture
def tiers() -> tuple[TieredCache, DictTier, GatewayMetrics]:
    metrics = GatewayMetrics()
    l1: LocalTier = MemoryTier(1 << 20, FakeClock())
    l2 = DictTier()
    shared: Tier = l2  # the protocol, not a concrete class
    return TieredCache(l1, shared, metrics), l2, metrics


async def test_every_lookup_and_store_counts_once_per_tier(
    tiers: tuple[TieredCache, DictTier, GatewayMetrics],
) -> None:
    cache, l2, metrics = tiers
    assert await cache.get("k") is None  # l1 miss, l2 miss
    await cache.put(entry("k"), await cache.ticket("k", ()))  # stored in both
    found = await cache.get("k")  # l1 hit: l2 not asked
    assert found is not None and found.tier == "l1"
    cache.l1.clear()
    found = await cache.get("k")  # l1 miss, l2 hit (back-fills l1)
    assert found is not None and found.tier == "l2" and "k" in l2.data
    cache.count_l1_hit()  # the fast path's own l1 hit
    assert counts(metrics) == {
        ("lookups", "l1", "miss"): 2,
        ("lookups", "l1", "hit"): 2,
        ("lookups", "l2", "miss"): 1,
        ("lookups", "l2", "hit"): 1,
        ("stores", "l1"): 1,
        ("stores", "l2"): 1,
    }


async def test_an_unavailable_l2_is_one_error_lookup_and_no_store(
    tiers: tuple[TieredCache, DictTier, GatewayMetrics],
) -> None:
    cache, l2, metrics = tiers
    l2.down = True
    assert await cache.get("k") is None
    await cache.put(entry("k"), await cache.ticket("k", ()))  # the ticket has no epoch: L2 is not written
    assert await cache.purge(["k"], []) == {"l1": 1, "l2": "error"}
    assert counts(metrics) == {
        ("lookups", "l1", "miss"): 1,
        ("lookups", "l2", "error"): 1,
        ("stores", "l1"): 1,
    }


async def test_a_store_started_before_a_purge_is_dropped_by_both_tiers(
    tiers: tuple[TieredCache, DictTier, GatewayMetrics],
) -> None:
    cache, l2, metrics = tiers
    ticket = await cache.ticket("k", ())  # taken before the upstream call
    await cache.purge(["other"], [])  # lands while the upstream answers
    await cache.put(entry("k"), ticket)
    assert cache.l1.get("k") is None and "k" not in l2.data
    assert metrics.cache_refusals.labels("l1", "purged")._value.get() == 1
    await cache.put(entry("k"), await cache.ticket("k", ()))  # a fill begun after the purge stores
    assert cache.l1.get("k") is not None and "k" in l2.data


async def test_a_read_raced_by_a_purge_is_read_again_and_never_back_filled(
    tiers: tuple[TieredCache, DictTier, GatewayMetrics],
) -> None:
    cache, l2, metrics = tiers
    l2.data["k"] = entry("k")
    l2.during_get.append(lambda: cache.purge(["k"], []))  # the purge lands while L2 answers
    assert await cache.get("k") is None  # read again: the purge deleted it
    assert cache.l1.get("k") is None
    assert counts(metrics)[("lookups", "l2", "raced")] == 1
    l2.data["k"] = entry("k")
    l2.during_get.append(lambda: cache.purge(["other"], []))
    found = await cache.get("k")  # raced by an unrelated purge: the second read answers
    assert found is not None and found.tier == "l2" and cache.l1.get("k") is found.entry


async def test_the_lease_reader_drops_a_read_raced_by_a_purge(
    tiers: tuple[TieredCache, DictTier, GatewayMetrics],
) -> None:
    cache, l2, _ = tiers
    l2.data["k"] = entry("k")
    l2.during_get.append(lambda: cache.purge([], ["model:m"]))
    assert await cache.fetch("k") is None  # the waiter reads or fills again
    assert cache.l1.get("k") is None
    found = await cache.fetch("k")
    assert found is not None and cache.l1.get("k") is found
