"""L1: an in-process, byte-bounded LRU with per-entry expiry, built on cachetools' TLRUCache.

Each worker process has its own L1. Entries stay until the end of their stale-if-error window (freshness is
decided by the policy, not here), or at most `max_age_s` after they entered this L1 when that is set: the bound
on how long another worker's purge can go unseen here when nothing invalidates L1 across workers (a Memcached
L2 without the Redis invalidation bus). The clock is injected so tests move time instead of sleeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cachetools import TLRUCache

from gateway.entry import Entry


class _EvictionCountingCache(TLRUCache[str, Entry]):
    """TLRUCache calls popitem() only to make room, so counting there counts capacity evictions."""

    evictions = 0

    def popitem(self) -> tuple[str, Entry]:
        item = super().popitem()
        self.evictions += 1
        return item


class MemoryTier:
    name = "l1"

    def __init__(self, max_bytes: int, clock: Callable[[], float], max_age_s: float = 0.0) -> None:
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s

        def ttu(_key: str, entry: Entry, now: float) -> float:
            return min(entry.expires_at(), now + max_age_s) if max_age_s > 0 else entry.expires_at()

        self._cache = _EvictionCountingCache(
            maxsize=max(max_bytes, 1),
            ttu=ttu,
            timer=clock,
            getsizeof=Entry.size_bytes,
        )

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def get(self, key: str) -> Entry | None:
        return self._cache.get(key)

    def set(self, entry: Entry) -> bool:
        """Store; False when the entry alone exceeds the byte budget (it is then only in L2)."""
        if not self.enabled or entry.size_bytes() > self.max_bytes:
            return False
        self._cache[entry.key] = entry
        return True

    @property
    def evictions(self) -> int:
        return self._cache.evictions

    def delete(self, keys: Iterable[str]) -> int:
        return sum(1 for key in keys if self._cache.pop(key, None) is not None)

    def purge_tags(self, tags: Iterable[str]) -> int:
        """O(entries): purge is an admin operation, so no tag index is kept on the hot path."""
        wanted = set(tags)
        doomed = [key for key, entry in list(self._cache.items()) if wanted.intersection(entry.tags)]
        return self.delete(doomed)

    def entries(self) -> int:
        self._cache.expire()
        return len(self._cache)

    def bytes_used(self) -> int:
        self._cache.expire()
        return int(self._cache.currsize)
