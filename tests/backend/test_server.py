"""The HTTP server against a scripted fake engine: OpenAI errors, streaming format, n, stop strings, aborts.

The fake replies with the bytes of a fixed script, so expected texts are exact; tests with the real engine
and the tiny model live in test_server_engine.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from backend.engine.errors import QueueFullError
from backend.engine.outputs import EngineStats, TokenOut
from backend.engine.prompt import ValidPrompt
from backend.engine.sampling_params import SamplingParams
from backend.server import ServedModel, ServerLimits, create_app
from backend.tokenizer import Tokenizer
from harness.models.tiny import byte_tokenizer as make_byte_tokenizer

SCRIPT = "Hello, world! The answer is 42."
RUNTIME = {"device": "cpu", "dtype": "float32", "threads": 1, "matmul": "MKL sgemm fp32", "attention": "sdpa"}
EOS = 0


def byte_tokenizer() -> Tokenizer:
    return make_byte_tokenizer(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}A:", EOS
    )


class FakeEngine:
    """Answers every prompt with SCRIPT's bytes then EOS; records what it was asked and what was aborted."""

    def __init__(self, queue_full: bool = False, gate: asyncio.Event | None = None) -> None:
        self.queue_full = queue_full
        self.gate = gate
        self.requests: list[tuple[list[int], SamplingParams]] = []
        self.aborted: list[str] = []
        self.finished: list[str] = []
        self.started = self.stopped = False
        self.ended = asyncio.Event()  # set when any request's generator exits

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def stats(self) -> EngineStats:
        return EngineStats(
            running=0,
            waiting=0,
            blocks_total=64,
            blocks_free=60,
            blocks_cached=3,
            prefix_hit_tokens_total=7,
            prefill_tokens_total=11,
            generated_tokens_total=5,
            spec_verify_steps_total=4,
            spec_draft_tokens_total=16,
            spec_accepted_tokens_total=8,
        )

    async def generate(
        self, prompt: ValidPrompt, params: SamplingParams, request_id: str
    ) -> AsyncIterator[TokenOut]:
        if self.queue_full:
            raise QueueFullError("full")
        self.requests.append((list(prompt.ids), params))
        script = [*list(SCRIPT.encode()), EOS]
        done = False
        try:
            for i, token in enumerate(script[: params.max_tokens]):
                if self.gate is not None and i == 3:
                    await self.gate.wait()
                await asyncio.sleep(0)
                last = token == EOS or i + 1 == params.max_tokens
                reason = ("stop" if token == EOS else "length") if last else None
                yield TokenOut(token, reason, len(prompt), 0)
            done = True
        finally:
            (self.finished if done else self.aborted).append(request_id)
            self.ended.set()


def make_app(engine: FakeEngine, max_model_len: int = 64) -> web.Application:
    model = ServedModel(
        id="tiny",
        revision="rev-test",
        tokenizer=byte_tokenizer(),
        max_model_len=max_model_len,
        created=0,
        runtime=RUNTIME,
    )
    return create_app(model, lambda: engine, ServerLimits(max_n=3, default_max_tokens=100))


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(app)) as client:
        yield client


@pytest.fixture
async def client(engine: FakeEngine) -> AsyncIterator[TestClient]:
    async with serve(make_app(engine)) as c:
        yield c


def sse_events(body: str) -> list[Any]:
    frames = [line.removeprefix("data: ") for line in body.split("\n\n") if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}


async def test_chat_completion_returns_the_generated_text(client: TestClient, engine: FakeEngine) -> None:
    resp = await client.post("/v1/chat/completions", json=CHAT)
    body = await resp.json()
    assert resp.status == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": SCRIPT}
    assert body["choices"][0]["finish_reason"] == "stop"
    prompt = list(b"user: hi\nA:")
    assert engine.requests[0][0] == prompt
    assert (
        body["usage"]["prompt_tokens"] == len(prompt)
        and body["usage"]["completion_tokens"] == len(SCRIPT) + 1
    )
    assert engine.started


async def test_completion_with_max_tokens_finishes_by_length(client: TestClient) -> None:
    resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 5})
    body = await resp.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == SCRIPT[:5] and body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("path", "payload", "status", "param"),
    [
        ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "model": "gpt-9"}, 404, "model"),
        ("/v1/chat/completions", {**CHAT, "messages": "hi"}, 400, "messages"),
        ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, 400, "temperature"),
        ("/v1/chat/completions", {**CHAT, "n": 4}, 400, "n"),
        ("/v1/chat/completions", {**CHAT, "stop": [""]}, 400, "stop"),
        ("/v1/chat/completions", {**CHAT, "seed": 2**64}, 400, "seed"),  # torch's manual_seed: ValueError
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "user", "content": "y" * 80}]},
            400,
            "messages",
        ),
        ("/v1/completions", {"prompt": "x", "max_tokens": 70}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": [1, 2, 999]}, 400, "prompt"),
        ("/v1/completions", {"prompt": 5}, 400, "prompt"),
    ],
)
async def test_bad_inputs_get_openai_errors(
    client: TestClient, path: str, payload: dict, status: int, param: str
) -> None:
    resp = await client.post(path, json=payload)
    body = await resp.json()
    assert resp.status == status
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["param"] == param


