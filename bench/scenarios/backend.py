"""The tokenedge backend vs llama.cpp's own `llama-server` (native build, harness/peers/llamacpp_build.py) over
HTTP, on the same weights, the same free-text chat prompts and the same threads, streamed; plus `llama-bench`,
engine to engine, beside our engine alone measured its way (bench/scenarios/engine_alone.py), and each side's
batch-1 decode against the machine's memory roofline (bench/measure/roofline.py).

The peer at its best: the weights are requantized with llama.cpp's own `llama-quantize` into each of its 4-bit
formats and measured with `llama-bench` (harness/peers/llamacpp_formats.py); `llama-server` runs the fastest
one for the machine and thread count, and a second `llama-server` on the shipped file's format stays beside it (unless that is
the fastest). Ours runs the file as given. Every table names the format each side ran, the CPU and the threads.

All servers run together and are measured in rounds whose order rotates (and reverses every other round); medians
are reported, because the machine is shared. Each request opens with its own round/slot tag, so no side's prefix
cache serves a prompt seen before (the chat template's shared system preamble is cached by all alike). Per
request: time to first token, and decode tokens/s after the first token (`usage.completion_tokens`, asked with
`include_usage`). Batch 1: one request at a time. Concurrent: N at once (`llama-server -np N`; ours batches
continuously), aggregate completion tokens over wall time. No side can ignore EOS over the OpenAI API, so the
median completion length of each side is printed beside its rates. Ours runs its defaults (`python -m backend`).
`--shape` runs a random-weight model of a real shape instead (harness/models/random_gguf.py): speed only, and
marked so.

    python -m bench backend [--rounds 3] [--max-tokens 48] [--concurrency 8] [--threads 1,2]
                            [--shape smollm2-1.7b | --model FILE.gguf] [--formats Q4_0,Q4_1,...]
                            [--peer-format Q4_0]
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
from bench.measure.engine import engine_rates
from bench.measure.load import write_results
from bench.measure.roofline import Bandwidth, measure_bandwidth, roofline_line
from harness.models.random_gguf import SHAPES, random_model
from harness.peers.llama_server import llama_server
from harness.peers.llamacpp_build import LlamaBuild, ensure_build
from harness.peers.llamacpp_formats import FORMATS, fastest, format_table, measure_formats, shipped_format
from harness.processes import PYTHON, free_port, server

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
    """Every side once: batch 1 over the topics, then `concurrency` at once; the order rotates round by round
    and reverses every other round, so no side always follows the same one."""
    sides = list(urls)
    turn = r % len(sides)
    order = sides[turn:] + sides[:turn]
    order = order if r % 2 == 0 else list(reversed(order))
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
    """Every side's medians, ours first, and ours over each peer's."""
    ours, *peers = result
    print(header)
    print(f"{'measure (median)':<22} " + " ".join(f"{side:>30}" for side in result), end="")
    print("".join(f" {'ours / ' + peer.split()[1]:>14}" for peer in peers))
    for key in result[ours]:
        values = [result[side][key] for side in result]
        ratios = [values[0] / result[p][key] if result[p][key] else float("nan") for p in peers]
        print(
            f"{key:<22} " + " ".join(f"{v:>30.1f}" for v in values) + "".join(f" {r:>14.2f}" for r in ratios)
        )


@dataclass(frozen=True, slots=True)
class Setup:
    """What one comparison runs: the model file, each side's label and file, the threads."""

    model: Path
    marked: str  # "" or " (random weights, speed only)"
    threads: int
    sides: dict[str, Path]  # label -> GGUF; ours first


def http_rounds(
    setup: Setup, args: argparse.Namespace, build: LlamaBuild
) -> tuple[dict[str, dict[str, float]], dict[str, object]]:
    """All servers up at once, a warm-up round, then the measured rounds: (medians by side, our runtime)."""
    with ExitStack() as stack:
        port = free_port()
        ours_label, *peers = setup.sides
        urls = {ours_label: f"http://127.0.0.1:{port}"}
        argv_ours = [PYTHON, "-m", "backend", "--port", str(port), "--threads", str(setup.threads)]
        argv_ours += ["--model", str(setup.model), "--served-model-name", ALIAS]
        if setup.marked:  # random weights repeat themselves: prompt-lookup drafts would pass for decode speed
            argv_ours += ["--speculative-tokens", "0"]
        stack.enter_context(server(argv_ours, f"{urls[ours_label]}/health", ready_timeout_s=900))
        for label in peers:
            peer = stack.enter_context(
                llama_server(
                    build,
                    setup.sides[label],
                    alias=ALIAS,
                    slots=args.concurrency,
                    threads=setup.threads,
                    ctx_per_slot=512 if setup.marked else 2048,  # a big model's KV at 2048 x 8 is GBs
                )
            )
            urls[label] = peer.url
        with urllib.request.urlopen(f"{urls[ours_label]}/v1/models", timeout=10) as resp:
            runtime = json.load(resp)["data"][0].get("tokenedge", {}).get("runtime", {})
        asyncio.run(one_round(urls, -1, 8, 2))  # warm-up: every side's first requests, not measured
        rounds = [
            asyncio.run(one_round(urls, r, args.max_tokens, args.concurrency)) for r in range(args.rounds)
        ]
    return merged(rounds), runtime


