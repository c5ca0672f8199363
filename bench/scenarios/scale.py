"""`python -m bench scale`: misses over three backends, direct round-robin vs the gateway's router, same run.

Three fake prefix-cache backends (harness/prefix_backend.py, one process each): each answers after a fixed
5 ms plus PREFILL_US per prompt character its bounded prefix cache does not hold, then streams its answer, so
time to first token follows prefix hits the way a real engine's prefill does. This is a model of an engine, not
one: the numbers compare routing policies, not model servers. The workload (harness/conversations.py):
CONVERSATIONS conversations x TURNS turns, 4 shared system prompts, turn by turn, every request a streamed miss.
Modes, alternated twice so drift on a shared machine hits all alike:
- direct round-robin: the client sends request n to backend n % 3 (no gateway);
- router, affinity off: through one gateway process, least outstanding requests;
- router, affinity on: through one gateway process, prefix affinity (the default).
Reported: misses per second, TTFT p50/p99, the share of prompt characters the backends found cached, and the
busiest backend's request count over the mean.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from bench.measure.load import pct
from harness.conversations import (
    BackendProc,
    post_chat_stream,
    prefix_backends,
    run_conversations,
    stats,
)
from harness.replicas import start_replica, stop_replica

PREFILL_US = 200.0  # ~0.8 ms per token at 4 characters a token: a small model's CPU prefill
BACKEND_ARGS = ("--capacity", "4096", "--prefill-us", str(PREFILL_US), "--base-ms", "5")
Row = dict[str, float]


async def measure(
    session: aiohttp.ClientSession,
    backends: list[BackendProc],
    url_for: Callable[[], str],
    conversations: int,
    turns: int,
) -> Row:
    await stats(session, backends, reset=True)
    ttfts: list[float] = []

    async def send(c: int, t: int, messages: list[dict[str, Any]]) -> str:
        answer, ttft = await post_chat_stream(session, url_for(), messages)
        ttfts.append(ttft)
        return answer

    started = time.perf_counter()
    result = await run_conversations(send, conversations, turns)
    elapsed = time.perf_counter() - started
    counts = await stats(session, backends)
    loads = [s["requests"] for s in counts]
    return {
        "rps": result.completed / elapsed,
        "ttft_p50_ms": pct(ttfts, 0.5),
        "ttft_p99_ms": pct(ttfts, 0.99),
        "hit_pct": 100
        * sum(s["hit_tokens"] for s in counts)
        / max(1, sum(s["prompt_tokens"] for s in counts)),
        "max_over_mean": max(loads) / (sum(loads) / len(loads)),
        "failures": float(len(result.failures)),
    }


async def direct(
    session: aiohttp.ClientSession, backends: list[BackendProc], conversations: int, turns: int
) -> Row:
    turn = itertools.count()
    return await measure(session, backends, lambda: backends[next(turn) % 3].url, conversations, turns)


async def through_gateway(
    session: aiohttp.ClientSession,
    backends: list[BackendProc],
    affinity: bool,
    conversations: int,
    turns: int,
) -> Row:
    env = {
        "TOKENEDGE_UPSTREAM_AFFINITY": "true" if affinity else "false",
        "TOKENEDGE_CACHE_WARM_FILL_TOP": "0",
    }
    gw = await start_replica(",".join(b.url for b in backends), env)
    try:
        await wait_ready(session, gw.url)
        return await measure(session, backends, lambda: gw.url, conversations, turns)
    finally:
        await stop_replica(gw)


async def wait_ready(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(100):
        async with session.get(url + "/ready") as resp:
            if resp.status == 200:
                return
        await asyncio.sleep(0.1)
    raise RuntimeError("gateway not ready")


async def bench(conversations: int, turns: int) -> None:
    rows: list[tuple[str, Row]] = []
    async with prefix_backends(3, *BACKEND_ARGS) as backends, aiohttp.ClientSession() as session:
        for attempt in (1, 2):
            modes: list[tuple[str, Callable[[], Awaitable[Row]]]] = [
                ("direct round-robin", lambda: direct(session, backends, conversations, turns)),
                (
                    "router, affinity off",
                    lambda: through_gateway(session, backends, False, conversations, turns),
                ),
                (
                    "router, affinity on",
                    lambda: through_gateway(session, backends, True, conversations, turns),
                ),
            ]
            for name, run in modes:
                rows.append((f"{name} (run {attempt})", await run()))
    report(rows, conversations, turns)


def report(rows: list[tuple[str, Row]], conversations: int, turns: int) -> None:
    print(
        f"\nscale: 3 fake prefix-cache backends (5 ms + {PREFILL_US:.0f} us per uncached prompt character), "
        f"{conversations} conversations x {turns} turns, 4 shared system prompts, streamed misses"
    )
    print("| mode | misses/s | TTFT p50 ms | TTFT p99 ms | prompt cached % | busiest / mean | failed |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows:
        print(
            f"| {name} | {row['rps']:.1f} | {row['ttft_p50_ms']:.1f} | {row['ttft_p99_ms']:.1f} | "
            f"{row['hit_pct']:.0f} | {row['max_over_mean']:.2f} | {row['failures']:.0f} |"
        )


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench scale")
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args(list(argv))
    asyncio.run(bench(args.conversations, args.turns))


if __name__ == "__main__":
    main()
