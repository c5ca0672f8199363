"""The backend app serving the tiny random-weight model in-process, and an `openai` client for it: what the server's
HTTP tests share (the byte tokenizer, greedy by default, up to 4 choices a request)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import openai
from aiohttp.test_utils import TestClient, TestServer

from backend.engine.async_engine import AsyncEngine
from backend.engine.config import EngineConfig
from backend.server import ServedModel, ServerLimits, create_app
from harness.models.tiny import tiny_model
from tests.backend.test_server_engine import EOS, byte_tokenizer


@contextlib.asynccontextmanager
async def tiny_server(*, num_blocks: int = 96, max_model_len: int = 512) -> AsyncIterator[TestClient]:
    model = tiny_model(seed=0)
    config = EngineConfig(
        num_blocks=num_blocks, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=max_model_len
    )
    served = ServedModel(
        id="tiny", revision="rev-tiny", tokenizer=byte_tokenizer(), max_model_len=max_model_len, created=0
    )
    app = create_app(served, lambda: AsyncEngine(model, config, frozenset({EOS})), ServerLimits(max_n=4))
    async with TestClient(TestServer(app)) as client:
        yield client


def openai_client(client: TestClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0)
