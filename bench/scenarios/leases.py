"""`python -m bench leases`: cross-replica coalescing, leases on vs off, in the same run.

Two gateway replicas (processes) share one redis-server; the upstream is an in-process fake that takes
`GENERATION_S` per completion (a stand-in for a model) and counts calls. Two measurements per mode:
- herd: ROUNDS distinct prompts, each sent as FANOUT concurrent identical requests split over the replicas:
  upstream calls per prompt and the request latency p50/p99;
- solo: SOLO sequential unique misses on one replica: the latency a lease adds to an uncontended miss.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence

import aiohttp

from bench.measure.arms import GENERATION_S, Row, SlowUpstream, alternate, body, print_modes
from bench.measure.load import pct
from harness.replicas import replicas
from harness.services import RedisServer

ROUNDS, FANOUT, SOLO = 20, 10, 40
HEADERS = {"Authorization": "Bearer bench", "Content-Type": "application/json"}


async def timed_post(session: aiohttp.ClientSession, url: str, data: bytes) -> float:
    started = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", data=data, headers=HEADERS) as resp:
        await resp.read()
        assert resp.status == 200, resp.status
    return time.perf_counter() - started


async def run_mode(upstream_url: str, redis: RedisServer, fake: SlowUpstream, leases: bool, tag: str) -> Row:
    redis.flush()
    env = {
        "TOKENEDGE_CACHE_REDIS_URL": redis.url,
        "TOKENEDGE_CACHE_LEASE_ENABLED": "true" if leases else "false",
    }
    async with replicas(upstream_url, 2, env) as (a, b), aiohttp.ClientSession() as session:
        await timed_post(session, a.url, body(f"{tag} warm a"))  # catalogs and pools warm
        await timed_post(session, b.url, body(f"{tag} warm b"))
        fake.calls = 0
        herd: list[float] = []
        for r in range(ROUNDS):
            data = body(f"{tag} herd {r}")
            herd += await asyncio.gather(
                *(timed_post(session, (a, b)[i % 2].url, data) for i in range(FANOUT))
            )
        herd_calls = fake.calls
        solo = [await timed_post(session, a.url, body(f"{tag} solo {i}")) for i in range(SOLO)]
    return {
        "calls_per_prompt": herd_calls / ROUNDS,
        "herd_p50_ms": pct(herd, 0.5),
        "herd_p99_ms": pct(herd, 0.99),
        "solo_p50_ms": pct(solo, 0.5),
        "solo_overhead_ms": statistics.median(solo) * 1000 - GENERATION_S * 1000,
    }


TITLE = (
    f"\nleases: 2 replicas, one Redis, upstream {GENERATION_S * 1000:.0f} ms per completion; "
    f"herd = {ROUNDS} prompts x {FANOUT} concurrent identical requests; solo = {SOLO} sequential unique misses"
)
COLUMNS = "upstream calls per prompt | herd p50 ms | herd p99 ms | solo miss p50 ms | solo overhead ms"
# a row, formatted
CELLS = "{calls_per_prompt:.2f} | {herd_p50_ms:.1f} | {herd_p99_ms:.1f} | {solo_p50_ms:.1f} | {solo_overhead_ms:.1f}"


def main(argv: Sequence[str] = ()) -> None:
    print_modes(TITLE, COLUMNS, CELLS, asyncio.run(alternate(SlowUpstream(), "leases", run_mode)))


if __name__ == "__main__":
    main()
