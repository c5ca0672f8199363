"""The tokenedge backend vs llama.cpp's own `llama-server` (native build, bench/llamacpp_build.py) over HTTP, on
the same GGUF, the same free-text chat prompts and the same threads, streamed; plus `llama-bench`, engine to engine,
beside our engine alone measured its way (bench/engine_alone.py).

Both servers run together and are measured in alternating rounds (which side goes first alternates too); medians
are reported, because the machine is shared. Each request opens with its own round/slot tag, so neither side's
prefix cache serves a prompt seen before (the chat template's shared system preamble is cached by both alike).
Per request: time to first token, and decode tokens/s after the first token (`usage.completion_tokens`, asked with
`include_usage`). Batch 1: one request at a time. Concurrent: N at once (`llama-server -np N`; ours batches
continuously), aggregate completion tokens over wall time. Neither side can ignore EOS over the OpenAI API, so the
median completion length of each side is printed beside its rates. Ours runs its defaults (`python -m backend`).

    python -m bench backend [--rounds 3] [--max-tokens 48] [--concurrency 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from backend.loader import default_model_path
from backend.runtime import cpu_model
from bench.engine_alone import engine_rates
from bench.harness import PYTHON, free_port, server, write_results
from bench.llama_server import llama_server
from bench.llamacpp_build import LlamaBuild, ensure_build

ALIAS = "HuggingFaceTB/SmolLM2-135M-Instruct"
TOPICS = [
    "a lighthouse keeper who finds a map",
    "the history of the printing press",
    "how bees build their hives",
    "a robot learning to paint",
    "why the sea is salty",
    "a journey across a desert by train",
    "how bread rises",
    "a city built under the ocean",
]


@dataclass(frozen=True, slots=True)
class Timing:
    ttft_s: float
    total_s: float
    tokens: int

    @property
    def decode_tok_s(self) -> float:
        return (self.tokens - 1) / (self.total_s - self.ttft_s) if self.tokens > 1 else 0.0


def body(tag: str, topic: str, max_tokens: int) -> dict[str, object]:
    return {
        "model": ALIAS,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"[{tag}] Write a long, detailed story about {topic}."}],
    }


async def streamed(session: aiohttp.ClientSession, url: str, request: dict[str, object]) -> Timing:
    started = time.perf_counter()
    first: float | None = None
    tokens = 0
    async with session.post(f"{url}/v1/chat/completions", json=request) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            if first is None and any(
                (c.get("delta") or {}).get("content") for c in event.get("choices") or []
            ):
                first = time.perf_counter()
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
    end = time.perf_counter()
    assert first is not None and tokens > 0, f"{url}: no content or no usage"
    return Timing(first - started, end - started, tokens)


async def one_round(
    urls: dict[str, str], r: int, max_tokens: int, concurrency: int
) -> dict[str, dict[str, list[float]]]:
    """Every side once: batch 1 over the topics, then `concurrency` at once; sides in alternating order."""
    order = list(urls) if r % 2 == 0 else list(reversed(urls))
    out: dict[str, dict[str, list[float]]] = {}
    timeout = aiohttp.ClientTimeout(total=600)
    # a connection per request: llama-server (cpp-httplib) may close a kept-alive one after a stream
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for side in order:
            single = [
                await streamed(session, urls[side], body(f"r{r}-b{i}", t, max_tokens))
                for i, t in enumerate(TOPICS)
            ]
            started = time.perf_counter()
            requests = [body(f"r{r}-c{i}", TOPICS[i % len(TOPICS)], max_tokens) for i in range(concurrency)]
            batch = await asyncio.gather(*(streamed(session, urls[side], q) for q in requests))
            wall = time.perf_counter() - started
            out[side] = {
                "batch1_decode_tok_s": [t.decode_tok_s for t in single],
                "batch1_ttft_ms": [t.ttft_s * 1000 for t in single],
                "batch1_tokens": [float(t.tokens) for t in single],
                "concurrent_tok_s": [sum(t.tokens for t in batch) / wall],
                "concurrent_ttft_ms": [t.ttft_s * 1000 for t in batch],
            }
    return out


def llama_bench(build: LlamaBuild, model: Path, threads: int) -> dict[str, object]:
    """llama-bench's prompt (128 tokens) and generation (32 tokens) rates, engine only, 3 repetitions."""
    argv = [
        str(build.bench),
        "-m",
        str(model),
        "-t",
        str(threads),
        "-p",
        "128",
        "-n",
        "32",
        "-r",
        "3",
        "-o",
        "json",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600)
    rows = json.loads(done.stdout)
    rates: dict[str, object] = {}
    for row in rows:
        name = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
        rates[f"{name}_tok_s"] = float(row["avg_ts"])
    rates["llama_bench_cpu_info"] = rows[0].get("cpu_info", "")
    return rates


