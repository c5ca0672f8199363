"""A request body sent with `Content-Encoding` (gzip, deflate): the gateway's server decodes it, keys the decoded
body and forwards the decoded body without the field (design §2.1: `Content-Encoding` is consumed by the gateway).

The upstream is a real aiohttp server, which decodes a body by its `Content-Encoding` as any HTTP server does: a
gateway that forwarded the client's field beside the body it had already decoded gets the upstream's 400.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from harness.gateway import RunningGateway, gateway_config, start_gateway

BODY = {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "pack for Oslo?"}]}
RAW = json.dumps(BODY).encode()


class Upstream:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.encodings: list[str | None] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(self, request: web.Request) -> web.Response:
        self.encodings.append(request.headers.get("Content-Encoding"))
        body = await request.json()  # aiohttp decodes by Content-Encoding first, as any server does
        self.bodies.append(body)
        answer = {
            "id": f"chatcmpl-{len(self.bodies)}",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "wool"}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        }
        return web.json_response(answer)


@pytest.fixture
async def setup() -> AsyncIterator[tuple[Upstream, RunningGateway]]:
    fake = Upstream()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    gw = await start_gateway(gateway_config(str(server.make_url("")).rstrip("/")))
    yield fake, gw
    await gw.close()
    await server.close()


async def ask(gw: RunningGateway, data: bytes, encoding: str | None) -> tuple[int, str, dict[str, Any]]:
    headers = {"Content-Type": "application/json", "Authorization": "Bearer t"}
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    resp = await gw.client.post("/v1/chat/completions", data=data, headers=headers)
    return resp.status, resp.headers.get("Cache-Status", ""), await resp.json()


async def test_an_encoded_body_is_decoded_keyed_and_forwarded_plain(
    setup: tuple[Upstream, RunningGateway],
) -> None:
    fake, gw = setup
    status, cache, doc = await ask(gw, gzip.compress(RAW), "gzip")
    assert status == 200 and "fwd=miss" in cache, doc
    assert fake.bodies == [BODY] and fake.encodings == [None]
    # the same request, encoded otherwise or not at all, is the same request: one entry answers it
    for data, encoding in ((zlib.compress(RAW), "deflate"), (RAW, None), (gzip.compress(RAW), "gzip")):
        status, cache, again = await ask(gw, data, encoding)
        assert status == 200 and cache.startswith("tokenedge; hit"), (encoding, cache)
        assert again == doc
    assert len(fake.bodies) == 1


async def test_a_body_its_encoding_does_not_decode_is_a_400(setup: tuple[Upstream, RunningGateway]) -> None:
    fake, gw = setup
    status, _, doc = await ask(gw, b"not gzip at all", "gzip")
    assert status == 400, doc
    assert doc["error"]["type"] == "invalid_request_error" and doc["error"]["code"] == "invalid_body_encoding"
    assert fake.bodies == []


async def test_mutation_forwarding_the_field_is_caught(
    setup: tuple[Upstream, RunningGateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first check catches the bug it exists for: with the field forwarded beside the decoded body, the
    upstream cannot decode what it gets, and the caller gets no answer."""
    import gateway.upstream.http as http

    monkeypatch.setattr(http, "GATEWAY_ONLY", http.GATEWAY_ONLY - {"content-encoding"})
    fake, gw = setup
    headers = {"Content-Type": "application/json", "Authorization": "Bearer t", "Content-Encoding": "gzip"}
    resp = await gw.client.post("/v1/chat/completions", data=gzip.compress(RAW), headers=headers)
    assert resp.status != 200 and fake.bodies == [] and fake.encodings == ["gzip"]
