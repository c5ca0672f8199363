"""End-to-end benchmark against the real SmolLM2 backend: hit vs miss latency for the same 64-token answer, and
the miss time-to-first-token through the gateway vs directly at the backend (the gateway's overhead on a miss).

`python -m bench e2e [--rounds N]`. Misses use distinct prompts of equal token length, alternating gateway and
direct, so the backend's prefix cache helps both sides alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from contextlib import ExitStack

import aiohttp

from bench.measure.load import write_results
from harness.processes import PYTHON, free_port, server

HEADERS = {"Authorization": "Bearer bench-tenant"}


def request(model: str, n: int, *, stream: bool) -> dict[str, object]:
    return {
        "model": model,
        "temperature": 0,
        "max_tokens": 64,
        "stream": stream,
        "messages": [{"role": "user", "content": f"Tell me a long story about lighthouse number {n}."}],
    }


async def timed_json(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> tuple[float, dict]:
    started = time.perf_counter()
    async with session.post(url, json=body, headers=HEADERS) as resp:
        doc = await resp.json()
        assert resp.status == 200, doc
    return time.perf_counter() - started, doc


async def ttft(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> float:
    started = time.perf_counter()
    async with session.post(url, json=body, headers=HEADERS) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if line.startswith(b"data: ") and b'"content":"' in line and b'"content":""' not in line:
                elapsed = time.perf_counter() - started
                async for _ in resp.content:  # drain so the connection is reusable
                    pass
                return elapsed
    raise RuntimeError("stream ended without content")


async def measure(gateway: str, backend: str, model: str, rounds: int) -> dict[str, object]:
    async with aiohttp.ClientSession() as session:
        await timed_json(
            session, f"{backend}/v1/chat/completions", request(model, -1, stream=False)
        )  # warm-up
        misses, hits, tokens = [], [], []
        for n in range(rounds):
            miss_s, doc = await timed_json(
                session, f"{gateway}/v1/chat/completions", request(model, n, stream=False)
            )
            misses.append(miss_s)
            tokens.append(doc["usage"]["completion_tokens"])
            for _ in range(20):
                hit_s, _doc = await timed_json(
                    session, f"{gateway}/v1/chat/completions", request(model, n, stream=False)
                )
                hits.append(hit_s)
        via_gateway, direct = [], []
        for n in range(rounds):
            via_gateway.append(
                await ttft(
                    session, f"{gateway}/v1/chat/completions", request(model, 1000 + 2 * n, stream=True)
                )
            )
            direct.append(
                await ttft(
                    session, f"{backend}/v1/chat/completions", request(model, 1001 + 2 * n, stream=True)
                )
            )
    miss_p50, hit_p50 = statistics.median(misses), statistics.median(hits)
    overhead_ms = (statistics.median(via_gateway) - statistics.median(direct)) * 1000
    return {
        "completion_tokens": statistics.median(tokens),
        "miss_p50_ms": miss_p50 * 1000,
        "hit_p50_ms": hit_p50 * 1000,
        "miss_over_hit": miss_p50 / hit_p50,
        "ttft_gateway_p50_ms": statistics.median(via_gateway) * 1000,
        "ttft_direct_p50_ms": statistics.median(direct) * 1000,
        "gateway_overhead_ms": overhead_ms,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench e2e", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        be_port, gw_port = free_port(), free_port()
        backend = f"http://127.0.0.1:{be_port}"
        gateway = f"http://127.0.0.1:{gw_port}"
        stack.enter_context(
            server(
                [PYTHON, "-m", "backend", "--port", str(be_port)], f"{backend}/health", ready_timeout_s=300
            )
        )
        stack.enter_context(
            server(
                [PYTHON, "-m", "gateway", "--port", str(gw_port)],
                f"{gateway}/health",
                env={"TOKENEDGE_UPSTREAM_URL": backend},
            )
        )
        import json
        import urllib.request

        with urllib.request.urlopen(f"{backend}/v1/models", timeout=10) as resp:
            model = json.load(resp)["data"][0]["id"]
        result = asyncio.run(measure(gateway, backend, model, args.rounds))
    print(
        f"\nEnd to end, SmolLM2 backend on CPU, temperature 0, max_tokens 64 "
        f"({result['completion_tokens']} tokens generated), {args.rounds} rounds"
    )
    print(f"{'measure':<44} {'value':>12}")
    rows = [
        ("miss latency p50 (ms)", result["miss_p50_ms"]),
        ("hit latency p50 (ms)", result["hit_p50_ms"]),
        ("miss / hit", result["miss_over_hit"]),
        ("miss TTFT via gateway p50 (ms)", result["ttft_gateway_p50_ms"]),
        ("miss TTFT direct to backend p50 (ms)", result["ttft_direct_p50_ms"]),
        ("gateway overhead on a miss, TTFT p50 (ms)", result["gateway_overhead_ms"]),
    ]
    for name, value in rows:
        print(f"{name:<44} {value:>12.2f}")
    print("targets: miss/hit >= 100x; gateway overhead <= 1 ms")
    print(f"results: {write_results('e2e', result)}")


if __name__ == "__main__":
    main()
