"""Benchmark: what a token-exact key costs per new request body in front of a third-party engine.

The fake vLLM and llama.cpp servers of the tests (tests/support/engines.py: ChatML rendered by Jinja, cl100k_base
ids) run on loopback in this process, the gateway in front. For each engine: N new chat bodies, sequentially,
with `tokens.remote_tokenize` on (keyed on the engine's ids: one `POST /tokenize`, or `/apply-template` +
`/tokenize`, per new body) and off (keyed `exact`), then every body once more (the request memo: no remote call).
Reported: the remote tokenization itself (`tokenedge_remote_tokenize_duration_seconds`, mean), and the miss
latency with and without it, medians. The engine's own work (render + tokenize) is in these numbers, as it would be
on a real engine, but a real engine's tokenize may queue behind its scheduler: measure there too.

`python -m bench remote_tokens [--n 200]`
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import aiohttp

from tests.support.engines import Engine
from tests.support.gateway import FakeClock, gateway_config, start_gateway
from tests.support.services import serving


async def _run(flavor: str, remote: bool, n: int) -> dict[str, float]:
    engine = Engine(flavor)  # type: ignore[arg-type]
    async with serving(engine.app()) as url:
        gw = await start_gateway(gateway_config(url, tokens={"remote_tokenize": remote}), FakeClock())
        try:
            async with aiohttp.ClientSession() as session:

                async def ask(i: int) -> float:
                    body: dict[str, Any] = {
                        "model": engine.model,
                        "temperature": 0,
                        "messages": [
                            {"role": "system", "content": "You answer in one short sentence."},
                            {"role": "user", "content": f"Question number {i}: what is {i} plus {i}?"},
                        ],
                    }
                    started = time.perf_counter()
                    async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
                        await resp.read()
                        assert resp.status == 200
                    return time.perf_counter() - started

                await ask(-1)  # the probes, the catalog
                misses = [await ask(i) for i in range(n)]
                repeats = [await ask(i) for i in range(n)]
            hist = gw.state.metrics.remote_tokenize_duration.labels("ok")
            count = sum(b.get() for b in hist._buckets) if remote else 0.0
            return {
                "miss_ms": statistics.median(misses) * 1e3,
                "repeat_ms": statistics.median(repeats) * 1e3,
                "remote_mean_ms": (hist._sum.get() / count * 1e3) if count else 0.0,
                "remote_calls": float(count),
            }
        finally:
            await gw.close()


async def _main(n: int) -> None:
    print(
        "| engine | remote tokenize mean ms | miss median ms (tokens) | miss median ms (exact) | added ms |"
        " repeat median ms (tokens) | remote calls for repeats |"
    )
    print("|---|---|---|---|---|---|---|")
    for flavor in ("vllm", "llamacpp"):
        on = await _run(flavor, True, n)
        off = await _run(flavor, False, n)
        print(
            f"| {flavor} | {on['remote_mean_ms']:.3f} | {on['miss_ms']:.3f} | {off['miss_ms']:.3f} |"
            f" {on['miss_ms'] - off['miss_ms']:.3f} | {on['repeat_ms']:.3f} |"
            f" {on['remote_calls'] - (n + 1):.0f} |"
        )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench remote_tokens")
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args(argv)
    asyncio.run(_main(args.n))
