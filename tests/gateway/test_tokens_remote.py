"""Token-exact keys in front of third-party engines (gateway/tokens/remote.py), through the real openai client.

The fakes (harness/engines.py) render ChatML and tokenize with cl100k_base as vLLM's and llama.cpp's
servers do, and answer with a checksum of the ids their model was fed, so a wrong hit would show. The verdicts
themselves (what a probe must show): test_tokens_probe.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from openai import AsyncOpenAI

from harness.engines import Engine
from harness.gateway import FakeClock, RunningGateway
from harness.services import serving

Make = Callable[..., Awaitable[RunningGateway]]
HELLO = [{"role": "user", "content": "Say hello."}]
HELLO_PART = [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]
HELLO_SPACE = [{"role": "user", "content": "Say hello. "}]


@pytest.fixture(params=["vllm", "llamacpp"])
async def engine(request: pytest.FixtureRequest) -> Engine:
    return Engine(request.param)


@pytest.fixture
async def upstream_url(engine: Engine) -> AsyncIterator[str]:
    async with serving(engine.app()) as url:
        yield url


@pytest.fixture
async def gw(make_gateway: Make) -> RunningGateway:
    return await make_gateway(tokens={"remote_timeout_s": 0.2, "remote_breaker_failures": 3})


def tokenize_calls(engine: Engine) -> int:
    return engine.calls["tokenize"] + engine.calls["apply-template"]


async def chat(
    gw: RunningGateway, messages: list[dict[str, Any]], key: str = "tenant-key", **extra: Any
) -> tuple[str, str]:
    """(Cache-Status, the answer) for a greedy chat, through the openai client."""
    async with AsyncOpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="engine-model", messages=messages, temperature=0, **extra
        )
    return raw.headers["Cache-Status"], raw.parse().choices[0].message.content or ""


async def complete(gw: RunningGateway, prompt: str) -> tuple[str, str]:
    async with AsyncOpenAI(base_url=gw.url + "/v1", api_key="tenant-key", max_retries=0) as client:
        raw = await client.completions.with_raw_response.create(
            model="engine-model", prompt=prompt, temperature=0, max_tokens=8
        )
    return raw.headers["Cache-Status"], raw.parse().choices[0].text


def fallbacks(gw: RunningGateway, reason: str) -> float:
    return gw.state.metrics.key_level_fallbacks.labels(reason)._value.get()


async def test_a_miss_is_keyed_on_the_engines_token_ids(gw: RunningGateway, engine: Engine) -> None:
    status, _ = await chat(gw, HELLO)
    assert "fwd=miss" in status and "detail=tokens" in status


async def test_a_one_text_part_twin_shares_the_entry(gw: RunningGateway, engine: Engine) -> None:
    _, first = await chat(gw, HELLO)
    status, twin = await chat(gw, HELLO_PART)
    assert status.startswith("tokenedge; hit")
    assert twin == first
    assert engine.calls["chat"] == 2  # the probe's one-token check, then this entry's fill


async def test_a_trailing_space_does_not_share(gw: RunningGateway, engine: Engine) -> None:
    _, first = await chat(gw, HELLO)
    status, spaced = await chat(gw, HELLO_SPACE)
    assert "fwd=miss" in status and "detail=tokens" in status
    assert spaced != first and engine.prompts[0] != engine.prompts[1]


async def test_other_sampling_fields_do_not_share(gw: RunningGateway, engine: Engine) -> None:
    await chat(gw, HELLO)
    status, _ = await chat(gw, HELLO_PART, max_tokens=5)
    assert "fwd=miss" in status and "detail=tokens" in status


async def test_a_repeated_body_is_not_tokenized_again(gw: RunningGateway, engine: Engine) -> None:
    await chat(gw, HELLO)  # the probes and this body's own ask
    asked = tokenize_calls(engine)
    status, _ = await chat(gw, HELLO)
    assert status.startswith("tokenedge; hit")
    assert tokenize_calls(engine) == asked
    assert gw.state.tokens is not None and gw.state.tokens.remote is not None
    assert gw.state.tokens.remote.calls == 1


async def test_completions_prompts_are_keyed_on_ids(gw: RunningGateway, engine: Engine) -> None:
    status, first = await complete(gw, "The capital of France is")
    assert "fwd=miss" in status and "detail=tokens" in status
    again, same = await complete(gw, "The capital of France is")
    spaced, other = await complete(gw, "The capital of France is ")
    assert again.startswith("tokenedge; hit") and same == first
    assert "fwd=miss" in spaced and other != first


@pytest.mark.parametrize("status", [500, 404])
async def test_a_broken_tokenize_route_keys_exact_without_an_error(
    gw: RunningGateway, engine: Engine, status: int
) -> None:
    await chat(gw, HELLO)  # verified
    engine.tokenize_status = status
    miss, _ = await chat(gw, HELLO_SPACE)
    assert "fwd=miss" in miss and "detail=exact" in miss
    assert fallbacks(gw, "tokenize_error") == 1
    again, _ = await chat(gw, HELLO_SPACE)  # the exact entry answers the repeat
    assert again.startswith("tokenedge; hit")


async def test_a_tokenize_timeout_keys_exact_without_an_error(gw: RunningGateway, engine: Engine) -> None:
    await chat(gw, HELLO)
    engine.tokenize_gate = asyncio.Event()  # never set: the gateway's 0.2 s budget runs out
    miss, _ = await chat(gw, HELLO_SPACE)
    assert "fwd=miss" in miss and "detail=exact" in miss
    assert fallbacks(gw, "tokenize_timeout") == 1
    engine.tokenize_gate.set()


async def test_after_a_transient_failure_the_body_is_asked_again(gw: RunningGateway, engine: Engine) -> None:
    await chat(gw, HELLO)
    engine.tokenize_status = 500
    await chat(gw, HELLO_SPACE)
    engine.tokenize_status = None
    # The same bytes from another caller take the ordinary path (the memo's key is the first caller's; for
    # that caller the fast lane answers the exact entry, which is right for exactly these bytes).
    status, _ = await chat(gw, HELLO_SPACE, key="another-tenant")
    assert "fwd=miss" in status and "detail=tokens" in status  # its ids now: a tokens-level key


async def test_the_breaker_stops_asking_after_repeated_failures(gw: RunningGateway, engine: Engine) -> None:
    await chat(gw, HELLO)
    engine.tokenize_status = 500
    for n in range(3):  # remote_breaker_failures = 3
        await chat(gw, [{"role": "user", "content": f"question {n}"}])
    asked = tokenize_calls(engine)
    status, _ = await chat(gw, [{"role": "user", "content": "one more"}])
    assert "detail=exact" in status
    assert tokenize_calls(engine) == asked
    assert fallbacks(gw, "breaker_open") == 1


async def test_tools_key_exact_with_the_reason(gw: RunningGateway, engine: Engine) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    resp = await gw.client.post(
        "/v1/cache/explain",
        json={"request": {"model": "engine-model", "messages": HELLO, "temperature": 0, "tools": tools}},
    )
    doc = await resp.json()
    assert doc["level"] == "exact"
    assert doc["fallback"]["reason"] == "unsupported_request"


async def test_explain_names_the_tokenizer_identity(gw: RunningGateway, engine: Engine) -> None:
    resp = await gw.client.post(
        "/v1/cache/explain", json={"request": {"model": "engine-model", "messages": HELLO, "temperature": 0}}
    )
    doc = await resp.json()
    assert doc["level"] == "tokens" and doc["fallback"] is None
    assert doc["tokenizer"].startswith(f"remote-{engine.flavor}-")
    assert doc["canonical"]["input"]["ids"] == engine.ids(engine.render(HELLO))


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (lambda e: setattr(e, "tokenize_status", 404), "no_tokenizer"),
        (lambda e: setattr(e, "tokenize_status", 500), "probe_failed"),
        (lambda e: setattr(e, "tokenizes_json", True), "probe_inconsistent"),
        (lambda e: setattr(e, "model_bos", 100257), "probe_inconsistent"),
    ],
    ids=[
        "no tokenize route",
        "tokenize broken from the start",
        "a route that tokenizes the JSON",
        "a model route that adds a BOS the tokenize route omits",
    ],
)
async def test_an_engine_that_fails_the_probe_keys_exact(
    gw: RunningGateway, engine: Engine, setup: Callable[[Engine], None], reason: str
) -> None:
    setup(engine)
    status, _ = await chat(gw, HELLO)
    assert "fwd=miss" in status and "detail=exact" in status
    resp = await gw.client.post(
        "/v1/cache/explain", json={"request": {"model": "engine-model", "messages": HELLO, "temperature": 0}}
    )
    doc = await resp.json()
    assert doc["level"] == "exact" and doc["fallback"]["reason"] == reason
    assert fallbacks(gw, reason) >= 1


async def test_a_probe_refused_for_a_credential_is_asked_again_after_the_cooldown(
    gw: RunningGateway, engine: Engine, clock: FakeClock
) -> None:
    engine.tokenize_status = 401  # this caller's key: says nothing about the engine's routes
    status, _ = await chat(gw, HELLO)
    assert "detail=exact" in status
    engine.tokenize_status = None
    clock.advance(gw.state.config.tokens.remote_breaker_cooldown_s)
    status, _ = await chat(gw, HELLO_SPACE)
    assert "fwd=miss" in status and "detail=tokens" in status


async def test_requests_the_engine_refuses_do_not_open_the_breaker(
    gw: RunningGateway, engine: Engine
) -> None:
    await chat(gw, HELLO)
    engine.tokenize_status = 400  # as for a message the engine's chat route would refuse as well
    for n in range(4):  # one more than remote_breaker_failures
        status, _ = await chat(gw, [{"role": "user", "content": f"question {n}"}])
        assert "detail=exact" in status
    assert fallbacks(gw, "tokenize_error") == 4 and fallbacks(gw, "breaker_open") == 0
