"""Purge coherence across processes on one real Redis: `--workers 2` plus a second gateway process (a replica).

For each purge kind (by key, by tag, by model) and each repeat: warm K prompts into every process's L1, purge
through one process, then send 1,000 requests spread over both gateways on fresh connections and count answers
identical to a purged one (must be 0: the upstream numbers every answer). Latency from purge to the last process
applying it is measured three ways: the bench's own subscription to the ack channel (first POST byte to the last
ack), the purge call itself (it returns after every subscribed process confirmed), and the lag each process
reports in its ack (publish to applied).

`python -m bench coherence [repeats]`
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import aiohttp
import orjson
import redis.asyncio as aioredis

from bench.measure.load import write_results
from gateway.tiers.coherence.redis_bus import ACK_CHANNEL
from harness.processes import PYTHON, free_port, server, wait_http
from harness.services import RedisServer

K = 20
REQUESTS_AFTER = 1_000
ADMIN = {"Authorization": "Bearer bench-admin"}
AUTH = {"Authorization": "Bearer bench-tenant"}


def prompt(i: int, round_: int) -> dict[str, Any]:
    return {
        "model": "bench-model",
        "temperature": 0,
        "messages": [{"role": "user", "content": f"round {round_} question {i}"}],
    }


async def ask(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[str, str, bytes]:
    async with session.post(url + "/v1/chat/completions", json=body, headers=AUTH) as resp:
        return resp.headers.get("Cache-Status", ""), resp.headers.get("X-Cache-Key", ""), await resp.read()


async def warm(urls: list[str], round_: int) -> tuple[dict[int, bytes], list[str]]:
    """Every prompt through every process (fresh connections spread over workers) until L1 hits everywhere."""
    answers: dict[int, bytes] = {}
    keys: list[str] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        for i in range(K):
            for n in range(12):
                _, key, body = await ask(session, urls[n % len(urls)], prompt(i, round_))
                answers.setdefault(i, body)
            keys.append(key)
    return answers, keys


async def after_purge(urls: list[str], round_: int, old: dict[int, bytes]) -> tuple[int, int]:
    """(answers identical to a purged entry, L1 hits) over REQUESTS_AFTER requests."""
    stale = l1 = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        for n in range(REQUESTS_AFTER):
            i = n % K
            status, _, body = await ask(session, urls[n % len(urls)], prompt(i, round_))
            stale += body == old[i]
            l1 += status.endswith("detail=l1")
    return stale, l1


async def one_purge(
    urls: list[str], redis_url: str, kind: str, round_: int, processes: int
) -> dict[str, Any]:
    old, keys = await warm(urls, round_)
    scope = keys[0].split(":")[1]
    body = {
        "key": {"keys": keys},
        "tag": {"tags": [f"tenant:{scope}"]},
        "model": {"tags": ["model:bench-model"]},
    }
    sub = aioredis.Redis.from_url(redis_url).pubsub()
    await sub.subscribe(ACK_CHANNEL)
    await sub.get_message(timeout=1.0)  # the subscribe confirmation
    acks: list[tuple[float, dict[str, Any]]] = []
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        async with session.post(urls[0] + "/admin/purge", json=body[kind], headers=ADMIN) as resp:
            result = (await resp.json())["purged"]
        call_s = time.perf_counter() - started
    deadline = time.perf_counter() + 2.0
    while len(acks) < processes - 1 and time.perf_counter() < deadline:
        msg = await sub.get_message(timeout=0.5)
        if msg and msg["type"] == "message":
            acks.append((time.perf_counter() - started, orjson.loads(msg["data"])))
    await sub.aclose()
    stale, l1 = await after_purge(urls, round_, old)
    return {
        "kind": kind,
        "confirmed": result.get("bus"),
        "acks": len(acks),
        "call_ms": call_s * 1e3,
        "last_ack_ms": max((a[0] for a in acks), default=float("nan")) * 1e3,
        "max_lag_ms": max((a[1]["lag_s"] for a in acks), default=float("nan")) * 1e3,
        "stale_answers": stale,
        "l1_hits_after": l1,
    }


def main(argv: list[str]) -> None:
    repeats = int(argv[0]) if argv else 5
    redis = RedisServer()
    redis.start()
    redis_url = redis.url
    up_port, a_port, b_port = free_port(), free_port(), free_port()
    env = {
        "TOKENEDGE_UPSTREAM_URL": f"http://127.0.0.1:{up_port}",
        "TOKENEDGE_CACHE_REDIS_URL": redis_url,
        "TOKENEDGE_SERVER_ADMIN_TOKEN": "bench-admin",
        "TOKENEDGE_SERVER_HOST": "127.0.0.1",
    }
    try:
        with (
            server(
                [PYTHON, "-m", "harness.peers.servers", "upstream", str(up_port)],
                f"http://127.0.0.1:{up_port}/health",
            ),
            server(
                [PYTHON, "-m", "gateway", "--workers", "2", "--port", str(a_port)],
                f"http://127.0.0.1:{a_port}/health",
                env,
            ),
            server(
                [PYTHON, "-m", "gateway", "--port", str(b_port)], f"http://127.0.0.1:{b_port}/health", env
            ),
        ):
            urls = [f"http://127.0.0.1:{a_port}", f"http://127.0.0.1:{b_port}"]
            wait_http(urls[1] + "/health")
            rows = [
                asyncio.run(one_purge(urls, redis_url, kind, r * 3 + k, processes=3))
                for r in range(repeats)
                for k, kind in enumerate(("key", "tag", "model"))
            ]
    finally:
        redis.stop()
    print_rows(rows)
    write_results("coherence", {"rows": rows})


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(
        f"purge coherence: 3 processes (--workers 2 + 1 replica) on one Redis, {K} entries purged, "
        f"{REQUESTS_AFTER} requests after each purge"
    )
    print(
        f"{'kind':<6} {'n':>3} {'confirmed':>9} {'stale':>6} {'call ms p50/max':>16} "
        f"{'last ack ms p50/max':>20} {'lag ms max':>10}"
    )
    for kind in ("key", "tag", "model"):
        mine = [r for r in rows if r["kind"] == kind]
        call = [r["call_ms"] for r in mine]
        last = [r["last_ack_ms"] for r in mine]
        print(
            f"{kind:<6} {len(mine):>3} {min(r['confirmed'] for r in mine):>9} "
            f"{sum(r['stale_answers'] for r in mine):>6} "
            f"{statistics.median(call):>7.1f}/{max(call):<8.1f} {statistics.median(last):>9.1f}/{max(last):<10.1f} "
            f"{max(r['max_lag_ms'] for r in mine):>10.2f}"
        )
