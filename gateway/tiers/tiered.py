"""The tiered cache: read L1 then L2 (back-filling L1 on an L2 hit), write both, purge both.

Tiers plug in through the protocols of tiers/base.py: any `LocalTier` as L1, any shared `Tier` (Redis,
Memcached) as L2. Every lookup is counted once per tier consulted and outcome, every store once per tier written. L2 failures arrive here as `L2Unavailable` and
become misses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.keys.entry import Entry
from gateway.ops.metrics import GatewayMetrics
from gateway.tiers.base import L2Unavailable, LocalTier, Tier


@dataclass(frozen=True, slots=True)
class Found:
    entry: Entry
    tier: str  # "l1" | "l2"


class TieredCache:
    def __init__(self, l1: LocalTier, l2: Tier | None, metrics: GatewayMetrics) -> None:
        self.l1 = l1
        self.l2 = l2
        self._lookups = metrics.lookups  # hits via the tally (the hot path); L2 misses, errors direct
        self._stores = metrics.cache_stores
        self._tally = metrics.tally

    async def get(self, key: str) -> Found | None:
        if self.l1.enabled:
            entry = self.l1.get(key)
            if entry is not None:
                self._tally.inc(self._lookups, ("l1", "hit"))
                return Found(entry, "l1")
            self._tally.inc(self._lookups, ("l1", "miss"))
        if self.l2 is None:
            return None
        generation = (
            self.l1.generation
        )  # a purge applied while L2 answers must not be undone by the back-fill
        read: Entry | L2Unavailable | None
        try:
            read = await self.l2.get(key)
        except L2Unavailable as exc:
            read = exc
        return self.settle(key, read, generation)

    def settle(self, key: str, entry: Entry | L2Unavailable | None, generation: int) -> Found | None:
        """What an L2 read returned (or its failure), counted, and back-filled into L1 unless a purge came after
        `generation` (L1's generation when the read began). `get` and the fast lane's callback share it."""
        if isinstance(entry, L2Unavailable):
            self._lookups.labels("l2", "error").inc()
            return None
        if entry is None or entry.key != key:
            self._lookups.labels("l2", "miss").inc()
            return None
        self._tally.inc(self._lookups, ("l2", "hit"))
        self.l1.set(entry, generation=generation)
        return Found(entry, "l2")

    def count_l1_miss(self) -> None:
        """The fast lane reads `l1` itself and counts a miss it goes on to L2 with, as `get` would have."""
        self._tally.inc(self._lookups, ("l1", "miss"))

    def count_l1_hit(self) -> None:
        """The hit fast path reads `l1` itself and counts a hit it serves exactly as `get` would have."""
        self._tally.inc(self._lookups, ("l1", "hit"))

    async def put(self, entry: Entry) -> None:
        if self.l1.set(entry):
            self._stores.labels("l1").inc()
        if self.l2 is not None:
            try:
                if await self.l2.set(entry):
                    self._stores.labels("l2").inc()
            except L2Unavailable:
                pass  # counted and logged by the tier; L1 still holds the entry

    async def purge(self, keys: Sequence[str], tags: Sequence[str]) -> dict[str, int | str]:
        """Counts per tier; an unreachable L2 is reported as "error", never raised.

        L2 goes first: once this process (and then, over the bus, every other) drops its L1 copies, no later
        read can find the entry in L2 again. L1 is purged even when L2 failed.
        """
        result: dict[str, int | str] = {}
        if self.l2 is not None:
            try:
                deleted = await self.l2.delete(keys)
                by_tag, _ = await self.l2.purge_tags(tags)
                result["l2"] = deleted + by_tag
            except L2Unavailable:
                result["l2"] = "error"
        return {"l1": self.l1.delete(keys) + self.l1.purge_tags(tags), **result}