def merged(rounds: list[dict[str, dict[str, list[float]]]]) -> dict[str, dict[str, float]]:
    """Each side's median of every measure over all rounds."""
    sides = rounds[0].keys()
    return {
        side: {k: statistics.median([v for r in rounds for v in r[side][k]]) for k in rounds[0][side]}
        for side in sides
    }


def print_table(result: dict[str, dict[str, float]], header: str) -> None:
    print(header)
    print(f"{'measure (median)':<28} {'tokenedge':>12} {'llama-server':>14} {'ours / theirs':>14}")
    for key in result["tokenedge"]:
        ours, theirs = result["tokenedge"][key], result["llama-server"][key]
        ratio = ours / theirs if theirs else float("nan")
        print(f"{key:<28} {ours:>12.1f} {theirs:>14.1f} {ratio:>14.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench backend", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    build, model = ensure_build(), default_model_path()
    print(f"CPU: {cpu_model()}\nbuild: {build.describe()}", flush=True)
    with ExitStack() as stack:
        port = free_port()
        ours = f"http://127.0.0.1:{port}"
        argv_ours = [PYTHON, "-m", "backend", "--port", str(port), "--threads", str(args.threads)]
        stack.enter_context(
            server([*argv_ours, "--served-model-name", ALIAS], f"{ours}/health", ready_timeout_s=300)
        )
        peer = stack.enter_context(
            llama_server(build, model, alias=ALIAS, slots=args.concurrency, threads=args.threads)
        )
        urls = {"tokenedge": ours, "llama-server": peer.url}
        with urllib.request.urlopen(f"{ours}/v1/models", timeout=10) as resp:
            runtime = json.load(resp)["data"][0].get("tokenedge", {}).get("runtime", {})
        asyncio.run(one_round(urls, -1, 8, 2))  # warm-up: both sides' first requests, not measured
        rounds = [
            asyncio.run(one_round(urls, r, args.max_tokens, args.concurrency)) for r in range(args.rounds)
        ]
    ours_alone = engine_rates(args.threads)  # engine to engine, back to back with llama-bench
    engines = llama_bench(build, model, args.threads)
    result = merged(rounds)
    print_table(
        result,
        f"\nHTTP, streamed, greedy, max_tokens {args.max_tokens}, {args.threads} threads each, "
        f"{len(TOPICS)} batch-1 prompts + {args.concurrency} concurrent, {args.rounds} alternating rounds",
    )
    print(
        f"\nllama-bench (engine only, {args.threads} threads): "
        + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in engines.items())
    )
    print(
        "ours alone (bench/engine_alone.py): "
        + ", ".join(
            f"{k} {v:.1f} ({v / float(engines[k]):.2f}x llama-bench)"  # type: ignore[arg-type]
            for k, v in ours_alone.items()
        )
    )
    payload = {
        "cpu": cpu_model(),
        "build": build.describe(),
        "ours_runtime": runtime,
        "http": result,
        "llama_bench": engines,
        "ours_alone": ours_alone,
    }
    print(f"results: {write_results('backend', payload)}")
