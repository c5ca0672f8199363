"""`POST /tokenize` takes what vLLM's and llama.cpp's take (backend/server/tokenize.py): vLLM's
`add_special_tokens`, llama.cpp's `content`, `add_special`, `parse_special` and `with_pieces`, each as that engine
means it, and the ids are still the ones the routes run (a completion's `usage.prompt_tokens`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from backend.engine.async_engine import AsyncEngine
from backend.engine.config import EngineConfig
from backend.server import ServedModel, ServerLimits, create_app
from backend.tokenizer import Tokenizer
from harness.models.tiny import tiny_model
from tests.backend.tiny_server import tiny_server
from tokenedge_wire.pattern import GPT2

TEXT = "Hé <|end|>"  # a two-byte character and a special token's spelling
END = 255  # the special token's id


def special_tokenizer() -> Tokenizer:
    """Bytes 0..254 as tokens and `<|end|>` as the special token 255 (the tiny model's vocabulary is 256)."""
    return Tokenizer(
        name="bytes+end",
        pattern=GPT2,
        mergeable_ranks={bytes([b]): b for b in range(255)},
        special_tokens={"<|end|>": END},
        vocab_size=256,
        bos_token_id=None,
        eos_token_ids=[END],
        chat_template=None,
    )


@contextlib.asynccontextmanager
async def special_server() -> AsyncIterator[TestClient]:
    config = EngineConfig(num_blocks=32, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=128)
    served = ServedModel(id="tiny", revision="r", tokenizer=special_tokenizer(), max_model_len=128, created=0)
    app = create_app(
        served, lambda: AsyncEngine(tiny_model(seed=0), config, frozenset({END})), ServerLimits()
    )
    async with TestClient(TestServer(app)) as client:
        yield client


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    async with tiny_server() as c:
        yield c


async def tokenize(client: TestClient, **body: Any) -> Any:
    resp = await client.post("/tokenize", json=body)
    assert resp.status == 200, await resp.text()
    return await resp.json()


@pytest.mark.parametrize(
    "switch",
    [
        {"add_special_tokens": True},
        {"add_special_tokens": False},
        {"add_special": True},
        {"add_special": False},
    ],
    ids=["vllm-true", "vllm-false", "llamacpp-true", "llamacpp-false"],
)
async def test_add_special_switches_are_taken_and_the_ids_are_what_the_route_runs(
    client: TestClient, switch: dict[str, bool]
) -> None:
    plain = await tokenize(client, prompt="Hello there")
    switched = await tokenize(client, prompt="Hello there", **switch)
    completion = await client.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 1})
    usage = (await completion.json())["usage"]
    assert switched["tokens"] == plain["tokens"] == list(b"Hello there")  # this engine adds no BOS or EOS
    assert switched["count"] == usage["prompt_tokens"]


async def test_messages_take_vllms_add_special_tokens(client: TestClient) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    plain = await tokenize(client, messages=messages)
    assert await tokenize(client, messages=messages, add_special_tokens=False) == plain


async def test_llamacpp_content_is_the_prompt(client: TestClient) -> None:
    assert await tokenize(client, content=TEXT, add_special=True) == await tokenize(client, prompt=TEXT)


async def test_with_pieces_answers_ids_with_their_text_or_bytes(client: TestClient) -> None:
    pieces = (await tokenize(client, content="Hé", with_pieces=True))["tokens"]
    # bytes as tokens: `é` is two tokens, neither UTF-8 alone, so their pieces are byte lists (as llama-server's)
    assert pieces == [{"id": 72, "piece": "H"}, {"id": 0xC3, "piece": [0xC3]}, {"id": 0xA9, "piece": [0xA9]}]


async def test_parse_special_false_reads_a_special_spelling_as_text() -> None:
    async with special_server() as client:
        parsed = (await tokenize(client, content="a<|end|>"))["tokens"]
        literal = (await tokenize(client, content="a<|end|>", parse_special=False))["tokens"]
        pieces = (await tokenize(client, content="a<|end|>", with_pieces=True))["tokens"]
    assert parsed == [ord("a"), END]
    assert literal == list(b"a<|end|>")
    assert pieces == [{"id": ord("a"), "piece": "a"}, {"id": END, "piece": "<|end|>"}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "a", "with_pieces": "yes"}, "with_pieces"),
        ({"prompt": "a", "add_special_tokens": 1}, "add_special_tokens"),
        ({"prompt": "a", "content": "a"}, "prompt"),
        ({"content": 3}, "content"),
        ({"prompt": "a", "return_tokens": True}, "return_tokens"),
    ],
)
async def test_bad_tokenize_requests_are_400s(client: TestClient, body: dict[str, Any], param: str) -> None:
    resp = await client.post("/tokenize", json=body)
    assert resp.status == 400 and (await resp.json())["error"]["param"] == param
