"""What a streamed miss pays for the gateway: time to first token through the gateway against the engine asked
directly, on unique prompts (every request a miss), paired and alternated (issue 34's miss-cost check).

Each pair is two fresh prompts of the same shape and token length (a shared system prompt, as production chat
traffic has, then a unique question): one asked through the gateway, one asked of the engine directly; which goes
first alternates from pair to pair, so drift and the engine's prefix cache help both sides alike. Batch 1 asks one
pair at a time; `--concurrency 8` asks 8 gateway requests at once, then 8 direct ones (the order alternating).
The table gives each side's TTFT p50/p90 and the per-pair difference (gateway minus direct), p50/p90.
`python -m bench gateway_miss [--pairs N] [--upstream URL]`: without `--upstream` it starts `python -m backend`
(the default SmolLM2 model) and a gateway in front of it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import time
from contextlib import ExitStack

import aiohttp

from bench.measure.load import write_results
from harness.processes import PYTHON, free_port, server

HEADERS = {"Authorization": "Bearer bench-tenant", "Content-Type": "application/json"}
SYSTEM = "You are a concise assistant for a travel company. Answer in one short sentence."
CITIES = ("Lisbon", "Oslo", "Quito", "Hanoi", "Dakar", "Perth", "Lima", "Riga", "Cusco", "Turku")
_serial = itertools.count()


def prompt(model: str) -> dict[str, object]:
    n = next(_serial)
    city = CITIES[n % len(CITIES)]
    question = f"Trip {n:05d}: what should I pack for {city} in spring?"  # fixed width: equal token counts
    return {
        "model": model,
        "temperature": 0,
        "max_tokens": 8,
        "stream": True,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
    }


async def ttft(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> float:
    started = time.perf_counter()
    async with session.post(url, json=body, headers=HEADERS) as resp:
        assert resp.status == 200, await resp.text()
        first = None
        async for line in resp.content:
            if first is None and line.startswith(b"data: {") and b'"content":"' in line:
                first = time.perf_counter() - started
        if first is None:
            raise RuntimeError("stream ended without content")
        return first


async def pairs(
    gateway: str, direct: str, model: str, count: int, concurrency: int
) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    async with aiohttp.ClientSession() as session:
        for _ in range(3):  # warm-up: connections, the engine's shared system-prompt blocks
            await ttft(session, direct, prompt(model))
            await ttft(session, gateway, prompt(model))
        for round_no in range(count // concurrency):
            sides = [gateway, direct] if round_no % 2 == 0 else [direct, gateway]
            got: dict[str, list[float]] = {}
            for url in sides:
                got[url] = list(
                    await asyncio.gather(*(ttft(session, url, prompt(model)) for _ in range(concurrency)))
                )
            out += list(zip(got[gateway], got[direct], strict=True))
    return out


def summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    def pct(values: list[float], q: int) -> float:
        return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) > 1 else values[0] * 1000

    gw, direct = [g for g, _ in samples], [d for _, d in samples]
    diff = [g - d for g, d in samples]
    return {
        "gateway_p50_ms": pct(gw, 50),
        "gateway_p90_ms": pct(gw, 90),
        "direct_p50_ms": pct(direct, 50),
        "direct_p90_ms": pct(direct, 90),
        "added_p50_ms": pct(diff, 50),
        "added_p90_ms": pct(diff, 90),
        "added_median_of_p50s_ms": pct(gw, 50) - pct(direct, 50),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench gateway_miss", description=__doc__)
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--upstream", default="", help="an engine already running (else python -m backend)")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        backend = args.upstream
        if not backend:
            port = free_port()
            backend = f"http://127.0.0.1:{port}"
            command = [PYTHON, "-m", "backend", "--port", str(port)]
            stack.enter_context(server(command, f"{backend}/health", ready_timeout_s=300))
        gw_port = free_port()
        gateway = f"http://127.0.0.1:{gw_port}"
        env = {"TOKENEDGE_UPSTREAM_URL": backend}
        stack.enter_context(
            server([PYTHON, "-m", "gateway", "--port", str(gw_port)], f"{gateway}/health", env=env)
        )
        import json
        import urllib.request

        with urllib.request.urlopen(f"{backend}/v1/models", timeout=10) as resp:
            model = json.load(resp)["data"][0]["id"]
        load_before = round(os.getloadavg()[0], 2)
        results = {}
        for concurrency in (1, 8):
            samples = asyncio.run(
                pairs(
                    f"{gateway}/v1/chat/completions",
                    f"{backend}/v1/chat/completions",
                    model,
                    args.pairs,
                    concurrency,
                )
            )
            results[f"c{concurrency}"] = summary(samples)
    print(
        f"\nStreamed misses, gateway vs engine direct, unique prompts, {args.pairs} pairs, load {load_before}"
    )
    print(f"{'concurrency':<12} {'gw p50':>8} {'gw p90':>8} {'dir p50':>8} {'dir p90':>8} {'added p50':>10} {'added p90':>10}")  # fmt: skip
    for name, r in results.items():
        print(
            f"{name:<12} {r['gateway_p50_ms']:>8.2f} {r['gateway_p90_ms']:>8.2f} {r['direct_p50_ms']:>8.2f} "
            f"{r['direct_p90_ms']:>8.2f} {r['added_p50_ms']:>10.2f} {r['added_p90_ms']:>10.2f}"
        )
    print("goal: added p50 <= 2 ms at batch 1")
    print(f"results: {write_results('gateway_miss', results)}")


if __name__ == "__main__":
    main()