async def test_invalid_json_and_unknown_routes_are_openai_errors(client: TestClient) -> None:
    resp = await client.post(
        "/v1/chat/completions", data=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert resp.status == 400 and "error" in await resp.json()
    resp = await client.get("/v1/nothing")
    assert resp.status == 404 and (await resp.json())["error"]["type"] == "not_found_error"


async def test_full_queue_is_503_with_retry_after() -> None:
    async with serve(make_app(FakeEngine(queue_full=True))) as client:
        for stream in (False, True):
            resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
            assert resp.status == 503 and resp.headers["Retry-After"] == "1"
            assert (await resp.json())["error"]["code"] == "queue_full"


async def test_chat_stream_format_with_usage(client: TestClient) -> None:
    resp = await client.post(
        "/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert resp.headers["X-Accel-Buffering"] == "no"
    events = sse_events(await resp.text())
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["delta"].get("content", "") for e in events[1:] for c in e["choices"])
    assert text == SCRIPT
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == len(SCRIPT) + 1
    assert all(e["usage"] is None for e in events[:-1])


async def test_completion_stream_is_text_completion_events(client: TestClient) -> None:
    resp = await client.post("/v1/completions", json={"prompt": "x", "stream": True, "max_tokens": 4})
    events = sse_events(await resp.text())
    assert {e["object"] for e in events} == {"text_completion"}
    assert "".join(e["choices"][0]["text"] for e in events) == SCRIPT[:4]
    assert events[-1]["choices"][0]["finish_reason"] == "length" and "usage" not in events[-1]


async def test_n_choices_each_get_the_full_answer_and_their_own_seed(
    client: TestClient, engine: FakeEngine
) -> None:
    resp = await client.post("/v1/chat/completions", json={**CHAT, "n": 3, "seed": 10, "temperature": 0.7})
    body = await resp.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == SCRIPT for c in body["choices"])
    assert sorted(p.seed for _, p in engine.requests) == [10, 11, 12]
    assert {p.temperature for _, p in engine.requests} == {0.7}


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_string_truncates_and_aborts_the_engine_request(
    client: TestClient, engine: FakeEngine, stream: bool
) -> None:
    resp = await client.post(
        "/v1/chat/completions", json={**CHAT, "stop": ["answer", "zzz"], "stream": stream}
    )
    if stream:
        events = sse_events(await resp.text())
        text = "".join(c["delta"].get("content", "") for e in events for c in e["choices"])
        finish = events[-1]["choices"][0]["finish_reason"]
    else:
        body = await resp.json()
        text, finish = body["choices"][0]["message"]["content"], body["choices"][0]["finish_reason"]
    assert text == "Hello, world! The " and finish == "stop"
    assert len(engine.aborted) == 1 and engine.finished == []


async def test_client_disconnect_aborts_the_engine_request() -> None:
    gate = asyncio.Event()
    engine = FakeEngine(gate=gate)
    async with serve(make_app(engine)) as client:
        resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        await resp.content.readuntil(b"\n\n")  # the role chunk: the request is running
        resp.close()
        gate.set()
        await asyncio.wait_for(engine.ended.wait(), timeout=10)
        assert len(engine.aborted) == 1 and engine.finished == []


async def test_models_reports_revision_and_tokenizer(client: TestClient) -> None:
    body = await (await client.get("/v1/models")).json()
    entry = body["data"][0]
    assert entry["id"] == "tiny"
    assert entry["tokenedge"] == {
        "revision": "rev-test",
        "tokenizer": byte_tokenizer().version,
        "max_model_len": 64,
        "transports": ["json", "binary"],
        "embeddings": {"pooling": "last", "normalization": "l2", "dimensions": None},
        "runtime": RUNTIME,
        "batch_invariant": True,
        "seeded_invariant": True,
    }
    export = await (await client.get("/v1/tokenizer")).json()
    assert export["version"] == byte_tokenizer().version and len(export["mergeable_ranks"]) == 256


async def test_health_and_metrics(client: TestClient) -> None:
    assert (await (await client.get("/health")).json()) == {"status": "ok"}
    await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    text = await (await client.get("/metrics")).text()
    assert "tokenedge_backend_prefix_cache_hit_tokens_total 7.0" in text
    assert 'tokenedge_backend_kv_blocks{state="free"} 60.0' in text
    assert "tokenedge_backend_ttft_seconds_count 1.0" in text
    assert "tokenedge_backend_running_requests 0.0" in text
    assert "tokenedge_backend_spec_accepted_tokens_total 8.0" in text
    assert "tokenedge_backend_spec_acceptance_rate 0.5" in text
    assert "tokenedge_backend_spec_tokens_per_forward 3.0" in text
