"""The engines of `bench fleet`, started fresh for every arm: native `llama-server` (one slot, one thread) or our
backend (`python -m backend`, one torch thread), two processes on free loopback ports either way, serving the
default SmolLM2 GGUF under one alias. Our backend's log goes to a file, not a pipe nobody reads."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import aiohttp

from backend.loader import default_model_path
from harness.peers.llama_server import llama_server
from harness.peers.llamacpp_build import ensure_build
from harness.processes import PYTHON, ROOT, free_port, stop, wait_http

ALIAS = "HuggingFaceTB/SmolLM2-135M-Instruct"
ENGINES = (
    "llama",
    "llama-slot",
    "ours",
)  # llama-slot: llama-server with its slot cache only (`--cache-ram 0`)
# The fallback revision a gateway arm keys with; our backend reports its own in /v1/models, which wins.
REVISIONS = {"llama": "llama.cpp-bench", "llama-slot": "llama.cpp-bench", "ours": "tokenedge-bench"}


@contextmanager
def fresh_engines(kind: str, count: int) -> Iterator[list[str]]:
    """`count` engines of `kind` ("llama" or "ours"), ready: their base URLs."""
    if kind not in ENGINES:
        raise ValueError(f"engine {kind!r}: one of {ENGINES}")
    with ExitStack() as stack:
        if kind.startswith("llama"):
            build, model = ensure_build(), default_model_path()
            extra = ("--cache-ram", "0") if kind == "llama-slot" else ()
            servers = [
                stack.enter_context(
                    llama_server(
                        build, model, alias=ALIAS, slots=1, threads=1, metrics=True, extra_args=extra
                    )
                )
                for _ in range(count)
            ]
            yield [s.url for s in servers]
        else:
            yield our_backends(stack, count)


def our_backends(stack: ExitStack, count: int) -> list[str]:
    """`count` `python -m backend` processes, all started before any is waited for (their model loads overlap),
    stopped by `stack`; a process that exits before it answers raises with the end of its log."""
    started = []
    for _ in range(count):
        port = free_port()
        log = tempfile.NamedTemporaryFile(prefix="tokenedge-fleet-backend-", suffix=".log")  # noqa: SIM115
        stack.callback(log.close)  # after the process stops: callbacks run last-in first-out
        argv = [PYTHON, "-m", "backend", "--port", str(port), "--threads", "1", "--served-model-name", ALIAS]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        stack.callback(stop, proc, grace_s=10)
        started.append((f"http://127.0.0.1:{port}", proc, log))
    for url, proc, log in started:
        try:
            wait_http(f"{url}/health", 300, proc=proc, interval_s=0.2)
        except RuntimeError as exc:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"{exc}; its log ends:\n{tail}") from exc
    return [url for url, _, _ in started]


async def engine_metrics(session: aiohttp.ClientSession, urls: list[str]) -> list[str]:
    """Each engine's `/metrics` text (harness.fleet reads its reuse and request counters)."""
    texts = []
    for url in urls:
        async with session.get(url + "/metrics") as resp:
            texts.append(await resp.text())
    return texts
