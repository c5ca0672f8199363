"""`/metrics` after a scripted mix: exact counts per result and reason, tier counters, shared-tier gauges."""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from harness.gateway import FakeClock, RunningGateway
from harness.services import RedisServer
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> Samples:
    out: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name].append((dict(s.labels), float(s.value)))
    return out


async def scrape(gw: RunningGateway) -> Samples:
    resp = await gw.client.get("/metrics")
    assert resp.status == 200
    return parse(await resp.text())


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    return sum(v for have, v in samples.get(name, []) if all(have.get(k) == w for k, w in labels.items()))


def nonzero(samples: Samples, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """The non-zero samples of `name`, by the values of `labels`."""
    return {tuple(have[k] for k in labels): v for have, v in samples[name] if v}


def chat(content: str, **extra: object) -> dict[str, object]:
    return {**CHAT, "messages": [{"role": "user", "content": content}], **extra}


async def scripted_mix(gw: RunningGateway, redis_server: RedisServer, clock: FakeClock) -> int:
    """An L2 outage, misses, hits from L1 and L2, bypasses; returns the size of one answer served from cache."""
    post = gw.client.post
    redis_server.stop()
    try:
        outage = await post("/v1/chat/completions", json=chat("q3"), headers=AUTH_A)  # L2 error -> miss
        assert outage.status == 200
    finally:
        redis_server.start()
    # L1 is off (and L1 misses uncounted) until the bus is back
    await gw.state.coherence.wait_subscribed(True)
    clock.advance(2)  # past the breaker window
    first = await post("/v1/chat/completions", json=chat("q1"), headers=AUTH_A)  # miss, stored in L1 and L2
    await post("/v1/chat/completions", json=chat("q1"), headers=AUTH_A)  # hit from L1
    gw.state.cache.l1.delete([first.headers["X-Cache-Key"]])
    from_l2 = await post("/v1/chat/completions", json=chat("q1"), headers=AUTH_A)  # hit from L2
    await post("/v1/chat/completions", json=chat("q2"), headers=AUTH_A)  # miss
    await post("/v1/chat/completions", json=chat("q2"), headers=AUTH_A)  # hit from L1
    for _ in range(2):
        await post("/v1/chat/completions", json=chat("q1", temperature=0.7), headers=AUTH_A)  # bypass
    await post("/v1/chat/completions", json=chat("q1"), headers={**AUTH_A, "Cache-Control": "no-store"})
    return len(await from_l2.read())


async def test_scripted_mix_counts_every_result_reason_and_tier(
    make_gateway: GatewayFactory, redis_url: str, redis_server: RedisServer, clock: FakeClock
) -> None:
    gw = await make_gateway(cache={"redis_url": redis_url, "redis_retry_after_s": 1.0})
    answer_bytes = await scripted_mix(gw, redis_server, clock)
    m = await scrape(gw)

    assert nonzero(m, "tokenedge_requests_total", "result", "reason") == {
        ("hit", "l1"): 2,
        ("hit", "l2"): 1,
        ("miss", "stored"): 3,
        ("bypass", "temperature"): 2,
        ("bypass", "no-store"): 1,
    }
    assert nonzero(m, "tokenedge_cache_lookups_total", "tier", "outcome") == {
        ("l1", "hit"): 2,
        ("l1", "miss"): 3,
        ("l2", "hit"): 1,
        ("l2", "miss"): 2,
        ("l2", "error"): 1,
    }
    assert value(m, "tokenedge_cache_errors_total", tier="l2") == 1
    assert value(m, "tokenedge_cache_stores_total", tier="l1") == 2  # not q3: L1 was off during the outage
    assert value(m, "tokenedge_cache_stores_total", tier="l2") == 2
    assert value(m, "tokenedge_tokens_saved_total") == 3 * 15  # the fake's usage.total_tokens per answer
    assert value(m, "tokenedge_bytes_served_from_cache_total") == 3 * answer_bytes
    assert value(m, "tokenedge_request_duration_seconds_count", result="hit") == 3
    assert value(m, "tokenedge_request_duration_seconds_count") == 9
    # gauges: this process's L1, and L2 read from Redis at scrape time, each reported exactly once
    assert [v for labels, v in m["tokenedge_cache_entries"] if labels["tier"] == "l1"] == [2]
    assert len([1 for labels, _ in m["tokenedge_cache_entries"] if labels["tier"] == "l2"]) == 1
    redis = Redis(host="127.0.0.1", port=redis_server.port)
    try:
        assert value(m, "tokenedge_cache_entries", tier="l2") == redis.dbsize() >= 2  # entries + tag sets
    finally:
        redis.close()
    assert value(m, "tokenedge_cache_bytes", tier="l2") > 0


async def test_every_design_metric_is_exposed(gw: RunningGateway) -> None:
    await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    text = await (await gw.client.get("/metrics")).text()
    families = {f.name for f in text_string_to_metric_families(text)}
    design = {
        "tokenedge_requests",
        "tokenedge_cache_lookups",
        "tokenedge_request_duration_seconds",
        "tokenedge_upstream_duration_seconds",
        "tokenedge_time_to_first_token_seconds",
        "tokenedge_tokens_saved",
        "tokenedge_cache_entries",
        "tokenedge_cache_bytes",
        "tokenedge_cache_errors",
        "tokenedge_tokenize_duration_seconds",
        "tokenedge_stage_duration_seconds",
        "tokenedge_bytes_served_from_cache",
    }
    assert design <= families


async def test_hit_buckets_resolve_sub_millisecond_latency(gw: RunningGateway) -> None:
    await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    m = parse((await (await gw.client.get("/metrics")).read()).decode())
    bounds = sorted({float(labels["le"]) for labels, _ in m["tokenedge_stage_duration_seconds_bucket"]})
    assert sum(1 for b in bounds if b < 0.001) >= 3
    assert max(b for b in bounds if b != float("inf")) >= 60
