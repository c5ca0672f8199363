"""The hot-key record on a real redis-server: batched flushes, decay, the bound, and which requests are kept."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter

from gateway.keys.derive import ANONYMOUS_SCOPE, PUBLIC_SCOPE
from gateway.tiers.hotrecord import (
    REQUESTS,
    SCORES,
    HotRecord,
    HotSettings,
    Replayable,
    decode_request,
    encode_request,
)
from harness.gateway import FakeClock

HALF_LIFE_S = 100.0


def settings(**overrides: float) -> HotSettings:
    values: dict[str, float] = {
        "max_keys": 100,
        "batch": 50,
        "flush_s": 60.0,
        "half_life_s": HALF_LIFE_S,
        "max_request_bytes": 1024,
        "timeout_s": 2.0,
        **overrides,
    }
    return HotSettings(**values)  # type: ignore[arg-type]


def request(key: str, body: bytes = b'{"model":"m"}', revision: str = "rev-1") -> Replayable:
    return Replayable(key, "chat/completions", "/v1/chat/completions", "m", revision, body)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(redis_url)
    yield c
    await c.aclose()


def record(client: aioredis.Redis, clock: FakeClock, **overrides: float) -> HotRecord:
    flushes = Counter("flushes", "", ["outcome"], registry=CollectorRegistry())
    return HotRecord(client, settings(**overrides), clock, flushes)


async def test_hits_stay_local_until_a_flush_then_rank_hottest_first(client: aioredis.Redis) -> None:
    hot = record(client, FakeClock())
    for key, hits in (("a", 1), ("b", 3), ("c", 2)):
        for _ in range(hits):
            hot.hit(key)
    assert await client.zcard(SCORES) == 0  # counted in-process only: no command per hit
    await hot.flush()
    assert await hot.top(3) == ["b", "c", "a"]
    assert await hot.top(1) == ["b"]


async def test_a_full_batch_flushes_in_the_background(client: aioredis.Redis) -> None:
    hot = record(client, FakeClock(), batch=2)
    hot.hit("a")
    hot.hit("b")  # the batch is full: a flush task starts
    assert hot._flushing is not None
    await hot._flushing
    assert await client.zscore(SCORES, "a") == 1 and await client.zscore(SCORES, "b") == 1


async def test_scores_decay_by_half_life_so_the_record_follows_what_is_hot_now(
    client: aioredis.Redis,
) -> None:
    clock = FakeClock()
    hot = record(client, clock)
    for _ in range(4):
        hot.hit("old")
    await hot.flush()
    clock.advance(HALF_LIFE_S)
    for _ in range(3):
        hot.hit("new")
    await hot.flush()
    assert await client.zscore(SCORES, "old") == pytest.approx(2.0)
    assert await hot.top(2) == ["new", "old"]


async def test_the_record_is_trimmed_to_max_keys_with_its_requests(client: aioredis.Redis) -> None:
    hot = record(client, FakeClock(), max_keys=2)
    for key, hits in (("cold", 1), ("warm", 2), ("hot", 3)):
        hot.stored(request(key), PUBLIC_SCOPE)
        for _ in range(hits - 1):
            hot.hit(key)
    await hot.flush()
    assert await client.zcard(SCORES) == 2
    assert await hot.top(5) == ["hot", "warm"]
    assert sorted(await client.hkeys(REQUESTS)) == [b"hot", b"warm"]


async def test_only_requests_the_gateway_may_re_ask_are_kept(client: aioredis.Redis) -> None:
    hot = record(client, FakeClock(), max_request_bytes=64)
    hot.stored(request("public"), PUBLIC_SCOPE)
    hot.stored(request("anonymous"), ANONYMOUS_SCOPE)
    hot.stored(request("tenant"), "t0123456789abcdef")  # needs the tenant's credential: never written down
    hot.stored(request("large", body=b"x" * 65), PUBLIC_SCOPE)
    await hot.flush()
    kept = await hot.requests(["public", "anonymous", "tenant", "large"])
    assert [r.key if r else None for r in kept] == ["public", "anonymous", None, None]
    assert await client.zcard(SCORES) == 4  # all four still count as hot (L1 warm-up needs no request)


def test_a_recorded_request_of_an_unknown_version_reads_as_absent() -> None:
    raw = encode_request(request("k"))
    assert decode_request(raw) == request("k")
    assert decode_request(raw.replace(b'"v":1', b'"v":99')) is None
    assert decode_request(b"not json") is None


async def test_a_redis_error_drops_the_batch_and_counts_it(redis_url: str) -> None:
    broken = aioredis.Redis.from_url("redis://127.0.0.1:1", socket_connect_timeout=0.5)
    flushes = Counter("flushes", "", ["outcome"], registry=CollectorRegistry())
    hot = HotRecord(broken, settings(), FakeClock(), flushes)
    hot.hit("a")
    await hot.flush()
    assert flushes.labels("error")._value.get() == 1
    assert hot._counts == {}
    await broken.aclose()


async def test_flush_failures_while_redis_is_down_log_once_per_interval(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    broken = aioredis.Redis.from_url("redis://127.0.0.1:1", socket_connect_timeout=0.5)
    flushes = Counter("flushes", "", ["outcome"], registry=CollectorRegistry())
    clock = FakeClock()
    hot = HotRecord(broken, settings(), clock, flushes)
    with caplog.at_level(logging.WARNING, logger="tokenedge.hotrecord"):
        for n in range(7):  # an outage second's worth of failing batches
            hot.hit(f"k{n}")
            await hot.flush()
            clock.advance(0.14)
        clock.advance(10.0)
        hot.hit("later")
        await hot.flush()
    await broken.aclose()

    lines = [r.getMessage() for r in caplog.records if "hot-key record flush" in r.getMessage()]
    assert flushes.labels("error")._value.get() == 8  # every dropped batch still counts
    assert len(lines) == 2 and "(6 similar suppressed)" in lines[1]