def compare(
    setup: Setup, args: argparse.Namespace, build: LlamaBuild, bandwidth: Bandwidth
) -> dict[str, object]:
    """One thread count: the HTTP table, llama-bench and ours alone, and the roofline line per side."""
    result, runtime = http_rounds(setup, args, build)
    print_table(
        result,
        f"\nHTTP, streamed, greedy, max_tokens {args.max_tokens}, {setup.threads} thread(s) each, {cpu_model()}, "
        f"{len(TOPICS)} batch-1 prompts + {args.concurrency} concurrent, {args.rounds} rotating rounds; "
        f"model {setup.model.name}{setup.marked}",
    )
    engines = {
        label: llama_bench(build, path, setup.threads) for label, path in list(setup.sides.items())[1:]
    }
    ours_label = next(iter(setup.sides))
    ours_alone = engine_rates(setup.threads, setup.model)
    for label, rates in engines.items():
        shown = ", ".join(f"{k} {v:.1f}" for k, v in rates.items() if isinstance(v, float))
        print(f"llama-bench {label.removeprefix('llama-server ')}, {setup.threads} thread(s): {shown}")
    best = next(iter(engines.values()))
    print(
        f"ours alone ({ours_label}): "
        + ", ".join(
            f"{k} {v:.1f} ({v / float(best[k]):.2f}x the fastest format)"  # type: ignore[arg-type]
            for k, v in ours_alone.items()
        )
    )
    print(f"roofline, batch-1 decode over HTTP (bandwidth {bandwidth.describe()}; KV reads left out):")
    for label, path in setup.sides.items():
        print("  " + roofline_line(label, result[label]["batch1_decode_tok_s"], path, bandwidth))
    return {
        "threads": setup.threads,
        "sides": {k: str(v) for k, v in setup.sides.items()},
        "http": result,
        "llama_bench": engines,
        "ours_alone": ours_alone,
        "ours_runtime": runtime,
    }


def model_of(args: argparse.Namespace) -> tuple[Path, str]:
    if args.shape:
        return random_model(args.shape), " (random weights, speed only)"
    return (Path(args.model) if args.model else default_model_path()), ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench backend", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", default="1,2", help="a comma list: one comparison per thread count")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="a random-weight model of this shape")
    parser.add_argument("--model", help="a GGUF file (default: the shipped SmolLM2)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="llama.cpp formats to measure")
    parser.add_argument("--peer-format", help="run llama-server on this format, not the fastest measured")
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    build = ensure_build()
    model, marked = model_of(args)
    shipped = shipped_format(model)
    print(
        f"CPU: {cpu_model()}\nbuild: {build.describe()}\nmodel: {model.name} ({shipped}){marked}", flush=True
    )
    bandwidths = {t: measure_bandwidth(t) for t in sorted({1, *threads})}
    for bw in bandwidths.values():
        print(f"memory bandwidth, {bw.describe()}")
    formats = [*args.formats.split(","), *([args.peer_format] if args.peer_format else [])]
    rows = measure_formats(build, model, threads, formats)
    print(format_table(rows, shipped, cpu_model()))
    runs = []
    for t in threads:
        best = fastest(rows, t)
        if args.peer_format:  # a noisy machine can misrank close formats: the choice can be pinned
            best = next(r for r in rows if r.threads == t and r.format == args.peer_format)
        note = "fastest" if best == fastest(rows, t) else "chosen"
        note += ", shipped" if best.format == shipped else ""
        sides = {f"tokenedge {shipped}": model, f"llama-server {best.format} ({note})": best.path}
        if best.format != shipped:
            sides[f"llama-server {shipped} (shipped)"] = model
        runs.append(compare(Setup(model, marked, t, sides), args, build, bandwidths[t]))
    payload = {
        "cpu": cpu_model(),
        "build": build.describe(),
        "model": model.name + marked,
        "bandwidth": {t: [b.copy_bytes_s, b.sum_bytes_s] for t, b in bandwidths.items()},
        "formats": [[r.format, r.threads, r.pp_tok_s, r.tg_tok_s] for r in rows],
        "runs": runs,
    }
    print(f"results: {write_results('backend', payload)}")
