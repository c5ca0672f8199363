"""Tests for gateway/tiers/tiered.py: tiers plug in through the `Tier`/`LocalTier` protocols, and every lookup and
store is counted exactly once per tier."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

import pytest

from gateway.keys.entry import Entry, make_etag
from gateway.ops.metrics import GatewayMetrics
from gateway.tiers.base import L2Unavailable, LocalTier, Tier
from gateway.tiers.memory import MemoryTier
from gateway.tiers.tiered import TieredCache
from tests.support.gateway import FakeClock


def entry(key: str) -> Entry:
    return Entry(key, "completions", b"{}", "m", "r", 1_800_000_000.0, 60, 0, make_etag(b"{}"), ())


class DictTier:
    """A shared tier in a dict; `down` makes every call fail the way a tier behind an open breaker does."""

    def __init__(self) -> None:
        self.data: dict[str, Entry] = {}
        self.down = False

    @property
    def available(self) -> bool:
        return not self.down

    def _check(self) -> None:
        if self.down:
            raise L2Unavailable("down")

    async def get(self, key: str) -> Entry | None:
        return self.entry_of(await self.read(key))

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

    async def set(self, entry: Entry) -> bool:
        self._check()
        self.data[entry.key] = entry
        return True

    async def delete(self, keys: Iterable[str]) -> int:
        self._check()
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
    await cache.put(entry("k"))  # stored in both
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
    await cache.put(entry("k"))
    assert await cache.purge(["k"], []) == {"l1": 1, "l2": "error"}
    assert counts(metrics) == {
        ("lookups", "l1", "miss"): 1,
        ("lookups", "l2", "error"): 1,
        ("stores", "l1"): 1,
    }
