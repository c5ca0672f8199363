"""The token path through a real gateway in front of a real backend app (scripted engine, ChatML byte tokenizer):
context-length rejection, token budgets, counting only on misses, and JSON vs binary transport equivalence."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI

from harness.gateway import FakeClock, RunningGateway, gateway_config, start_gateway
from harness.services import serving
from tests.support.token_backend import EchoEngine, backend_app, chatml_byte_tokenizer

TOKENIZER = chatml_byte_tokenizer()
SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one line."}
Make = Callable[..., Awaitable[RunningGateway]]


@pytest.fixture
async def engine() -> EchoEngine:
    return EchoEngine(TOKENIZER)


@pytest.fixture
def paths() -> list[str]:
    return []


@pytest.fixture
async def backend_url(engine: EchoEngine, paths: list[str]) -> AsyncIterator[str]:
    app = backend_app(TOKENIZER, engine, max_model_len=256)

    async def record(request: Any, response: Any) -> None:
        paths.append(request.path)

    app.on_response_prepare.append(record)
    async with serving(app) as url:
        yield url


@pytest.fixture
async def make(backend_url: str, tmp_path: Path) -> AsyncIterator[Make]:
    started: list[RunningGateway] = []

    async def factory(clock: FakeClock | None = None, **tokens: Any) -> RunningGateway:
        config = gateway_config(backend_url, tokens={"cache_dir": str(tmp_path), **tokens})
        gw = await start_gateway(config, clock or FakeClock())
        started.append(gw)
        return gw

    yield factory
    for gw in started:
        await gw.close()


def chat(question: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "temperature": 0,
        "messages": [SYSTEM, {"role": "user", "content": question}],
        **extra,
    }


async def test_an_over_long_prompt_is_refused_by_the_gateway(
    make: Make, engine: EchoEngine, tmp_path: Path
) -> None:
    gw = await make()
    resp = await gw.client.post("/v1/chat/completions", json=chat("x" * 400))
    doc = await resp.json()
    assert resp.status == 400 and doc["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 256" in doc["error"]["message"]
    assert engine.prompts == []  # never reached the backend's engine
    assert (tmp_path / f"{TOKENIZER.version}.json").exists()  # the tokenizer export is cached on disk


async def test_max_tokens_beyond_the_context_is_refused(make: Make, engine: EchoEngine) -> None:
    gw = await make()
    resp = await gw.client.post("/v1/chat/completions", json=chat("hi", max_tokens=250, stream=True))
    assert resp.status == 400 and (await resp.json())["error"]["param"] == "max_tokens"
    bypass = await gw.client.post("/v1/chat/completions", json=chat("x" * 400, temperature=0.7))
    assert bypass.status == 400 and engine.prompts == []


async def test_the_token_rate_limit_answers_429_with_retry_after(make: Make, engine: EchoEngine) -> None:
    clock = FakeClock()
    gw = await make(clock, tokens_per_minute=300)
    first = await gw.client.post("/v1/chat/completions", json=chat("one", max_tokens=150))
    assert first.status == 200
    second = await gw.client.post("/v1/chat/completions", json=chat("two", max_tokens=150))
    assert second.status == 429 and int(second.headers["Retry-After"]) >= 1
    again = await gw.client.post("/v1/chat/completions", json=chat("one", max_tokens=150))
    assert again.status == 200 and again.headers["Cache-Status"].startswith("tokenedge; hit")  # hits are free
    clock.advance(60)
    assert (await gw.client.post("/v1/chat/completions", json=chat("two", max_tokens=150))).status == 200
    other = await gw.client.post(
        "/v1/chat/completions",
        json=chat("three", max_tokens=150),
        headers={"Authorization": "Bearer someone-else"},
    )
    assert other.status == 200  # budgets are per tenant
    assert len(engine.prompts) == 3


async def test_hits_do_not_tokenize_and_keep_the_stored_usage(make: Make) -> None:
    gw = await make()
    miss = await gw.client.post("/v1/chat/completions", json=chat("What is 2+2?"))
    body = await miss.read()
    counted = gw.state.metrics.tokenize_duration._sum.get()
    assert gw.state.tokens is not None  # built at startup
    token_cache = gw.state.tokens.cache
    lookups = token_cache.misses
    hit = await gw.client.post("/v1/chat/completions", json=chat("What is 2+2?"))
    assert hit.headers["Cache-Status"].startswith("tokenedge; hit") and await hit.read() == body
    assert gw.state.metrics.tokenize_duration._sum.get() == counted
    assert token_cache.misses == lookups
    usage = (await hit.json())["usage"]
    gw.state.metrics.tally.flush()  # what a scrape does first
    saved = gw.state.metrics.tokens_saved._value.get()
    assert saved == usage["total_tokens"] > 0


ID = re.compile(rb'"(chatcmpl|cmpl)-[0-9a-f]{32}"')
CREATED = re.compile(rb'"created":\s?\d+')
IGNORED_HEADERS = {"date", "etag", "server-timing", "x-tokenedge-timing"}


def normalized(body: bytes) -> bytes:
    """`id` and `created` are per request on the backend's own JSON path too; everything else must match."""
    return CREATED.sub(b'"created":0', ID.sub(b'"ID"', body))


