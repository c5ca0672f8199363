"""L1: byte budget, per-entry expiry on an injected clock, purge by key and tag."""

from __future__ import annotations

import gc
import hashlib
import tracemalloc
from collections.abc import Callable

import orjson

from gateway.keys.derive import entry_tags
from gateway.keys.entry import Entry, make_etag
from gateway.tiers.memory import MemoryTier
from harness.gateway import FakeClock


def entry(n: int, size: int = 100, ttl_s: int = 60, tags: tuple[str, ...] = ()) -> Entry:
    body = b"x" * size
    return Entry(
        key=f"k{n}",
        endpoint="chat/completions",
        body=body,
        model="m",
        revision="r",
        created_at=1_800_000_000.0,
        ttl_s=ttl_s,
        stale_if_error_s=10,
        etag=make_etag(body),
        tags=tags,
    )


def test_byte_budget_evicts_least_recently_used() -> None:
    tier = MemoryTier(3 * MemoryTier(0, FakeClock()).cost(entry(0, 1000)), FakeClock())
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


def test_max_age_caps_how_long_an_entry_lives_in_l1() -> None:
    clock = FakeClock(1_800_000_000.0)
    tier = MemoryTier(10_000, clock, max_age_s=2.0)
    tier.set(entry(1, ttl_s=60))
    clock.advance(1.9)
    assert tier.get("k1") is not None
    clock.advance(0.2)
    assert tier.get("k1") is None  # long before its TTL: the cap bounds cross-worker staleness


def realistic(i: int) -> Entry:
    """An entry as a fill builds it: per-request strings, an orjson body, usage parsed from it."""
    request = orjson.loads(orjson.dumps({"model": "test-model", "n": i}))
    digest = hashlib.blake2b(str(i).encode(), digest_size=32).hexdigest()
    body = orjson.dumps(
        {
            "id": f"chatcmpl-{i}",
            "object": "chat.completion",
            "created": 1_800_000_000 + i,
            "model": "test-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"answer {i} " * (i % 40)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 300 + i % 99, "total_tokens": 400},
        }
    )
    model = request["model"]
    return Entry(
        key=f"te1:pub:{digest}",
        endpoint="chat/completions",
        body=body,
        model=model,
        revision=orjson.loads(b'"rev-1"'),
        created_at=1_800_000_000.0 + i,
        ttl_s=3600,
        stale_if_error_s=600,
        etag=make_etag(body),
        tags=entry_tags(model=model, revision="rev-1", scope="pub", digest=digest),
        usage=orjson.loads(body)["usage"],
    )


def traced_growth(fill: Callable[[], object]) -> tuple[int, object]:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = fill()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before, kept
    finally:
        tracemalloc.stop()


def test_the_budget_counts_what_the_entries_really_hold() -> None:
    def fill() -> MemoryTier:
        tier = MemoryTier(1 << 40, FakeClock())
        for i in range(5_000):
            tier.set(realistic(i))
        return tier

    traced, tier = traced_growth(fill)
    assert isinstance(tier, MemoryTier)
    # Never less than tracemalloc sees; more only by allocator rounding and strings shared behind our back.
    assert traced <= tier.bytes_used() <= 1.4 * traced, (traced, tier.bytes_used())


def test_bodies_are_exact_size_copies() -> None:
    """orjson keeps its growth buffer behind its output (4 KB behind a 114-byte answer): entries must not."""

    def holding(make_body: Callable[[int], bytes]) -> Callable[[], object]:
        return lambda: [
            Entry(
                key=f"k{i}",
                endpoint="chat/completions",
                body=make_body(i),
                model="m",
                revision="r",
                created_at=0.0,
                ttl_s=1,
                stale_if_error_s=0,
                etag="e",
                tags=(),
            )
            for i in range(200)
        ]

    from_orjson, kept = traced_growth(holding(lambda i: orjson.dumps({"content": f"{i:0700d}"})))
    exact, _ = traced_growth(holding(lambda i: b'{"content":"%s"}' % f"{i:0700d}".encode()))
    assert isinstance(kept, list) and kept[7].body == b'{"content":"%s"}' % f"{7:0700d}".encode()
    assert from_orjson < exact * 1.1, (from_orjson, exact)  # without the copy: about 8 times as much


def test_short_soak_stays_within_the_budget() -> None:
    """Many more unique entries than fit: memory held stays at the budget (the long run is bench/scenarios/soak.py)."""
    budget = 1 << 20

    def fill() -> MemoryTier:
        tier = MemoryTier(budget, FakeClock())
        for i in range(8_000):
            tier.set(entry(i, 600, tags=(f"key:{i:064x}",)))
        return tier

    traced, tier = traced_growth(fill)
    assert isinstance(tier, MemoryTier) and tier.evictions > 0
    assert tier.bytes_used() <= budget
    assert traced <= budget * 1.15


def test_suspended_tier_is_empty_and_stores_nothing_until_resumed() -> None:
    tier = MemoryTier(100_000, FakeClock())
    tier.set(entry(1))
    generation = tier.generation
    tier.suspend()
    assert tier.get("k1") is None and tier.set(entry(2)) is False and tier.entries() == 0
    tier.resume()
    assert tier.set(entry(3, ttl_s=60), generation=generation) is False  # a read begun before the purge
    assert tier.set(entry(3)) is True and tier.get("k3") is not None
