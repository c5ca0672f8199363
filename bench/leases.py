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
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import aiohttp
import orjson
from aiohttp import web

from tests.support.replicas import replicas
from tests.support.services import RedisServer, serving

GENERATION_S = 0.2
ROUNDS, FANOUT, SOLO = 20, 10, 40
HEADERS = {"Authorization": "Bearer bench", "Content-Type": "application/json"}
Row = dict[str, float]


class SlowUpstream:
    def __init__(self) -> None:
        self.calls = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "m", "object": "model", "tokenedge": {"revision": "r1"}}]}
        )

    async def chat(self, request: web.Request) -> web.Response:
        self.calls += 1
        n = self.calls
        await asyncio.sleep(GENERATION_S)  # the model generating
        return web.json_response(
            {
                "id": f"c{n}",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"#{n}"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
            }
        )


Fake = TypeVar("Fake", bound=SlowUpstream)


def body(text: str) -> bytes:
    return orjson.dumps({"model": "m", "temperature": 0, "messages": [{"role": "user", "content": text}]})


async def timed_post(session: aiohttp.ClientSession, url: str, data: bytes) -> float:
    started = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", data=data, headers=HEADERS) as resp:
        await resp.read()
        assert resp.status == 200, resp.status
    return time.perf_counter() - started


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


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


async def alternate(
    fake: Fake, mode: str, run: Callable[[str, RedisServer, Fake, bool, str], Awaitable[Row]]
) -> list[tuple[str, Row]]:
    """`run(upstream URL, redis, fake, on, tag)` with the mode off then on, twice (drift on a shared machine hits
    both alike), against one redis-server and `fake` served on loopback; both stopped at the end. Rows are named
    "<mode> on|off (run N)"."""
    redis = RedisServer()
    redis.start()
    rows = []
    try:
        async with serving(fake.app()) as url:
            for attempt in range(2):
                for on in (False, True):
                    row = await run(url, redis, fake, on, f"{on}-{attempt}")
                    rows.append((f"{mode} {'on' if on else 'off'} (run {attempt + 1})", row))
    finally:
        redis.stop()
    return rows


def print_modes(title: str, columns: str, cells: str, rows: Sequence[tuple[str, Row]]) -> None:
    """The rows of `alternate` as a markdown table: a "mode" column, then `columns` ("a | b | ..."), each row's
    values by the format string `cells` ("{a:.2f} | {b:.1f} | ...")."""
    print(title)
    print(f"| mode | {columns} |")
    print("|---" * (columns.count("|") + 2) + "|")
    for name, row in rows:
        print(f"| {name} | {cells.format_map(row)} |")


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
