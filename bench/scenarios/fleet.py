"""`python -m bench fleet`: routing policies on real engines, arms alternated in one run (issue 37).

Two native `llama-server` processes (one slot, one thread each), started fresh for every arm, serve a scaled-down
SGLang "generated-shared-prefix" workload: GROUPS groups x QUESTIONS questions, a ~300-token system prompt per group,
every question unique (the response cache never answers), `max_tokens` 8, streamed, concurrency 2. Arms:
- `client_rr`: the client sends request n to engine n % 2 (no gateway);
- `least_loaded`, `affinity`, `cost`: through one in-process gateway with that `upstream.routing_policy`;
- `<policy>@<N>w` (`cost@1w`, `cost@2w`): through a `python -m gateway --workers N` process whose L2 is a
  redis-server the bench starts (flushed between arms), so workers share placement through it as a deployment's
  would; the kernel spreads the bench's connections (one per request) over the workers.
Truth is the engines' own count: each answer's `usage.prompt_tokens_details.cached_tokens` over its prompt tokens
(llama-server reports both), and, beside it, the engines' `/metrics` counters at the end of the arm
(`prompt_tokens_cached_total` over it plus `prompt_tokens_total`). Reported per arm: prefix reuse, TTFT
p50/p90/mean, wall time, requests per engine, pile-up (the share of busy time in which one engine held >= 2 requests
while the other held none, from the client's request intervals) and the gateway's reasons (`X-Tokenedge-Route`).
`--upstream KEY=VALUE` sets an `[upstream]` field for every gateway arm (`queue_beside_idle_share=0`). The
shared-prefix ideal here is (questions - 1) / questions of the system prompt. On a loaded machine read the ratios
between arms of one run, not the absolute times: the in-process arms also share the bench's own process.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import random
import statistics
import time
import tomllib
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from typing import Any

import aiohttp
import orjson

from backend.loader import default_model_path
from bench.measure.load import pct
from gateway.upstream.routing.attempt import BACKEND_HEADER, ROUTE_HEADER
from harness.gateway import FakeClock, gateway_config, start_gateway
from harness.peers.llama_server import LlamaServer, llama_server
from harness.peers.llamacpp_build import ensure_build
from harness.services import RedisServer
from harness.workers import gateway_workers

ALIAS = "HuggingFaceTB/SmolLM2-135M-Instruct"
ARMS = ("client_rr", "least_loaded", "affinity", "cost")  # pct (bench.measure.load) returns milliseconds
Row = dict[str, Any]


def workload(groups: int, questions: int, run: int) -> list[list[dict[str, str]]]:
    """Requests in arrival order, shuffled with a seeded RNG as SGLang's bench does (seed 0: every arm gets the
    same order; in a fixed interleaving, client round-robin over an even number of groups would be affine)."""
    out = []
    for q in range(questions):
        for g in range(groups):
            system = " ".join(
                f"Rule {g}.{i}: answer group {g} questions about topic {i} briefly." for i in range(30)
            )
            question = f"Run {run}, question {q} for group {g}: which colour comes first?"
            out.append([{"role": "system", "content": system}, {"role": "user", "content": question}])
    random.Random(0).shuffle(out)
    return out


async def stream_one(session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]) -> Row:
    body = {"model": ALIAS, "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    started = time.perf_counter()
    ttft: float | None = None
    usage: dict[str, Any] = {}
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        engine = resp.headers.get(BACKEND_HEADER, url.removeprefix("http://"))
        route = resp.headers.get(ROUTE_HEADER, "")
        if resp.status != 200:
            print(f"  HTTP {resp.status} from {engine}: {(await resp.read())[:300]!r}", flush=True)
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            doc = orjson.loads(line[6:])
            if ttft is None and doc.get("choices"):
                ttft = time.perf_counter() - started
            usage = doc.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    end = time.perf_counter()
    return {
        "engine": engine,
        "reason": route.partition("reason=")[2].partition(";")[0] or "client",
        "ttft_s": ttft if ttft is not None else end - started,
        "start": started,
        "end": end,
        "prompt": usage.get("prompt_tokens", 0),
        "cached": details.get("cached_tokens", 0),
        "status": resp.status,
    }


def pile_up(rows: list[Row], engines: list[str]) -> float:
    """Share of the busy time in which one engine held >= 2 requests while another held none."""
    events = sorted(
        [(r["start"], 1, r["engine"]) for r in rows] + [(r["end"], -1, r["engine"]) for r in rows]
    )
    held = dict.fromkeys(engines, 0)
    busy = piled = 0.0
    last = events[0][0] if events else 0.0
    for t, delta, engine in events:
        span = t - last
        if any(held.values()):
            busy += span
            if max(held.values()) >= 2 and min(held.values()) == 0:
                piled += span
        held[engine] = held.get(engine, 0) + delta
        last = t
    return piled / busy if busy else 0.0


@asynccontextmanager
async def front(
    arm: str, urls: list[str], redis: RedisServer | None, extra: dict[str, Any]
) -> AsyncIterator[str | None]:
    """Where the arm sends its requests: None for client round-robin, else a gateway's URL (in process, or a
    `--workers N` process on the bench's Redis for `<policy>@<N>w`)."""
    if arm == "client_rr":
        yield None
        return
    policy, _, workers = arm.partition("@")
    upstream = {
        "routing_policy": policy,
        "model_revision": "llama.cpp-bench",
        "read_timeout_s": 120.0,
        **extra,
    }
    if not workers:
        gateway = await start_gateway(gateway_config(",".join(urls), upstream=upstream), FakeClock())
        try:
            yield gateway.url
        finally:
            await gateway.close()
        return
    assert redis is not None, "a <policy>@<N>w arm needs the bench's redis-server"
    redis.flush()
    env = {f"TOKENEDGE_UPSTREAM_{k.upper()}": str(v) for k, v in upstream.items()}
    env["TOKENEDGE_CACHE_REDIS_URL"] = redis.url
    async with gateway_workers(",".join(urls), int(workers.removesuffix("w")), env) as url:
        yield url


