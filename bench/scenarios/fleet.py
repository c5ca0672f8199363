"""`python -m bench fleet`: routing policies on real engines, arms alternated in one run (issue 37).

Two engines, started fresh for every arm (`--engine llama`: native `llama-server`, one slot and one thread each;
`--engine llama-slot`: the same with its slot cache only, `--cache-ram 0`; `--engine ours`: our backend, `python -m
backend`, one torch thread each; a comma list runs several), serve one of two workloads
(`--workload`, harness/fleet.py): `shared_prefix`, a scaled-down SGLang "generated-shared-prefix" (GROUPS groups x
QUESTIONS questions, a ~550-token system prompt per group, shuffled), or `multi_turn`, a scaled-down vLLM
production-stack multi-round QA (USERS users, each with its own ~300-token document, ROUNDS rounds each sending the
whole history plus a new question and appending the answer; users as concurrent loops). Every question is unique
(the response cache never answers), `max_tokens` 8, streamed, temperature 0, concurrency 2. Arms:
- `client_rr`: the client sends request n to engine n % 2 (no gateway);
- `least_loaded`, `affinity`, `cost`: through one in-process gateway with that `upstream.routing_policy`;
- `<policy>@<N>w` (`cost@1w`, `cost@2w`): through a `python -m gateway --workers N` process whose L2 is a
  redis-server the bench starts (flushed between arms), so workers share placement through it as a deployment's
  would; the kernel spreads the bench's connections (one per request) over the workers.
Truth is the engines' own count: each answer's `usage.prompt_tokens_details.cached_tokens` over its prompt tokens
(both engines report both), and, beside it, the engines' `/metrics` counters at the end of the arm (cached over
cached plus computed; "-" where an engine has none). Reported per arm: prefix reuse, the ideal reuse, TTFT
p50/p90/mean, wall time, requests per engine, pile-up (the share of busy time in which one engine held >= 2 requests
while the other held none, from the client's request intervals) and the gateway's reasons (`X-Tokenedge-Route`; a
an answer that names no engine, as a binary-transport miss did before wave 7, gets its requests per engine from the
engines' counters, the reason "unlabelled" and pile-up "-"); at the end a table per (workload,
engine) of each arm's medians over the repeats and the cost arms' mean TTFT and wall over the better of client_rr
and least_loaded. The ideal of shared_prefix is (questions - 1) / questions of the system prompt's share of each
prompt; that of multi_turn is computed from the rows (harness.fleet.multi_turn_ideal), of all prompt tokens.
`--upstream KEY=VALUE` sets an `[upstream]` field for every gateway arm (`queue_beside_idle_share=0`). On a loaded
machine read the ratios between arms of one run, not the absolute times: the in-process arms also share the bench's
own process.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import statistics
import time
import tomllib
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.measure.fleet_engines import ALIAS, ENGINES, REVISIONS, engine_metrics, fresh_engines
from bench.measure.load import pct
from gateway.upstream.routing.attempt import BACKEND_HEADER, ROUTE_HEADER
from harness.fleet import (
    WORKLOADS,
    Ask,
    Messages,
    multi_turn_ideal,
    requests_from_metrics,
    reuse_from_metrics,
    run_queue,
    run_users,
    shared_prefix,
    shared_prefix_ideal,
    summary_lines,
)
from harness.gateway import FakeClock, gateway_config, start_gateway
from harness.services import RedisServer
from harness.workers import gateway_workers

ARMS = ("client_rr", "least_loaded", "affinity", "cost")  # pct (bench.measure.load) returns milliseconds
Row = dict[str, Any]


@dataclass(frozen=True)
class Setup:
    """One (workload, engine) of the run and the sizes its arms share."""

    workload: str
    engine: str
    concurrency: int
    groups: int
    questions: int
    users: int
    rounds: int
    extra: dict[str, Any] = field(default_factory=dict)  # --upstream settings for every gateway arm


async def stream_one(session: aiohttp.ClientSession, url: str, messages: Messages) -> Row:
    body = {"model": ALIAS, "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    started = time.perf_counter()
    ttft: float | None = None
    usage: dict[str, Any] = {}
    answer: list[str] = []
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        served_by = resp.headers.get(BACKEND_HEADER, "")
        route = resp.headers.get(ROUTE_HEADER, "")
        if resp.status != 200:
            print(f"  HTTP {resp.status} from {served_by or url}: {(await resp.read())[:300]!r}", flush=True)
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            doc = orjson.loads(line[6:])
            if choices := doc.get("choices"):
                ttft = time.perf_counter() - started if ttft is None else ttft
                answer.append((choices[0].get("delta") or {}).get("content") or "")
            usage = doc.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    end = time.perf_counter()
    return {
        "served_by": served_by,
        "reason": route.partition("reason=")[2].partition(";")[0],
        "ttft_s": ttft if ttft is not None else end - started,
        "start": started,
        "end": end,
        "prompt": usage.get("prompt_tokens", 0),
        "cached": details.get("cached_tokens", 0),
        "completion": usage.get("completion_tokens", 0),
        "answer": "".join(answer),
        "status": resp.status,
    }


def pile_up(rows: list[Row], engines: list[str]) -> float:
    """Share of the busy time in which one engine held >= 2 requests while another held none."""
    events = sorted(
        [(r["start"], 1, r["served_by"]) for r in rows] + [(r["end"], -1, r["served_by"]) for r in rows]
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
    arm: str, urls: list[str], redis: RedisServer | None, setup: Setup
) -> AsyncIterator[str | None]:
    """Where the arm sends its requests: None for client round-robin, else a gateway's URL (in process, or a
    `--workers N` process on the bench's Redis for `<policy>@<N>w`)."""
    if arm == "client_rr":
        yield None
        return
    policy, _, workers = arm.partition("@")
    upstream = {
        "routing_policy": policy,
        "model_revision": REVISIONS[setup.engine],
        "read_timeout_s": 120.0,
        **setup.extra,
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


async def drive(setup: Setup, ask: Ask, run: int) -> list[Row]:
    if setup.workload == "shared_prefix":
        requests = shared_prefix(setup.groups, setup.questions, run)
        return await run_queue(requests, ask, setup.concurrency)
    return await run_users(ask, setup.users, setup.rounds, setup.concurrency, run)


async def run_arm(arm: str, urls: list[str], setup: Setup, run: int, redis: RedisServer | None) -> Row:
    turn = itertools.count()
    # a fresh connection per request: llama-server may close an idle keep-alive one as it is reused
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        async with front(arm, urls, redis, setup) as gateway:

            async def ask(messages: Messages) -> Row:
                if gateway is not None:
                    return await stream_one(session, gateway, messages)
                url = urls[next(turn) % len(urls)]
                return {**await stream_one(session, url, messages), "served_by": url[7:], "reason": "client"}

            started = time.perf_counter()
            rows = await drive(setup, ask, run)
            wall = time.perf_counter() - started
            retention = await gateway_retention(session, gateway) if gateway is not None else None
        metrics = await engine_metrics(session, urls)
    names = [u.removeprefix("http://") for u in urls]
    # A gateway answer without X-Tokenedge-Backend (`--upstream route_headers=false`; before wave 7, every binary-
    # transport miss): requests per engine from the engines' own counters, and no pile-up (it needs each request's).
    attributed = all(r["served_by"] in names for r in rows)
    counted = [requests_from_metrics(t) for t in metrics]
    ttfts = [r["ttft_s"] for r in rows]
    ideal = (
        shared_prefix_ideal(setup.questions) if setup.workload == "shared_prefix" else multi_turn_ideal(rows)
    )
    return {
        "workload": setup.workload,
        "engine": setup.engine,
        "arm": arm,
        "reuse": sum(r["cached"] for r in rows) / max(1, sum(r["prompt"] for r in rows)),
        "engine_reuse": reuse_from_metrics(metrics),
        "ideal": ideal,
        "ttft_p50_ms": pct(ttfts, 0.5),
        "ttft_p90_ms": pct(ttfts, 0.9),
        "ttft_mean_ms": statistics.fmean(ttfts) * 1000,
        "wall_s": wall,
        "per_engine": [sum(1 for r in rows if r["served_by"] == n) for n in names] if attributed else counted,
        "reasons": dict(collections.Counter(r["reason"] or "unlabelled" for r in rows).most_common()),
        "pile_up": pile_up(rows, names) if attributed else None,
        "failed": sum(1 for r in rows if r["status"] != 200),
        "retention": retention,
    }


async def gateway_retention(session: aiohttp.ClientSession, gateway: str) -> list[float] | None:
    """What the gateway learnt each engine keeps of the prefixes it was sent (`tokenedge_routing_prefix_retention`,
    gateway/upstream/routing/retention.py), in its backends' order; None where its /metrics does not say."""
    async with session.get(gateway + "/metrics") as resp:
        if resp.status != 200:
            return None
        text = await resp.text()
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tokenedge_routing_prefix_retention{")
    ]
    return values or None


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench fleet")
    parser.add_argument("--workload", choices=[*WORKLOADS, "both"], default="shared_prefix")
    parser.add_argument(
        "--engine", default="llama", help=f"a comma list of {', '.join(ENGINES)} ('both': llama,ours)"
    )
    parser.add_argument("--groups", type=int, default=6, help="shared_prefix: system prompts")
    parser.add_argument("--questions", type=int, default=6, help="shared_prefix: questions per system prompt")
    parser.add_argument("--users", type=int, default=6, help="multi_turn: users, each with its own document")
    parser.add_argument("--rounds", type=int, default=4, help="multi_turn: rounds per user")
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
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse(argv)
    arms = [a for a in args.arms.split(",") if a]
    extra: dict[str, Any] = tomllib.loads("\n".join(args.upstream))
    workloads = WORKLOADS if args.workload == "both" else (args.workload,)
    engines = ("llama", "ours") if args.engine == "both" else tuple(args.engine.split(","))
    if not set(engines) <= set(ENGINES):
        raise SystemExit(f"--engine: one or more of {', '.join(ENGINES)}")
    sizes = (args.concurrency, args.groups, args.questions, args.users, args.rounds)
    results = []
    run = itertools.count()
    with ExitStack() as stack:
        redis = None
        if any("@" in a for a in arms):
            redis = RedisServer()
            redis.start()
            stack.callback(redis.stop)
        for workload, engine in itertools.product(workloads, engines):
            setup = Setup(workload, engine, *sizes, extra=extra)
            for arm in (a for _ in range(args.repeats) for a in arms):
                with fresh_engines(engine, 2) as urls:
                    row = asyncio.run(run_arm(arm, urls, setup, next(run), redis))
                results.append(row)
                print_row(row)
    for line in summary_lines(results):
        print(line)
    print(
        f"\nideal reuse: shared_prefix {shared_prefix_ideal(args.questions):.3f} of the system prompt's share of"
        " each prompt; multi_turn (from each arm's rows) the previous round's prompt and answer over all prompt"
        " tokens, an upper bound"
    )


def print_row(row: Row) -> None:
    engines = "-" if row["engine_reuse"] is None else f"{row['engine_reuse']:.3f}"
    piled = "-" if row["pile_up"] is None else f"{row['pile_up']:.0%}"
    print(
        f"{row['workload']:>13} {row['engine']:>5} {row['arm']:>13}  reuse {row['reuse']:.3f} (engines' counters {engines}, ideal {row['ideal']:.3f})  TTFT p50 {row['ttft_p50_ms']:.0f} p90 {row['ttft_p90_ms']:.0f}"
        f" mean {row['ttft_mean_ms']:.0f} ms  wall {row['wall_s']:.1f} s  per engine {row['per_engine']}"
        f"  pile-up {piled}  failed {row['failed']}  reasons {row['reasons']}"
        + (f"  retention {[round(v, 2) for v in row['retention']]}" if row.get("retention") else ""),
        flush=True,
    )
