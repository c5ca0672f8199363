"""L1: an in-process LRU bounded by the bytes its entries really hold, with per-entry expiry.

Each worker process has its own L1. The budget is charged with `Entry.size_bytes()` (measured allocator bytes of
the entry and everything it owns) plus `SLOT_BYTES` for the entry's place in the LRU table, so `max_bytes` bounds
memory actually held (tests check this against tracemalloc). The table is one OrderedDict from key to entry: no
per-entry wrapper, tuple or size record. Expired entries are dropped when read or when they reach the LRU end;
they are counted until then. With `max_age_s` set, an entry also leaves at most that long after it entered this L1:
the bound on how long another worker's purge can go unseen here when nothing invalidates L1 across workers (a
Memcached L2, which has no invalidation bus); the insertion times then cost `AGE_SLOT_BYTES` an entry, charged.
The clock is injected so tests move time instead of sleeping.

Coherence (gateway.tiers.coherence): `suspend()` empties L1 and turns it off while invalidations may be missed,
`resume()` empties it again and turns it back on, and `generation` changes on every purge so that a read begun
before a purge (an L2 read about to back-fill L1) can tell that its entry may be stale.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from gateway.keys.entry import Entry

# An OrderedDict slot: the hash-table entry and index (at the table's usual fill) plus the linked-list node.
# Measured with tracemalloc over 100,000 entries (tests/gateway/test_memory_tier.py checks it).
SLOT_BYTES = 104
AGE_SLOT_BYTES = 128  # a dict slot plus a float, only with max_age_s


class MemoryTier:
    name = "l1"

    def __init__(self, max_bytes: int, clock: Callable[[], float], max_age_s: float = 0.0) -> None:
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._clock = clock
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._inserted: dict[str, float] = {}  # key -> when it entered this L1; only with max_age_s
        self._slot_bytes = SLOT_BYTES + (AGE_SLOT_BYTES if max_age_s > 0 else 0)
        self._bytes = 0
        self.evictions = 0
        self.suspended = False
        self.generation = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0 and not self.suspended

    def cost(self, entry: Entry) -> int:
        return entry.size_bytes() + self._slot_bytes

    def get(self, key: str) -> Entry | None:
        entry = self._entries.get(key)
        if entry is None or self.suspended:
            return None
        now = self._clock()
        if entry.expires_at() <= now or (self.max_age_s > 0 and now - self._inserted[key] >= self.max_age_s):
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry

    def set(self, entry: Entry, *, generation: int | None = None) -> bool:
        """Store; False when off, when a purge happened since `generation` was read, or when the entry alone
        exceeds the budget (it is then only in L2)."""
        if not self.enabled or (generation is not None and generation != self.generation):
            return False
        size = self.cost(entry)
        if size > self.max_bytes:
            return False
        self._drop(entry.key)
        self._entries[entry.key] = entry
        if self.max_age_s > 0:
            self._inserted[entry.key] = self._clock()
        self._bytes += size
        while self._bytes > self.max_bytes:
            oldest_key, oldest = self._entries.popitem(last=False)
            self._inserted.pop(oldest_key, None)
            self._bytes -= self.cost(oldest)
            self.evictions += 1
        return True

    def _drop(self, key: str) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self._inserted.pop(key, None)
        self._bytes -= self.cost(entry)
        return True

    def delete(self, keys: Iterable[str]) -> int:
        self.generation += 1
        return sum(1 for key in keys if self._drop(key))

    def purge_tags(self, tags: Iterable[str]) -> int:
        """O(entries): purge is an admin operation, so no tag index is kept on the hot path."""
        wanted = set(tags)
        return self.purge_where(lambda entry: not wanted.isdisjoint(entry.tags))

    def purge_where(self, doomed: Callable[[Entry], bool]) -> int:
        self.generation += 1
        keys = [key for key, entry in self._entries.items() if doomed(entry)]
        return sum(1 for key in keys if self._drop(key))

    def clear(self) -> None:
        self.generation += 1
        self._entries.clear()
        self._inserted.clear()
        self._bytes = 0

    def suspend(self) -> None:
        """Empty and off: invalidations may be missed from now on (the bus is down)."""
        self.suspended = True
        self.clear()

    def resume(self) -> None:
        """Empty again (what was published while off is lost) and back on."""
        self.clear()
        self.suspended = False

    def entries(self) -> int:
        return len(self._entries)

    def bytes_used(self) -> int:
        return self._bytes
