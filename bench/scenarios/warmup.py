"""`python -m bench warmup`: a new replica's first requests and a model revision change, warm-up on vs off.

One redis-server, gateway replicas as processes, an in-process fake upstream taking `GENERATION_S` per completion.
Per mode (alternated, twice):
- a first replica answers HOT distinct prompts (each asked twice, so they are hot), then stops (its hot-key counts
  are flushed on shutdown);
- new replica: a second replica starts against that warm L2 (`cache.warm_fill_top` = HOT, or 0 for "off"):
  seconds until `/ready` says 200, then the HOT prompts once each: the share answered from L1 and the p50 latency;
- new revision: the upstream reports a new revision and a third replica starts; with warm-up on,
  `python -m gateway warm --top HOT` runs first (its wall time reported); then the HOT prompts once each: upstream
  calls made during that pass and its p50 latency.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Sequence

import aiohttp
from aiohttp import web

from bench.measure.arms import GENERATION_S, Row, SlowUpstream, alternate, body, print_modes
from bench.measure.load import pct
from harness.replicas import Replica, start_replica, stop_replica
from harness.services import RedisServer

HOT = 100
WARM_RATE = 400.0
ANON = {
    "Content-Type": "application/json"
}  # `gateway warm` re-asks credential-less (anon) and public requests


class RevisedUpstream(SlowUpstream):
    def __init__(self) -> None:
        super().__init__()
        self.revision = "r1"

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": "m", "object": "model", "tokenedge": {"revision": self.revision}}],
            }
        )


async def first_pass(session: aiohttp.ClientSession, url: str, tag: str) -> tuple[list[float], int]:
    """Each hot prompt once: latencies, and how many came from L1."""
    latencies, from_l1 = [], 0
    for i in range(HOT):
        started = time.perf_counter()
        async with session.post(url + "/v1/chat/completions", data=body(f"{tag} {i}"), headers=ANON) as resp:
            await resp.read()
            assert resp.status == 200, resp.status
            from_l1 += resp.headers.get("Cache-Status", "").endswith("detail=l1")
        latencies.append(time.perf_counter() - started)
    return latencies, from_l1


async def fill_concurrently(session: aiohttp.ClientSession, url: str, tag: str) -> None:
    gate = asyncio.Semaphore(25)

    async def one(i: int) -> None:
        async with (
            gate,
            session.post(url + "/v1/chat/completions", data=body(f"{tag} {i}"), headers=ANON) as resp,
        ):
            await resp.read()
            assert resp.status == 200, resp.status

    await asyncio.gather(*(one(i) for i in range(HOT)))


async def seconds_to_ready(session: aiohttp.ClientSession, replica: Replica, started: float) -> float:
    while True:
        try:
            async with session.get(replica.url + "/ready") as resp:
                if resp.status == 200:
                    return time.perf_counter() - started
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.02)


async def run_mode(upstream_url: str, redis: RedisServer, fake: RevisedUpstream, warm: bool, tag: str) -> Row:
    redis.flush()
    fake.revision = "r1"
    env = {"TOKENEDGE_CACHE_REDIS_URL": redis.url, "TOKENEDGE_CACHE_WARM_FILL_TOP": str(HOT if warm else 0)}
    row: Row = {}
    async with aiohttp.ClientSession() as session:
        first = await start_replica(upstream_url, env)
        for _ in range(2):  # stored, then hit: every prompt hot
            await fill_concurrently(session, first.url, tag)
        await stop_replica(first)
        started = time.perf_counter()
        second = await start_replica(upstream_url, env)
        row["ready_s"] = await seconds_to_ready(session, second, started)
        latencies, from_l1 = await first_pass(session, second.url, tag)
        row["l1_share"], row["new_p50_ms"] = from_l1 / HOT, pct(latencies, 0.5)
        await stop_replica(second)
        fake.revision = "r2"
        third = await start_replica(upstream_url, env)
        await seconds_to_ready(session, third, time.perf_counter())
        row["warm_s"] = 0.0
        if warm:
            started = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gateway",
                "warm",
                "--top",
                str(HOT),
                "--rate",
                str(WARM_RATE),
                "--concurrency",
                "8",
                "--url",
                third.url,
                env={**os.environ, "TOKENEDGE_CACHE_REDIS_URL": redis.url},
                stdout=asyncio.subprocess.DEVNULL,
            )
            await proc.wait()
            row["warm_s"] = time.perf_counter() - started
        calls = fake.calls
        latencies, _ = await first_pass(session, third.url, tag)
        row["rev_calls"], row["rev_p50_ms"] = fake.calls - calls, pct(latencies, 0.5)
        await stop_replica(third)
    return row


TITLE = (
    f"\nwarm-up: {HOT} hot prompts, one Redis, upstream {GENERATION_S * 1000:.0f} ms per completion; "
    f"`gateway warm` at {WARM_RATE:.0f}/s"
)
COLUMNS = (
    "new replica: s to /ready | first pass from L1 | first pass p50 ms | `gateway warm` s | "
    "new revision: upstream calls in first pass | p50 ms"
)
# a row, formatted
CELLS = (
    "{ready_s:.2f} | {l1_share:.0%} | {new_p50_ms:.2f} | {warm_s:.2f} | {rev_calls:.0f} | {rev_p50_ms:.1f}"
)


def main(argv: Sequence[str] = ()) -> None:
    print_modes(TITLE, COLUMNS, CELLS, asyncio.run(alternate(RevisedUpstream(), "warm-up", run_mode)))


if __name__ == "__main__":
    main()