async def answer(gw: RunningGateway, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    resp = await gw.client.post(path, json=body)
    headers = {k.lower(): v for k, v in resp.headers.items() if k.lower() not in IGNORED_HEADERS}
    return resp.status, headers, normalized(await resp.read())


REQUESTS = [
    ("/v1/chat/completions", chat("What is the capital of France?")),
    ("/v1/chat/completions", chat("Say 你好 and 😀 back", max_tokens=5)),
    ("/v1/chat/completions", chat("Stop early", stop=["checksum"])),
    ("/v1/chat/completions", {**chat("Usage please"), "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", chat("Two answers", n=2)),  # n > 1: a bypass, relayed as JSON by design
    ("/v1/completions", {"model": "tiny", "temperature": 0, "prompt": "Once upon a time <|im_end|> the end"}),
]


@pytest.mark.parametrize("stream", [False, True])
async def test_json_and_binary_transports_answer_identically(
    make: Make, engine: EchoEngine, stream: bool, paths: list[str]
) -> None:
    binary, plain = await make(binary_transport=True), await make(binary_transport=False)
    for path, body in REQUESTS:
        body = {**body, "stream": stream}
        engine.prompts.clear()
        via_json = await answer(plain, path, body)
        assert paths[-1] == path
        via_binary = await answer(binary, path, body)
        assert paths[-1] == (path if body.get("n") == 2 else "/v1/tokens/generate")
        assert via_binary == via_json, (path, body)
        assert via_json[0] == 200
        assert len(engine.prompts) >= 2 and engine.prompts[0] == engine.prompts[-1]
    assert binary.state.tokens is not None and len(binary.state.tokens.cache) > 0


async def test_openai_models_are_counted_with_offline_cl100k_for_the_rate_limit(make_openai: Make) -> None:
    gw = await make_openai()
    body = {
        "model": "gpt-4",
        "temperature": 0,
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "word " * 60}],
    }
    assert (await gw.client.post("/v1/chat/completions", json=body)).status == 200
    limited = await gw.client.post("/v1/chat/completions", json={**body, "max_tokens": 11})
    assert limited.status == 429 and limited.headers["Retry-After"]
    unknown = {**body, "model": "gpt-4o", "max_tokens": 11}  # o200k_base is not shipped offline: not counted
    assert (await gw.client.post("/v1/chat/completions", json=unknown)).status == 200


@pytest.fixture
async def make_openai(upstream_url: str, tmp_path: Path) -> AsyncIterator[Make]:
    started: list[RunningGateway] = []

    async def factory() -> RunningGateway:
        config = gateway_config(upstream_url, tokens={"cache_dir": str(tmp_path), "tokens_per_minute": 100})
        gw = await start_gateway(config, FakeClock())
        started.append(gw)
        return gw

    yield factory
    for gw in started:
        await gw.close()


@pytest.mark.parametrize("binary", [False, True])
async def test_a_plain_stream_through_the_token_path_stores_usage(make: Make, binary: bool) -> None:
    """The usage ask reaches the backend over either transport; the client that did not ask sees no usage chunk."""
    gw = await make(binary_transport=binary)
    body = chat("Usage for later")
    streamed = await (await gw.client.post("/v1/chat/completions", json={**body, "stream": True})).read()
    hit = await gw.client.post("/v1/chat/completions", json=body)
    doc = await hit.json()

    chunks = [orjson.loads(line[6:]) for line in streamed.split(b"\n\n") if line.startswith(b"data: {")]
    assert streamed.endswith(b"data: [DONE]\n\n") and chunks
    assert all(
        c["choices"] and c.get("usage") is None for c in chunks
    )  # no usage chunk (OpenAI's `usage: null`)
    assert "hit" in hit.headers["Cache-Status"]
    assert doc["usage"]["completion_tokens"] > 0 and doc["usage"]["prompt_tokens"] > 0


@pytest.mark.parametrize("binary", [False, True])
async def test_the_openai_client_gets_the_backends_usage_from_an_entry_a_plain_stream_filled(
    make: Make, backend_url: str, engine: EchoEngine, binary: bool
) -> None:
    """Against the real backend app: the usage a JSON hit and an include_usage hit carry is the backend's own."""
    body = chat("Whose usage is this?")
    async with aiohttp.ClientSession() as session:  # the backend asked directly, as the gateway asks it
        direct = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with session.post(backend_url + "/v1/chat/completions", json=direct) as resp:
            lines = [line for line in (await resp.read()).split(b"\n\n") if line.startswith(b"data: {")]
    upstream_usage = orjson.loads(lines[-1][6:])["usage"]
    gw = await make(binary_transport=binary)
    async with AsyncOpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0) as client:
        args: dict[str, Any] = {"model": body["model"], "messages": body["messages"], "temperature": 0}
        miss = [c async for c in await client.chat.completions.create(**args, stream=True)]
        as_json = await client.chat.completions.create(**args)
        with_usage = [
            c
            async for c in await client.chat.completions.create(
                **args, stream=True, stream_options={"include_usage": True}
            )
        ]

    assert (
        len(engine.prompts) == 2
    )  # the direct ask and the gateway's one miss: both hits came from the entry
    assert all(c.usage is None for c in miss)
    assert as_json.usage is not None and as_json.usage.model_dump(exclude_none=True) == upstream_usage
    assert with_usage[-1].choices == [] and with_usage[-1].usage is not None
    assert with_usage[-1].usage.model_dump(exclude_none=True) == upstream_usage
    assert as_json.choices[0].message.content == "".join(c.choices[0].delta.content or "" for c in miss)


async def test_logprobs_go_as_json_because_the_binary_frames_carry_text_only(
    make: Make, paths: list[str]
) -> None:
    binary = await make(binary_transport=True)
    status, *_ = await answer(binary, "/v1/chat/completions", chat("Logprobs please", logprobs=True))
    assert status == 200 and paths[-1] == "/v1/chat/completions"
