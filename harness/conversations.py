"""Multi-turn chat workloads over several backends: fake prefix-cache backend processes and a conversation driver.

Shared by the routing acceptance test and `bench scale`. A workload is `conversations` conversations of `turns` turns;
conversation c uses system prompt c % SYSTEMS (shared prompts, as deployments share their instructions), and each
turn sends the whole history plus a new user message, then appends the answer it got, as chat clients do.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from harness.services import free_port
from harness.workers import REPO, listening_sockets

Send = Callable[[int, int, list[dict[str, Any]]], Awaitable[str]]  # (conversation, turn, messages) -> answer


@dataclass
class BackendProc:
    url: str
    proc: asyncio.subprocess.Process

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)


async def start_backend(*args: str) -> BackendProc:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "harness.prefix_backend",
        "--port",
        str(port),
        *args,
        cwd=REPO,
        env=os.environ.copy(),
    )
    for _ in range(300):  # readiness: the port is bound (bounded, ~30 s)
        if listening_sockets(port) >= 1 or proc.returncode is not None:
            break
        await asyncio.sleep(0.1)
    if listening_sockets(port) < 1:
        proc.kill()
        raise RuntimeError("prefix backend did not start")
    return BackendProc(f"http://127.0.0.1:{port}", proc)


@contextlib.asynccontextmanager
async def prefix_backends(count: int, *args: str) -> AsyncIterator[list[BackendProc]]:
    started = list(await asyncio.gather(*(start_backend(*args) for _ in range(count))))
    try:
        yield started
    finally:
        for b in started:
            if b.proc.returncode is None:
                b.proc.send_signal(signal.SIGTERM)
        for b in started:
            await b.proc.wait()


async def stats(
    session: aiohttp.ClientSession, backends: list[BackendProc], *, reset: bool = False
) -> list[dict[str, int]]:
    """Each live backend's counters (a killed one reads as all zero); `reset` empties caches and counters."""
    out = []
    for b in backends:
        if b.proc.returncode is not None:
            out.append({"requests": 0, "prompt_tokens": 0, "hit_tokens": 0})
            continue
        method, path = ("POST", "/stats/reset") if reset else ("GET", "/stats")
        async with session.request(method, b.url + path) as resp:
            out.append(await resp.json())
    return out


SYSTEMS = 4
SYSTEM_CHARS = 240
USER_CHARS = 300


def system_prompt(k: int) -> str:
    return (f"System {k}: you are a careful assistant for team {k}. Answer briefly and cite sources. " * 8)[
        :SYSTEM_CHARS
    ]


def user_message(conversation: int, turn: int) -> str:
    return (
        f"Conversation {conversation}, turn {turn}: please explain topic {conversation * 31 + turn}. " * 6
    )[:USER_CHARS]


@dataclass
class RunResult:
    failures: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    completed: int = 0


async def run_conversations(
    send: Send, conversations: int, turns: int, *, after: Callable[[int], Awaitable[None]] | None = None
) -> RunResult:
    """Turn by turn: every conversation sends its turn t at once (in conversation order) and the next turn starts
    when all have answered, so the request order is the same in every run (a round-robin baseline is then
    reproducible: request n goes to backend n % N). `after(n)` runs after the n-th answer."""
    result = RunResult()
    histories: dict[int, list[dict[str, Any]]] = {
        c: [{"role": "system", "content": system_prompt(c % SYSTEMS)}] for c in range(conversations)
    }

    async def one(c: int, t: int) -> None:
        messages = histories[c]
        messages.append({"role": "user", "content": user_message(c, t)})
        started = time.perf_counter()
        try:
            answer = await send(c, t, list(messages))
        except Exception as exc:  # a failed client request: what the caller counts
            result.failures.append(f"conversation {c} turn {t}: {type(exc).__name__}: {exc}")
            del histories[c]
            return
        result.latencies_s.append(time.perf_counter() - started)
        messages.append({"role": "assistant", "content": answer})
        result.completed += 1
        if after is not None:
            await after(result.completed)

    for t in range(turns):
        await asyncio.gather(*(one(c, t) for c in sorted(histories)))
    return result


def chat_body(messages: list[dict[str, Any]], *, model: str = "m", stream: bool = False) -> dict[str, Any]:
    return {"model": model, "messages": messages, "temperature": 0, "max_tokens": 64, "stream": stream}


async def post_chat(session: aiohttp.ClientSession, url: str, messages: list[dict[str, Any]]) -> str:
    """One non-streamed chat request; any non-200 raises (a failed client request)."""
    headers = {"Authorization": "Bearer routing-test"}
    async with session.post(url + "/v1/chat/completions", json=chat_body(messages), headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        doc = await resp.json()
    return str(doc["choices"][0]["message"]["content"])


async def post_chat_stream(
    session: aiohttp.ClientSession, url: str, messages: list[dict[str, Any]]
) -> tuple[str, float]:
    """One streamed chat request: (the answer, seconds to its first content chunk); any non-200 raises."""
    headers = {"Authorization": "Bearer routing-test"}
    started, first, parts = time.perf_counter(), 0.0, []
    async with session.post(
        url + "/v1/chat/completions", json=chat_body(messages, stream=True), headers=headers
    ) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            for choice in orjson.loads(line[6:]).get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    first = first or time.perf_counter() - started
                    parts.append(piece)
    return "".join(parts), first
