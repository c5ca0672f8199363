"""The tiered cache: read L1 then L2 (back-filling L1 on an L2 hit), write both, purge both.

Tiers plug in through the protocols of tiers/base.py: any `LocalTier` as L1, any shared `Tier` (Redis,
Memcached) as L2. Every lookup is counted once per tier consulted and outcome, every store once per tier written. L2 failures arrive here as `L2Unavailable` and
become misses.

This is where the purge discipline of docs/coherence.md is kept for every path that reads or writes a tier: a store
carries the `Ticket` it started under (P2), every back-fill of L1 from L2 (the ordinary read, the fast lane, the
lease reader, the warm fill, the alias) goes through `backfill` with the L1 generation taken before its L2 read
(P3), and a read that raced a purge is read again or dropped, never answered (P4).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.keys.entry import Entry
from gateway.ops.metrics import GatewayMetrics
from gateway.tiers.base import Epoch, L2Unavailable, LocalTier, Tier

READS_PER_LOOKUP = 2  # P4: a read raced by a purge is read once more, then it is a miss


@dataclass(frozen=True, slots=True)
class Found:
    entry: Entry
    tier: str  # "l1" | "l2"


@dataclass(frozen=True, slots=True)
class Ticket:
    """P2: what a store started under, taken before the upstream call: L1's purge generation and the shared tier's
    purge epoch for the key (None: L2 could not say, so the store skips L2)."""

    generation: int
    epoch: Epoch | None


class TieredCache:
    def __init__(self, l1: LocalTier, l2: Tier | None, metrics: GatewayMetrics) -> None:
        self.l1 = l1
        self.l2 = l2
        self._lookups = metrics.lookups  # hits via the tally (the hot path); L2 misses, errors direct
        self._stores = metrics.cache_stores
        self._refusals = metrics.cache_refusals
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
        for _ in range(READS_PER_LOOKUP):
            generation = self.l1.generation  # P3: taken before the read
            read: Entry | L2Unavailable | None
            try:
                read = await self.l2.get(key)
            except L2Unavailable as exc:
                read = exc
            found = self.settle(key, read, generation)
            if found is not None or generation == self.l1.generation:
                return found
        return None  # P4: raced by purges twice: a miss (the upstream answers)

    def settle(self, key: str, entry: Entry | L2Unavailable | None, generation: int) -> Found | None:
        """What an L2 read returned (or its failure), counted, back-filled into L1 and answered unless a purge
        came after `generation` (L1's generation when the read began: P3, P4; counted `raced`). `get` and the
        fast lane's callback share it."""
        if isinstance(entry, L2Unavailable):
            self._lookups.labels("l2", "error").inc()
            return None
        if entry is None or entry.key != key:
            self._lookups.labels("l2", "miss").inc()
            return None
        if not self.backfill(entry, generation):
            self._lookups.labels("l2", "raced").inc()
            return None
        self._tally.inc(self._lookups, ("l2", "hit"))
        return Found(entry, "l2")

    def backfill(self, entry: Entry, generation: int) -> bool:
        """P3 and P4, for every back-fill: put an entry read from L2 into L1, where no purge came since
        `generation` (L1's, taken before the read). False: one did, so the read may predate it: neither kept
        nor answered."""
        if generation != self.l1.generation:
            return False
        self.l1.set(entry, generation=generation)
        return True

    async def fetch(self, key: str) -> Entry | None:
        """L2 only and uncounted (the lease reader: its reads are not lookups), under the same P3/P4."""
        if self.l2 is None:
            return None
        generation = self.l1.generation
        try:
            entry = await self.l2.get(key)
        except L2Unavailable:
            return None
        if entry is None or entry.key != key or not self.backfill(entry, generation):
            return None
        return entry

    def count_l1_miss(self) -> None:
        """The fast lane reads `l1` itself and counts a miss it goes on to L2 with, as `get` would have."""
        self._tally.inc(self._lookups, ("l1", "miss"))

    def count_l1_hit(self) -> None:
        """The hit fast path reads `l1` itself and counts a hit it serves exactly as `get` would have."""
        self._tally.inc(self._lookups, ("l1", "hit"))

    async def ticket(self, key: str, tags: Sequence[str]) -> Ticket:
        """P2: taken before the upstream call of a fill; `put` needs it."""
        generation = self.l1.generation
        epoch: Epoch | None = None
        if self.l2 is not None:
            with contextlib.suppress(L2Unavailable):  # counted and logged by the tier; the store skips L2
                epoch = await self.l2.epoch(key, tags)
        return Ticket(generation, epoch)

    async def put(self, entry: Entry, ticket: Ticket) -> None:
        """P2: each tier refuses the entry when a purge came since `ticket` was taken (counted as `purged`)."""
        if ticket.generation != self.l1.generation:
            self._refusals.labels("l1", "purged").inc()
        elif self.l1.set(entry, generation=ticket.generation):
            self._stores.labels("l1").inc()
        if self.l2 is not None and ticket.epoch is not None:
            try:
                if await self.l2.set(entry, ticket.epoch):
                    self._stores.labels("l2").inc()
            except L2Unavailable:
                pass  # counted and logged by the tier; L1 still holds the entry

    async def purge(self, keys: Sequence[str], tags: Sequence[str]) -> dict[str, int | str]:
        """Counts per tier; an unreachable L2 is reported as "error", never raised.

        P5: L2 goes first (each of its purges atomic and moving its epoch, P1): once this process (and then, over
        the bus, every other) drops its L1 copies, no later read can find the entry in L2 again. L1 is purged even
        when L2 failed; its generation moves with it (P3, P4).
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
