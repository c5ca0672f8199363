"""The failover run's clients (harness.failover): a steady mixed load of unique misses, each request's
outcome kept with its times, its engine (`X-Tokenedge-Backend`) and how it ended.

Every request is bounded (`limit_s`): one that never ends is recorded as hung, never waited on forever. A
stream ends cleanly with `[DONE]` or with an error event, never both and never neither (a silently cut
stream).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway.upstream.routing.attempt import BACKEND_HEADER, ROUTE_HEADER

ALIAS = "HuggingFaceTB/SmolLM2-135M-Instruct"
SYSTEM = "You are a terse assistant for a museum of rainbows. " * 6


@dataclass
class Outcome:
    kind: str  # "json" or "stream"
    started: float  # time.monotonic()
    ended: float = 0.0
    status: int = 0
    backend: str = ""  # the engine that answered (X-Tokenedge-Backend); "" for none
    done: bool = False  # json: a whole answer with choices; stream: its [DONE] came
    error: bool = False  # stream: an error event came
    hung: bool = False  # no end within the limit
    broken: bool = False  # the connection to the gateway broke (no status, or a body cut without an event)
    key: str = ""  # X-Cache-Key: where the gateway would store it
    route: str = ""  # X-Tokenedge-Route: why the gateway chose that engine

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.done and not (self.error or self.hung or self.broken)

    @property
    def clean(self) -> bool:
        """Ended as a stream may: completed, or with an error event and no [DONE] after it."""
        return not self.hung and not self.broken and self.done != self.error


def stream_end(raw: bytes) -> tuple[bool, bool]:
    """([DONE] seen, an error event seen) in an SSE body."""
    done = error = False
    for line in raw.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            done = True
            continue
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        error = error or (isinstance(doc, dict) and "error" in doc)
    return done, error


def body(n: int, *, stream: bool, max_tokens: int) -> dict[str, Any]:
    """A unique question (never a cache hit) behind a shared system prompt."""
    question = f"Question {n} ({time.monotonic_ns()}): name a colour."
    return {
        "model": ALIAS,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": stream,
    }


class Load:
    """`concurrency` clients, each asking again as soon as its answer ended; JSON and streams alternate."""

    def __init__(self, session: aiohttp.ClientSession, url: str, *, max_tokens: int, limit_s: float) -> None:
        self.session = session
        self.url = url + "/v1/chat/completions"
        self.max_tokens = max_tokens
        self.limit_s = limit_s
        self.outcomes: list[Outcome] = []
        self._serial = itertools.count()  # makes every question unique
        self._kinds = itertools.count()  # the steady load's turns: JSON, stream, JSON, ...
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, concurrency: int) -> None:
        self._tasks = [asyncio.ensure_future(self._client()) for _ in range(concurrency)]

    async def stop(self) -> None:
        """No new requests; the ones in flight end (each bounded by `limit_s`)."""
        self._stopping.set()
        await asyncio.gather(*self._tasks)

    async def _client(self) -> None:
        while not self._stopping.is_set():
            await self.one(stream=next(self._kinds) % 2 == 1)

    async def burst(self, n: int) -> None:
        """`n` more requests at once, alternating kinds (so an engine has some queued when a fault hits)."""
        await asyncio.gather(*(self.one(stream=i % 2 == 1) for i in range(n)))

    async def one(
        self, *, stream: bool, max_tokens: int = 0, flowing: asyncio.Future[str] | None = None
    ) -> Outcome:
        """One request; with `flowing`, a stream that resolves it with its engine's name at its first line."""
        outcome = Outcome("stream" if stream else "json", time.monotonic())
        self.outcomes.append(outcome)
        request = body(next(self._serial), stream=stream, max_tokens=max_tokens or self.max_tokens)
        if max_tokens:
            request["ignore_eos"] = True  # llama-server: exactly this long, still flowing when a fault hits
        try:
            await asyncio.wait_for(self._ask(outcome, request, flowing), self.limit_s)
        except TimeoutError:
            outcome.hung = True
        except aiohttp.ClientError:
            outcome.broken = True
        finally:
            outcome.ended = time.monotonic()
            if flowing is not None and not flowing.done():
                flowing.set_exception(RuntimeError(f"the stream never flowed: {outcome}"))
        return outcome

    async def _ask(
        self, outcome: Outcome, request: dict[str, Any], flowing: asyncio.Future[str] | None
    ) -> None:
        stream = bool(request["stream"])
        async with self.session.post(self.url, json=request) as resp:
            outcome.status = resp.status
            outcome.backend = resp.headers.get(BACKEND_HEADER, "")
            outcome.key = resp.headers.get("X-Cache-Key", "")
            outcome.route = resp.headers.get(ROUTE_HEADER, "")
            raw = await resp.content.readline()
            if flowing is not None and raw.startswith(b"data:"):
                flowing.set_result(outcome.backend)
            raw += await resp.read()
        if stream and outcome.status == 200:
            outcome.done, outcome.error = stream_end(raw)
        elif outcome.status == 200:
            outcome.done = bool(orjson.loads(raw).get("choices"))

    def started(self, after: float, before: float = float("inf")) -> list[Outcome]:
        return [o for o in self.outcomes if after <= o.started < before]

    def ended(self, after: float, before: float = float("inf")) -> list[Outcome]:
        return [o for o in self.outcomes if o.ended and after <= o.ended < before]


def served_by(outcomes: Iterable[Outcome], name: str) -> int:
    return sum(1 for o in outcomes if o.ok and o.backend == name)
