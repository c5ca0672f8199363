"""L1: byte budget, per-entry expiry on an injected clock, purge by key and tag."""

from __future__ import annotations

from gateway.entry import Entry, make_etag
from gateway.tiers.memory import MemoryTier
from tests.support.gateway import FakeClock


def entry(n: int, size: int = 100, ttl_s: int = 60, tags: tuple[str, ...] = ()) -> Entry:
    body = b"x" * size
    return Entry(key=f"k{n}", endpoint="chat/completions", body=body, model="m", revision="r",
                 created_at=1_800_000_000.0, ttl_s=ttl_s, stale_if_error_s=10, etag=make_etag(body), tags=tags)


def test_byte_budget_evicts_least_recently_used() -> None:
    tier = MemoryTier(3 * MemoryTier.cost(entry(0, 1000)), FakeClock())
    for n in range(3):
        tier.set(entry(n, 1000))
    assert tier.get("k0") is not None  # k0 becomes most recent
    tier.set(entry(3, 1000))
    assert tier.get("k1") is None
    assert tier.get("k0") is not None
    assert tier.evictions == 1
    assert tier.bytes_used() <= tier.max_bytes


def test_entries_expire_after_ttl_plus_stale_window() -> None:
    clock = FakeClock()
    tier = MemoryTier(10_000, clock)
    tier.set(entry(1, ttl_s=60))
    clock.advance(69)
    assert tier.get("k1") is not None
    clock.advance(2)
    assert tier.get("k1") is None


def test_oversized_entry_is_not_kept() -> None:
    tier = MemoryTier(500, FakeClock())
    assert tier.set(entry(1, 1000)) is False
    assert tier.entries() == 0


def test_disabled_tier_stores_nothing() -> None:
    tier = MemoryTier(0, FakeClock())
    assert tier.set(entry(1)) is False
    assert tier.get("k1") is None


def test_purge_by_key_and_tag() -> None:
    tier = MemoryTier(100_000, FakeClock())
    tier.set(entry(1, tags=("model:a",)))
    tier.set(entry(2, tags=("model:b",)))
    tier.set(entry(3, tags=("model:a", "rev:x")))
    assert tier.delete(["k2", "missing"]) == 1
    assert tier.purge_tags(["model:a"]) == 2
    assert tier.entries() == 0
