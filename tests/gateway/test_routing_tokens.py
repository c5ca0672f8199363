"""The router on the binary token path: two real backend apps (scripted engine, ChatML byte tokenizer) behind one
gateway; misses go as token ids, and affinity follows the ids (a conversation's next turn, whose ids extend the
last turn's, goes where that turn went)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from gateway.upstream.routing.attempt import BACKEND_HEADER, ROUTE_HEADER
from gateway.upstream.routing.pool import UpstreamPool
from harness.gateway import FakeClock, RunningGateway, gateway_config, start_gateway
from tests.support.token_backend import EchoEngine, backend_app, chatml_byte_tokenizer

TOKENIZER = chatml_byte_tokenizer()


@pytest.fixture
async def backends() -> AsyncIterator[list[tuple[str, EchoEngine, list[str]]]]:
    started, out = [], []
    for _ in range(2):
        engine, paths = EchoEngine(TOKENIZER), []
        app = backend_app(TOKENIZER, engine, max_model_len=512)

        async def record(request: Any, response: Any, paths: list[str] = paths) -> None:
            paths.append(request.path)

        app.on_response_prepare.append(record)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        started.append(server)
        out.append((str(server.make_url("")).rstrip("/"), engine, paths))
    yield out
    for server in started:
        await server.close()


@pytest.fixture
async def gw(
    backends: list[tuple[str, EchoEngine, list[str]]], tmp_path: Path
) -> AsyncIterator[RunningGateway]:
    config = gateway_config(
        ",".join(url for url, _, _ in backends), tokens={"cache_dir": str(tmp_path), "binary_transport": True}
    )
    gateway = await start_gateway(config, FakeClock())
    yield gateway
    await gateway.close()


async def ask(gw: RunningGateway, messages: list[dict[str, str]]) -> str:
    body = {"model": "tiny", "temperature": 0, "max_tokens": 8, "messages": messages}
    resp = await gw.client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer k"})
    assert resp.status == 200, await resp.text()
    return str((await resp.json())["choices"][0]["message"]["content"])


async def test_a_conversation_follows_its_token_prefix_to_one_backend(
    gw: RunningGateway, backends: list[tuple[str, EchoEngine, list[str]]]
) -> None:
    assert isinstance(gw.state.upstream, UpstreamPool)
    for k in range(4):  # four conversations with distinct system prompts: no shared prefix, they spread
        messages = [{"role": "system", "content": f"{k}: be brief and exact. " * 3}]
        owners = []
        for turn in range(2):
            messages.append({"role": "user", "content": f"question {turn} of conversation {k}"})
            before = [len(engine.prompts) for _, engine, _ in backends]
            messages.append({"role": "assistant", "content": await ask(gw, messages)})
            grew = [len(e.prompts) - b for (_, e, _), b in zip(backends, before, strict=True)]
            assert sorted(grew) == [0, 1]
            owners.append(grew.index(1))
        assert owners[0] == owners[1]
        first, second = backends[owners[0]][1].prompts[-2:]
        assert second[: len(first)] == first  # the second turn's ids extend the first's
    assert all(len(engine.prompts) == 4 for _, engine, _ in backends)  # 2 conversations each
    assert all(set(paths) >= {"/v1/tokens/generate"} for _, _, paths in backends)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_miss_over_the_binary_transport_names_its_engine(
    gw: RunningGateway, backends: list[tuple[str, EchoEngine, list[str]]], stream: bool
) -> None:
    """X-Tokenedge-Backend and X-Tokenedge-Route reach the client from a binary-transport miss, JSON or streamed,
    as they do from a JSON one (the rendered answer used to carry only its own content headers)."""
    body = {"model": "tiny", "temperature": 0, "max_tokens": 8, "stream": stream}
    body["messages"] = [{"role": "user", "content": f"where did this go? stream={stream}"}]
    resp = await gw.client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer k"})
    assert resp.status == 200, await resp.text()
    await resp.read()
    grew = [url for url, engine, paths in backends if paths and paths[-1] == "/v1/tokens/generate"]
    assert len(grew) == 1
    named = resp.headers[BACKEND_HEADER]
    assert named == grew[0].removeprefix("http://")
    assert f"backend={named}" in resp.headers[ROUTE_HEADER] and "policy=" in resp.headers[ROUTE_HEADER]
