"""SmolLM2 end to end: greedy fp32 generation through our engine equals the committed goldens, and the HTTP
server answers a real question. The model is loaded once for the module (slow tests, still in the suite)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from backend.engine.async_engine import AsyncEngine
from backend.engine.config import EngineConfig
from backend.engine.sampling_params import SamplingParams
from backend.loader import load_model
from backend.model.llama import LlamaModel
from backend.server import ServedModel, create_app
from backend.server.state import ENGINE_KEY

SERVED_PATHS: web.AppKey[list[str]] = web.AppKey("served_paths", list)
GOLDENS = json.loads((Path(__file__).parent / "data" / "smollm2_generation_goldens.json").read_text())
pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served() -> AsyncIterator[tuple[TestClient, web.Application]]:
    loaded = load_model(None, progress=False)
    model = LlamaModel(loaded.config, dtype=torch.float32)
    model.load_weights(loaded.weights)
    config = EngineConfig(
        speculative_tokens=0, num_blocks=128, max_num_seqs=4, max_num_batched_tokens=512, max_model_len=1024
    )
    info = ServedModel(
        id=loaded.name, revision=loaded.revision, tokenizer=loaded.tokenizer, max_model_len=1024, created=0
    )
    app = create_app(info, lambda: AsyncEngine(model, config, loaded.tokenizer.eos_token_ids))
    app[SERVED_PATHS] = []

    async def record(request: web.Request, _response: web.StreamResponse) -> None:
        request.app[SERVED_PATHS].append(request.path)

    app.on_response_prepare.append(record)
    async with TestClient(TestServer(app)) as client:
        yield client, app


async def test_greedy_fp32_generation_matches_the_goldens(served: tuple[TestClient, web.Application]) -> None:
    _, app = served
    engine: Any = app[ENGINE_KEY]
    params = SamplingParams(temperature=0.0, max_tokens=GOLDENS["max_new_tokens"])
    for i, prompt in enumerate(GOLDENS["prompts"]):
        out = [
            t.token_id
            async for t in engine.generate(engine.prompt(prompt["prompt_ids"]), params, f"golden-{i}")
        ]
        assert out == prompt["golden_ids"], prompt["messages"]


async def test_capital_of_france_over_http(served: tuple[TestClient, web.Application]) -> None:
    client, _ = served
    resp = await client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0,
            "max_tokens": 16,
        },
    )
    body = await resp.json()
    assert resp.status == 200, body
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "stop"


async def test_models_lists_smollm2_with_revision_and_tokenizer(
    served: tuple[TestClient, web.Application],
) -> None:
    client, _ = served
    entry = (await (await client.get("/v1/models")).json())["data"][0]
    assert entry["id"] == "SmolLM2-135M-Instruct"
    assert entry["tokenedge"]["revision"].startswith("rev-")
    assert entry["tokenedge"]["tokenizer"].startswith("tok-")


@pytest.mark.parametrize("stream", [False, True])
async def test_json_and_binary_transports_give_identical_answers_with_the_real_model(
    served: tuple[TestClient, web.Application], tmp_path: Path, stream: bool
) -> None:
    """Issue 7: the same greedy requests through a JSON-transport gateway and a binary-transport gateway, both in
    front of the real SmolLM2 engine, give identical client responses (ids and timestamps normalized)."""
    from harness.gateway import FakeClock, gateway_config, start_gateway
    from tests.gateway.test_tokens_path import answer

    client, app = served
    paths = app[SERVED_PATHS]
    url = str(client.server.make_url("")).rstrip("/")
    gateways = [
        await start_gateway(
            gateway_config(url, tokens={"cache_dir": str(tmp_path), "binary_transport": binary}), FakeClock()
        )
        for binary in (False, True)
    ]
    try:
        for question in ("What is the capital of France?", "Name three colours.", "Say hello in French."):
            body = {
                "model": "SmolLM2-135M-Instruct",
                "temperature": 0,
                "max_tokens": 12,
                "stream": stream,
                "messages": [{"role": "user", "content": question}],
            }
            # Warm the engine's prefix cache first, so both transports report the same `cached_tokens`.
            assert (await client.post("/v1/chat/completions", json=body)).status == 200
            via_json = await answer(gateways[0], "/v1/chat/completions", body)
            assert paths[-1] == "/v1/chat/completions"
            via_binary = await answer(gateways[1], "/v1/chat/completions", body)
            assert paths[-1] == "/v1/tokens/generate"
            assert via_json[0] == 200
            assert via_binary == via_json
    finally:
        for gw in gateways:
            await gw.close()
