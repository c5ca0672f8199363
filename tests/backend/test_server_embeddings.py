"""`/v1/embeddings` and `/v1/models/{id}` over the real engine and the tiny model, through the real `openai` client;
bad shapes are OpenAI 400s naming the field. Chat roles and null content are checked here too (protocol.py)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator

import numpy as np
import openai
import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer
from openai import AsyncOpenAI

from backend.engine.async_engine import AsyncEngine
from backend.engine.config import EngineConfig
from backend.engine.errors import QueueFullError
from backend.engine.prompt import ValidPrompt
from backend.model.llama import _causal_attention
from backend.server import ServedModel, ServerLimits, create_app
from backend.server.embeddings import embed_all, normalize
from harness.models.tiny import byte_tokenizer, tiny_model
from tests.backend.test_embedding import BITWISE

EOS = 0
MODEL = tiny_model(seed=1)


def close(a: list[float] | np.ndarray, b: list[float] | np.ndarray) -> bool:
    """Against the full-recompute oracle (another attention path): close, never bitwise."""
    return bool(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5))


def same(a: list[float], b: list[float]) -> bool:
    """One text through the engine twice: bitwise once the engine is batch-invariant (issue 14's mode), else
    close (see tests/backend/test_embedding.py)."""
    return np.array_equal(np.float32(a), np.float32(b)) if BITWISE else close(a, b)


def reference(text: str) -> np.ndarray:
    """The expected vector: the model's full-recompute final hidden state at the last byte, L2-normalized."""
    ids = torch.tensor(list(text.encode()))
    hidden = MODEL(ids, torch.arange(len(ids)), lambda _layer, q, k, v: _causal_attention(q, k, v))
    return normalize(hidden[-1]).numpy()


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    config = EngineConfig(
        speculative_tokens=0,
        num_blocks=96,
        max_num_seqs=8,
        max_num_batched_tokens=96,
        max_model_len=128,
        max_waiting=64,
    )
    served = ServedModel(
        id="tiny",
        revision="rev-tiny",
        created=0,
        max_model_len=128,
        hidden_size=64,
        tokenizer=byte_tokenizer("{% for m in messages %}{{ m['content'] }}{% endfor %}", EOS),
    )
    app = create_app(served, lambda: AsyncEngine(MODEL, config, frozenset({EOS})), ServerLimits())
    async with TestClient(TestServer(app)) as c:
        yield c


@pytest.fixture
async def oai(client: TestClient) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="k", max_retries=0) as c:
        yield c


async def test_a_string_embeds_to_the_normalized_last_hidden_state(oai: AsyncOpenAI) -> None:
    result = await oai.embeddings.create(model="tiny", input="hello world", encoding_format="float")
    (item,) = result.data
    assert result.object == "list" and result.model == "tiny" and item.index == 0
    assert len(item.embedding) == 64 and abs(np.linalg.norm(item.embedding) - 1.0) < 1e-5
    assert close(item.embedding, reference("hello world"))
    assert result.usage.prompt_tokens == result.usage.total_tokens == len("hello world")


async def test_a_list_keeps_its_order_and_each_equals_its_text_alone(oai: AsyncOpenAI) -> None:
    texts = ["first text", "a second, longer text " * 3, "3"]
    result = await oai.embeddings.create(model="tiny", input=texts, encoding_format="float")
    assert [d.index for d in result.data] == [0, 1, 2]
    for text, item in zip(texts, result.data, strict=True):
        assert close(item.embedding, reference(text))
    assert result.usage.prompt_tokens == sum(len(t) for t in texts)
    assert not close(result.data[0].embedding, result.data[2].embedding)


async def test_base64_decodes_to_the_float_vector(oai: AsyncOpenAI, client: TestClient) -> None:
    floats = (
        (await oai.embeddings.create(model="tiny", input="same", encoding_format="float")).data[0].embedding
    )
    raw = await client.post("/v1/embeddings", json={"input": "same", "encoding_format": "base64"})
    packed = (await raw.json())["data"][0]["embedding"]
    assert np.array_equal(np.frombuffer(base64.b64decode(packed), dtype="<f4"), np.float32(floats))
    default = await oai.embeddings.create(model="tiny", input="same")  # the client asks base64 and decodes it
    assert np.array_equal(np.asarray(default.data[0].embedding, dtype=np.float32), np.float32(floats))


async def test_token_id_inputs_embed_like_their_text(oai: AsyncOpenAI) -> None:
    one = await oai.embeddings.create(model="tiny", input=list(b"hi there"), encoding_format="float")
    many = await oai.embeddings.create(
        model="tiny", input=[list(b"hi there"), list(b"x")], encoding_format="float"
    )
    assert close(one.data[0].embedding, reference("hi there")) and len(many.data) == 2
    assert close(many.data[0].embedding, reference("hi there")) and close(
        many.data[1].embedding, reference("x")
    )
    assert many.usage.prompt_tokens == 9


