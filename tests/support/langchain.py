"""LangChain's standard chat model tests against the tiny backend, directly and through a gateway.

LangChain's tests call the model synchronously, so the backend and the gateways serve from an event loop in a
thread of their own. An `httpx` transport records what each test got (to compare the runs) and, for a warm
gateway, first sends every chat request again as a plain stream (no `include_usage`) so the request itself is
a hit of the entry that stream stored.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from aiohttp import web
from aiohttp.test_utils import TestServer

from backend.engine.async_engine import AsyncEngine
from backend.engine.config import EngineConfig
from backend.server import ServedModel, ServerLimits, create_app
from harness.gateway import RunningGateway, gateway_config, start_gateway
from harness.models.tiny import tiny_model
from tests.backend.test_server_engine import EOS, byte_tokenizer

MODEL = "tiny"
T = TypeVar("T")


class LoopThread:
    """An event loop running in a daemon thread; `run` waits for a coroutine submitted to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 120.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def backend_app() -> web.Application:
    """The tiny random model behind the real server, as tests/backend/test_server_engine.py serves it."""
    model = tiny_model(seed=0)
    config = EngineConfig(
        speculative_tokens=0,
        num_blocks=256,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        max_model_len=1024,
        max_waiting=64,
    )
    served = ServedModel(
        id=MODEL, revision="rev-tiny", tokenizer=byte_tokenizer(), max_model_len=1024, created=0
    )
    return create_app(served, lambda: AsyncEngine(model, config, frozenset({EOS})), ServerLimits(max_n=4))


@dataclass
class Upstream:
    """The backend on a loopback port, counting the chat requests it served."""

    server: TestServer
    chat_requests: int = 0

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")


async def start_backend() -> Upstream:
    app = backend_app()
    upstream: Upstream

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.endswith("/chat/completions"):
            upstream.chat_requests += 1
        response: web.StreamResponse = await handler(request)
        return response

    app.middlewares.append(count)
    server = TestServer(app, host="127.0.0.1")
    upstream = Upstream(server)
    await server.start_server()
    return upstream


@dataclass
class Servers:
    """The backend and two gateways in front of it (one stays cold, one is pre-filled), on one loop thread."""

    loop: LoopThread
    backend: Upstream
    cold: RunningGateway
    warm: RunningGateway

    def close(self) -> None:
        for gateway in (self.cold, self.warm):
            self.loop.run(gateway.close())
        self.loop.run(self.backend.server.close())
        self.loop.stop()


@contextmanager
def servers() -> Iterator[Servers]:
    loop = LoopThread()
    backend = loop.run(start_backend())
    cold = loop.run(start_gateway(gateway_config(backend.url)))
    warm = loop.run(start_gateway(gateway_config(backend.url)))
    running = Servers(loop, backend, cold, warm)
    try:
        yield running
    finally:
        running.close()


@dataclass
class Recorder:
    """What each test's chat requests got, by test, and the gateway's Cache-Status of each."""

    prefill: bool = False
    test: str = ""
    answers: dict[str, list[Any]] = field(default_factory=dict)
    statuses: dict[str, list[str]] = field(default_factory=dict)

    def record(self, status: str | None) -> None:
        self.statuses.setdefault(self.test, []).append(status or "")


def plain_stream(request: httpx.Request) -> httpx.Request | None:
    """The chat request as a plain stream (`stream: true`, no `stream_options`), or None for other requests."""
    if not request.url.path.endswith("/chat/completions"):
        return None
    body = json.loads(request.content)
    body.pop("stream_options", None)
    body["stream"] = True
    headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
    return httpx.Request("POST", request.url, headers=headers, content=json.dumps(body).encode())


class RecordingTransport(httpx.BaseTransport):
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        plain = plain_stream(request) if self.recorder.prefill else None
        if plain is not None:
            filled = self.inner.handle_request(plain)
            filled.read()
            filled.close()
        response = self.inner.handle_request(request)
        if request.url.path.endswith("/chat/completions"):
            self.recorder.record(response.headers.get("Cache-Status"))
        return response


class AsyncRecordingTransport(httpx.AsyncBaseTransport):
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        plain = plain_stream(request) if self.recorder.prefill else None
        if plain is not None:
            filled = await self.inner.handle_async_request(plain)
            await filled.aread()
            await filled.aclose()
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/chat/completions"):
            self.recorder.record(response.headers.get("Cache-Status"))
        return response
