"""What a streamed miss pays for the gateway: time to first token through the gateway against the engine asked
directly and against a bare aiohttp streaming proxy (one more hop and nothing else: the floor any Python proxy
pays), on unique prompts (every request a miss), in rotating rounds (issue 34's miss-cost check).

Every prompt is fresh and of the same shape and token length (a shared system prompt, as production chat traffic
has, then a unique fixed-width question). A round asks each side in turn, the order rotating from round to round, so
drift and the engine's prefix cache help every side alike: at batch 1 one request at a time, at 8 concurrent eight at
once. The table gives each side's TTFT p50/p90 and, for the gateway and the bare proxy, the per-sample difference
from the direct request of the same round (p50/p90).
`python -m bench gateway_miss [--pairs N] [--upstream URL]`: without `--upstream` it starts `python -m backend`
(the default SmolLM2 model); it always starts a gateway and the bare proxy (`harness.peers.servers proxy`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import time
import urllib.request
from contextlib import ExitStack

import aiohttp

from bench.measure.load import write_results
from harness.processes import PYTHON, free_port, server

GATEWAY, PROXY, DIRECT = "gateway", "proxy", "direct"
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


async def rounds(sides: dict[str, str], model: str, count: int, concurrency: int) -> dict[str, list[float]]:
    """TTFTs per side, `count` each: every round asks `concurrency` fresh prompts of each side in turn, the order
    rotating from round to round, so drift and the engine's prefix cache help every side alike."""
    got: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    async with aiohttp.ClientSession() as session:
        for _ in range(3):  # warm-up: connections, the engine's shared system-prompt blocks
            for url in sides.values():
                await ttft(session, url, prompt(model))
        for round_no in range(count // concurrency):
            turn = round_no % len(names)
            for name in names[turn:] + names[:turn]:
                got[name] += await asyncio.gather(
                    *(ttft(session, sides[name], prompt(model)) for _ in range(concurrency))
                )
    return got


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) > 1 else values[0] * 1000


def summary(got: dict[str, list[float]]) -> dict[str, float]:
    """Each side's TTFT p50/p90 and, beside the direct one, what it adds (per-sample difference, same round)."""
    direct = got[DIRECT]
    out: dict[str, float] = {}
    for name, values in got.items():
        out[f"{name}_p50_ms"], out[f"{name}_p90_ms"] = pct(values, 50), pct(values, 90)
        if name != DIRECT:
            diff = [a - b for a, b in zip(values, direct, strict=True)]
            out[f"{name}_added_p50_ms"], out[f"{name}_added_p90_ms"] = pct(diff, 50), pct(diff, 90)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench gateway_miss", description=__doc__)
    parser.add_argument("--pairs", type=int, default=40, help="requests per side and concurrency")
    parser.add_argument("--upstream", default="", help="an engine already running (else python -m backend)")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        backend = args.upstream
        if not backend:
            port = free_port()
            backend = f"http://127.0.0.1:{port}"
            command = [PYTHON, "-m", "backend", "--port", str(port)]
            stack.enter_context(server(command, f"{backend}/health", ready_timeout_s=300))
        gateway, proxy = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
        env = {"TOKENEDGE_UPSTREAM_URL": backend}
        stack.enter_context(
            server(
                [PYTHON, "-m", "gateway", "--port", gateway.rsplit(":", 1)[1]], f"{gateway}/health", env=env
            )
        )
        argv_proxy = [PYTHON, "-m", "harness.peers.servers", "proxy", proxy.rsplit(":", 1)[1], backend]
        stack.enter_context(server(argv_proxy, f"{proxy}/health"))
        with urllib.request.urlopen(f"{backend}/v1/models", timeout=10) as resp:
            model = json.load(resp)["data"][0]["id"]
        load_before = round(os.getloadavg()[0], 2)
        sides = {GATEWAY: gateway, PROXY: proxy, DIRECT: backend}
        urls = {name: f"{url}/v1/chat/completions" for name, url in sides.items()}
        results = {f"c{c}": summary(asyncio.run(rounds(urls, model, args.pairs, c))) for c in (1, 8)}
    print(
        f"\nStreamed misses, unique prompts, {args.pairs} a side, load {load_before}; TTFT ms, added = minus direct"
    )
    print(f"{'':<4} {'direct p50/p90':>15} {'gateway p50/p90':>16} {'added p50/p90':>14} {'bare proxy p50/p90':>19} {'added p50/p90':>14}")  # fmt: skip
    for name, r in results.items():
        cells = [f"{r[f'{DIRECT}_p50_ms']:.2f}/{r[f'{DIRECT}_p90_ms']:.2f}"]
        for side in (GATEWAY, PROXY):
            cells += [f"{r[f'{side}_p50_ms']:.2f}/{r[f'{side}_p90_ms']:.2f}"]
            cells += [f"{r[f'{side}_added_p50_ms']:+.2f}/{r[f'{side}_added_p90_ms']:+.2f}"]
        print(f"{name:<4} {cells[0]:>15} {cells[1]:>16} {cells[2]:>14} {cells[3]:>19} {cells[4]:>14}")
    print(
        "goal: the gateway's added p50 <= 2 ms at batch 1; the bare aiohttp proxy is the floor of one more hop"
    )
    print(f"results: {write_results('gateway_miss', results)}")


if __name__ == "__main__":
    main()