async def test_an_embedding_alone_equals_it_batched_with_generation_and_other_embeddings(
    oai: AsyncOpenAI, client: TestClient
) -> None:
    alone = (await oai.embeddings.create(model="tiny", input="the text", encoding_format="float")).data[0]
    noise = [
        client.post("/v1/completions", json={"prompt": f"busy {i}", "max_tokens": 8, "temperature": 0})
        for i in range(4)
    ]
    embeds = [
        oai.embeddings.create(model="tiny", input=["other"] * i + ["the text"], encoding_format="float")
        for i in range(1, 5)
    ]
    results = await asyncio.gather(*noise, *embeds)
    for result in results[4:]:
        assert same(result.data[-1].embedding, alone.embedding)  # type: ignore[union-attr]
    assert all(r.status == 200 for r in results[:4])  # type: ignore[union-attr]


async def test_models_retrieve_returns_the_model_and_404s_unknown_ids(oai: AsyncOpenAI) -> None:
    model = await oai.models.retrieve("tiny")
    assert model.id == "tiny" and model.object == "model" and model.owned_by == "tokenedge"
    extra = model.model_extra or {}
    assert extra["tokenedge"]["embeddings"] == {"pooling": "last", "normalization": "l2", "dimensions": 64}
    for unknown in ("gpt-9", "org/tiny"):
        with pytest.raises(openai.NotFoundError) as caught:
            await oai.models.retrieve(unknown)
        assert caught.value.code == "model_not_found"


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({}, "input"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["ok", ""]}, "input"),
        ({"input": [1, "a"]}, "input"),
        ({"input": [[]]}, "input"),
        ({"input": [[1, 2], 3]}, "input"),
        ({"input": [True, 2]}, "input"),
        ({"input": {"text": "x"}}, "input"),
        ({"input": [1, 256]}, "input"),  # outside the vocabulary
        ({"input": [[-1]]}, "input"),
        ({"input": ["x"] * 2049}, "input"),
        ({"input": "y" * 200}, "input"),  # over max_model_len
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "x", "dimensions": 32}, "dimensions"),
        ({"input": "x", "dimensions": "64"}, "dimensions"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "model": 7}, "model"),
    ],
)
async def test_bad_embedding_requests_are_400_naming_the_field(
    client: TestClient, payload: dict, param: str
) -> None:
    resp = await client.post("/v1/embeddings", json=payload)
    body = await resp.json()
    assert resp.status == 400, body
    assert body["error"]["param"] == param and body["error"]["type"] == "invalid_request_error"


async def test_dimensions_equal_to_the_width_is_accepted_and_an_unknown_model_is_404(
    client: TestClient,
) -> None:
    ok = await client.post("/v1/embeddings", json={"input": "x", "dimensions": 64})
    assert ok.status == 200 and len((await ok.json())["data"][0]["embedding"]) == 64
    missing = await client.post("/v1/embeddings", json={"input": "x", "model": "gpt-9"})
    assert missing.status == 404 and (await missing.json())["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
        ([{"role": "user", "content": "hi"}, {"role": "user", "content": None}], "messages[1].content"),
        ([{"role": "system", "content": None}, {"role": "user", "content": "hi"}], "messages[0].content"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"content": "hi"}], "messages[0].role"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content"),
    ],
)
async def test_chat_messages_the_model_cannot_use_are_400_naming_the_field(
    client: TestClient, messages: list, param: str
) -> None:
    resp = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    body = await resp.json()
    assert resp.status == 400 and body["error"]["param"] == param, body


async def test_an_assistant_turn_may_have_null_content(client: TestClient) -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "again"},
    ]
    resp = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert resp.status == 200, await resp.text()


class _FailingEngine:
    """Input 0 fails once the others are waiting inside the engine; records which requests were cancelled."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.waiting = 0
        self.all_in = asyncio.Event()
        self.cancelled: list[str] = []

    async def embed(self, prompt: ValidPrompt, request_id: str) -> object:
        self.waiting += 1
        if self.waiting == self.count:
            self.all_in.set()
        if request_id.endswith("-0"):
            await self.all_in.wait()
            raise QueueFullError("full")
        try:
            await asyncio.Event().wait()  # never set: only cancellation ends it
        except asyncio.CancelledError:
            self.cancelled.append(request_id)
            raise
        raise AssertionError("unreachable")


async def test_the_first_failing_input_cancels_the_others_in_the_engine() -> None:
    engine = _FailingEngine(count=5)
    with pytest.raises(QueueFullError):
        await embed_all(engine, [ValidPrompt((1,))] * 5, "r")  # type: ignore[arg-type]
    assert sorted(engine.cancelled) == ["r-1", "r-2", "r-3", "r-4"]
