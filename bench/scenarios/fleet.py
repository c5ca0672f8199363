"""`python -m bench fleet`: routing policies on real engines, arms alternated in one run (issue 37).

Two native `llama-server` processes (one slot, one thread each), started fresh for every arm, serve a scaled-down
SGLang "generated-shared-prefix" workload: GROUPS groups x QUESTIONS questions, a ~300-token system prompt per group,
every question unique (the response cache never answers), `max_tokens` 8, streamed, concurrency 2. Arms:
- `client_rr`: the client sends request n to engine n % 2 (no gateway);
- `least_loaded`, `affinity`, `cost`: through one in-process gateway with that `upstream.routing_policy`.
Truth is the engines' own count: each answer's `usage.prompt_tokens_details.cached_tokens` over its prompt tokens
(llama-server reports both). Reported per arm: prefix reuse, TTFT p50/p90/mean, wall time, requests per engine,
and pile-up: the share of busy time in which one engine held >= 2 requests while the other held none (from the
client's request intervals). The shared-prefix ideal here is (questions - 1) / questions of the system prompt.
On a loaded machine read the ratios between arms of one run, not the absolute times.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import aiohttp
import orjson

from backend.loader import default_model_path
from bench.measure.load import pct
from gateway.upstream.routing.attempt import BACKEND_HEADER
from harness.gateway import FakeClock, gateway_config, start_gateway
from harness.peers.llama_server import LlamaServer, llama_server
from harness.peers.llamacpp_build import ensure_build

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


async def run_arm(arm: str, urls: list[str], requests: list[list[dict[str, str]]], concurrency: int) -> Row:
    gateway = None
    if arm != "client_rr":
        upstream = {"routing_policy": arm, "model_revision": "llama.cpp-bench", "read_timeout_s": 120.0}
        config = gateway_config(",".join(urls), upstream=upstream)
        gateway = await start_gateway(config, FakeClock())
    turn = itertools.count()
    url_for: Callable[[], str] = (lambda: gateway.url) if gateway else (lambda: urls[next(turn) % len(urls)])
    queue = list(requests)
    rows: list[Row] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        while queue:
            rows.append(await stream_one(session, url_for(), queue.pop(0)))

    started = time.perf_counter()
    try:
        # a fresh connection per request: llama-server may close an idle keep-alive one as it is reused
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    finally:
        if gateway is not None:
            await gateway.close()
    wall = time.perf_counter() - started
    names = [u.removeprefix("http://") for u in urls]
    ttfts = [r["ttft_s"] for r in rows]
    return {
        "arm": arm,
        "reuse": sum(r["cached"] for r in rows) / max(1, sum(r["prompt"] for r in rows)),
        "ttft_p50_ms": pct(ttfts, 0.5),
        "ttft_p90_ms": pct(ttfts, 0.9),
        "ttft_mean_ms": statistics.fmean(ttfts) * 1000,
        "wall_s": wall,
        "per_engine": [sum(1 for r in rows if r["engine"] == n) for n in names],
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
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    results = []
    for run, arm in enumerate(a for _ in range(args.repeats) for a in arms):
        with fresh_engines(2) as engines:
            requests = workload(args.groups, args.questions, run)
            row = asyncio.run(run_arm(arm, [e.url for e in engines], requests, args.concurrency))
        results.append(row)
        print_row(row)
    ideal = (args.questions - 1) / args.questions
    print(f"ideal shared-prefix reuse ~ {ideal:.3f} of the system prompt share of each prompt")


def print_row(row: Row) -> None:
    print(
        f"{row['arm']:>13}  reuse {row['reuse']:.3f}  TTFT p50 {row['ttft_p50_ms']:.0f} p90 {row['ttft_p90_ms']:.0f}"
        f" mean {row['ttft_mean_ms']:.0f} ms  wall {row['wall_s']:.1f} s  per engine {row['per_engine']}"
        f"  pile-up {row['pile_up']:.0%}  failed {row['failed']}",
        flush=True,
    )
