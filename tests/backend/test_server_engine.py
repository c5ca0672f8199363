"""The HTTP server over the real engine and the tiny random model: batching and prefix reuse end to end."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence

import pytest
from aiohttp.test_utils import TestClient, TestServer

from backend.engine.async_engine import AsyncEngine
from backend.engine.config import EngineConfig
from backend.engine.prompt import PromptLimits, ValidPrompt
from backend.server import ServedModel, ServerLimits, create_app
from backend.tokenizer import Tokenizer
from harness.models.tiny import byte_tokenizer as make_byte_tokenizer
from harness.models.tiny import tiny_model

EOS = 0


def byte_tokenizer() -> Tokenizer:
    return make_byte_tokenizer(
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}>", EOS
    )


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    model = tiny_model(seed=0)
    config = EngineConfig(
        speculative_tokens=0,
        block_size=16,
        num_blocks=96,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=512,
        max_waiting=64,
    )
    served = ServedModel(
        id="tiny", revision="rev-tiny", tokenizer=byte_tokenizer(), max_model_len=512, created=0
    )
    app = create_app(served, lambda: AsyncEngine(model, config, frozenset({EOS})), ServerLimits(max_n=4))
    async with TestClient(TestServer(app)) as c:
        yield c


async def complete(client: TestClient, prompt: str, **extra: object) -> dict:
    resp = await client.post(
        "/v1/completions", json={"prompt": prompt, "temperature": 0, "max_tokens": 12, **extra}
    )
    assert resp.status == 200, await resp.text()
    return await resp.json()


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match is not None, name
    return float(match.group(1))


async def test_eight_concurrent_greedy_requests_equal_the_same_run_one_by_one(client: TestClient) -> None:
    prompts = [f"prompt number {i}: " + "abc" * i for i in range(8)]
    alone = [(await complete(client, p))["choices"][0]["text"] for p in prompts]
    together = await asyncio.gather(*(complete(client, p) for p in prompts))
    assert [r["choices"][0]["text"] for r in together] == alone
    assert len(set(alone)) > 1  # the prompts really lead to different outputs


async def test_shared_system_prompt_hits_the_prefix_cache(client: TestClient) -> None:
    system = "You are a very careful assistant. " * 4  # > 128 bytes: several full blocks
    first = await client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "first"}],
            "temperature": 0,
            "max_tokens": 4,
        },
    )
    assert (await first.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    before = metric(
        await (await client.get("/metrics")).text(), "tokenedge_backend_prefix_cache_hit_tokens_total"
    )
    second = await client.post(
        "/v1/chat/completions",
        json={
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": "second question"},
            ],
            "temperature": 0,
            "max_tokens": 4,
        },
    )
    cached = (await second.json())["usage"]["prompt_tokens_details"]["cached_tokens"]
    after = metric(
        await (await client.get("/metrics")).text(), "tokenedge_backend_prefix_cache_hit_tokens_total"
    )
    assert cached >= 128
    assert after - before == cached


async def test_a_preamble_shared_past_a_block_boundary_is_reused_token_by_token(client: TestClient) -> None:
    """A chat preamble that ends mid-block: the earlier request's block there is full of its own question, but
    its leading rows are the preamble's tail, copied (backend/engine/kv_cache_manager.py)."""
    preamble = "<system>You are a helpful assistant.\n<user>[tag"  # the rendered template's common bytes

    async def ask(tag: int) -> int:
        question = f"[tag{tag}] Write a long, detailed story about how bees build their hives."
        messages = [{"role": "system", "content": "You are a helpful assistant."}]
        messages.append({"role": "user", "content": question})
        body = {"messages": messages, "temperature": 0, "max_tokens": 4}
        doc = await (await client.post("/v1/chat/completions", json=body)).json()
        return doc["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert len(preamble) % 16 != 0 and await ask(1) == 0
    before = metric(
        await (await client.get("/metrics")).text(), "tokenedge_backend_prefix_cache_hit_tokens_total"
    )
    assert await ask(2) == len(preamble)  # 47: two full blocks and 15 rows of the third
    after = metric(
        await (await client.get("/metrics")).text(), "tokenedge_backend_prefix_cache_hit_tokens_total"
    )
    assert after - before == len(preamble)


async def test_stop_string_frees_the_blocks(client: TestClient) -> None:
    full = (await complete(client, "hello", max_tokens=24))["choices"][0]["text"]
    stop = full[5:7]
    expected = full[: full.find(stop)]
    stopped = await complete(client, "hello", max_tokens=24, stop=stop)
    assert stopped["choices"][0]["text"] == expected
    assert stopped["choices"][0]["finish_reason"] == "stop"
    # the engine applies commands in order: once a later request is done, the abort has been applied
    await complete(client, "x", max_tokens=1)
    text = await (await client.get("/metrics")).text()
    assert metric(text, "tokenedge_backend_running_requests") == 0
    assert metric(text, 'tokenedge_backend_kv_blocks{state="free"}') == metric(
        text, 'tokenedge_backend_kv_blocks{state="total"}'
    )


async def test_seeded_sampling_repeats_and_n_choices_differ(client: TestClient) -> None:
    a = await complete(client, "seed me", temperature=1.0, seed=123, n=2)
    b = await complete(client, "seed me", temperature=1.0, seed=123, n=2)
    assert [c["text"] for c in a["choices"]] == [c["text"] for c in b["choices"]]
    assert a["choices"][0]["text"] != a["choices"][1]["text"]


async def test_a_prompt_is_validated_once_however_many_choices_or_inputs(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = PromptLimits.validate

    def counting(self: PromptLimits, ids: Sequence[int]) -> ValidPrompt:
        calls.append(len(ids))
        return real(self, ids)

    monkeypatch.setattr(PromptLimits, "validate", counting)
    await complete(client, "count me", n=3, temperature=1.0, seed=1)
    assert len(calls) == 1  # at the HTTP boundary; the async engine and the engine trust the ValidPrompt
    calls.clear()
    resp = await client.post("/v1/embeddings", json={"input": ["one", "two"]})
    assert resp.status == 200, await resp.text()
    assert len(calls) == 2  # one per input