async def engine_reuse(session: aiohttp.ClientSession, urls: list[str]) -> float:
    """Cached over all prompt tokens, from the engines' own `/metrics` counters."""
    cached = computed = 0.0
    for url in urls:
        async with session.get(url + "/metrics") as resp:
            for line in (await resp.text()).splitlines():
                name, _, value = line.partition(" ")
                if name == "llamacpp:prompt_tokens_cached_total":
                    cached += float(value)
                elif name == "llamacpp:prompt_tokens_total":
                    computed += float(value)
    return cached / max(1.0, cached + computed)


async def run_arm(
    arm: str,
    urls: list[str],
    requests: list[list[dict[str, str]]],
    concurrency: int,
    redis: RedisServer | None,
    extra: dict[str, Any],
) -> Row:
    turn = itertools.count()
    queue = list(requests)
    rows: list[Row] = []
    # a fresh connection per request: llama-server may close an idle keep-alive one as it is reused
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        async with front(arm, urls, redis, extra) as gateway:

            async def worker() -> None:
                while queue:
                    url = gateway or urls[next(turn) % len(urls)]
                    rows.append(await stream_one(session, url, queue.pop(0)))

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            wall = time.perf_counter() - started
        from_metrics = await engine_reuse(session, urls)
    names = [u.removeprefix("http://") for u in urls]
    ttfts = [r["ttft_s"] for r in rows]
    return {
        "arm": arm,
        "reuse": sum(r["cached"] for r in rows) / max(1, sum(r["prompt"] for r in rows)),
        "engine_reuse": from_metrics,
        "ttft_p50_ms": pct(ttfts, 0.5),
        "ttft_p90_ms": pct(ttfts, 0.9),
        "ttft_mean_ms": statistics.fmean(ttfts) * 1000,
        "wall_s": wall,
        "per_engine": [sum(1 for r in rows if r["engine"] == n) for n in names],
        "reasons": dict(collections.Counter(r["reason"] for r in rows).most_common()),
        "pile_up": pile_up(rows, names),
        "failed": sum(1 for r in rows if r["status"] != 200),
    }


@contextmanager
def fresh_engines(count: int) -> Iterator[list[LlamaServer]]:
    build, model = ensure_build(), default_model_path()
    with ExitStack() as stack:
        servers = [
            stack.enter_context(llama_server(build, model, alias=ALIAS, slots=1, threads=1, metrics=True))
            for _ in range(count)
        ]
        yield servers


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench fleet")
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2, help="times each arm runs, alternated")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an [upstream] setting for every gateway arm, as TOML (queue_beside_idle_share=0.2)",
    )
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    extra: dict[str, Any] = tomllib.loads("\n".join(args.upstream))
    results = []
    with ExitStack() as stack:
        redis = None
        if any("@" in a for a in arms):
            redis = RedisServer()
            redis.start()
            stack.callback(redis.stop)
        for run, arm in enumerate(a for _ in range(args.repeats) for a in arms):
            with fresh_engines(2) as engines:
                requests = workload(args.groups, args.questions, run)
                row = asyncio.run(
                    run_arm(arm, [e.url for e in engines], requests, args.concurrency, redis, extra)
                )
            results.append(row)
            print_row(row)
    ideal = (args.questions - 1) / args.questions
    print(f"ideal shared-prefix reuse ~ {ideal:.3f} of the system prompt share of each prompt")


def print_row(row: Row) -> None:
    print(
        f"{row['arm']:>13}  reuse {row['reuse']:.3f} (engines' counters {row['engine_reuse']:.3f})  TTFT p50 {row['ttft_p50_ms']:.0f} p90 {row['ttft_p90_ms']:.0f}"
        f" mean {row['ttft_mean_ms']:.0f} ms  wall {row['wall_s']:.1f} s  per engine {row['per_engine']}"
        f"  pile-up {row['pile_up']:.0%}  failed {row['failed']}  reasons {row['reasons']}",
        flush=True,
    )
