"""One rule for what is an error (issue 35), for every endpoint: `gateway.keys.policy.error_body`.

A `200` whose body has an `error` member, or lacks the endpoint's payload (`choices`, `data`, `output`), is relayed
as it is and never stored (`Cache-Status: ...; detail=error`); so is a stream whose chunk carries `error`. The
upstream here answers whatever the test sets, with status 200, and counts the calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.keys.policy import error_body
from tests.gateway.conftest import AUTH_A, GatewayFactory

ERROR = {"error": {"message": "the model crashed after the headers", "type": "server_error", "code": None}}
REQUESTS = {
    "chat/completions": {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "hi"}]},
    "completions": {"model": "m", "temperature": 0, "prompt": "hi"},
    "embeddings": {"model": "m", "input": "hi"},
    "responses": {"model": "m", "temperature": 0, "input": "hi", "store": False},
}
USAGE = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
# Per endpoint: a 200 without its payload (but otherwise like an answer, usage included).
PAYLOADLESS = {
    "chat/completions": {"id": "x", "object": "chat.completion", "model": "m", "usage": USAGE},
    "completions": {"id": "x", "object": "text_completion", "model": "m", "usage": USAGE},
    "embeddings": {"object": "list", "model": "m", "usage": USAGE},
    "responses": {"id": "r", "object": "response", "status": "completed", "model": "m", "usage": USAGE},
}


@dataclass
class Scripted:
    body: dict[str, Any]
    stream: list[bytes] | None = None  # SSE payloads answered to `stream: true`
    calls: int = 0

    async def answer(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        if not (await request.json()).get("stream") or self.stream is None:
            return web.json_response(self.body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for payload in self.stream:
            await resp.write(b"data: " + payload + b"\n\n")
        await resp.write_eof()
        return resp

    async def models(self, request: web.Request) -> web.Response:
        model = {"id": "m", "object": "model", "owned_by": "t", "tokenedge": {"revision": "r1"}}
        return web.json_response({"object": "list", "data": [model]})


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[Scripted, str]]:
    upstream = Scripted(ERROR)
    app = web.Application()
    app.router.add_get("/v1/models", upstream.models)
    app.router.add_post("/v1/{route:.+}", upstream.answer)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield upstream, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def twice(gw: Any, route: str, body: dict[str, Any]) -> list[tuple[int, str, bytes]]:
    out = []
    for _ in range(2):
        resp = await gw.client.post(f"/v1/{route}", json=body, headers=AUTH_A)
        out.append((resp.status, resp.headers["Cache-Status"], await resp.read()))
    return out


@pytest.mark.parametrize("kind", ["error-member", "no-payload"])
@pytest.mark.parametrize("route", list(REQUESTS))
async def test_a_200_error_body_is_relayed_and_never_stored(
    make_gateway: GatewayFactory, scripted: tuple[Scripted, str], route: str, kind: str
) -> None:
    upstream, url = scripted
    upstream.body = ERROR if kind == "error-member" else PAYLOADLESS[route]
    gw = await make_gateway(url)
    answers = await twice(gw, route, REQUESTS[route])

    assert upstream.calls == 2  # the second asked the upstream again: nothing was stored
    for status, cache_status, raw in answers:
        assert status == 200 and orjson.loads(raw) == upstream.body  # relayed as it is
        assert cache_status.startswith("tokenedge; fwd=miss; detail=error.")


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
async def test_a_stream_whose_chunk_carries_an_error_is_never_stored(
    make_gateway: GatewayFactory, scripted: tuple[Scripted, str], route: str
) -> None:
    upstream, url = scripted
    chunk = {"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": []}
    upstream.stream = [orjson.dumps(chunk), orjson.dumps(ERROR), b"[DONE]"]
    gw = await make_gateway(url)
    for _ in range(2):
        resp = await gw.client.post(f"/v1/{route}", json={**REQUESTS[route], "stream": True}, headers=AUTH_A)
        assert b'"the model crashed' in await resp.read()  # relayed
    assert upstream.calls == 2


async def test_a_streamed_request_answered_with_a_json_error_says_error(
    make_gateway: GatewayFactory, scripted: tuple[Scripted, str]
) -> None:
    _, url = scripted
    gw = await make_gateway(url)
    body = {**REQUESTS["chat/completions"], "stream": True}
    resp = await gw.client.post("/v1/chat/completions", json=body, headers=AUTH_A)
    assert orjson.loads(await resp.read()) == ERROR
    assert resp.headers["Cache-Status"].startswith("tokenedge; fwd=miss; detail=error.")


ERROR_BODIES = [
    ("chat answer", "chat/completions", {"choices": [], "usage": USAGE}, False),
    ("chat error", "chat/completions", ERROR, True),
    ("chat error beside choices", "chat/completions", {"choices": [], **ERROR}, True),
    ("chat without choices", "chat/completions", PAYLOADLESS["chat/completions"], True),
    ("choices not a list", "completions", {"choices": {"0": {}}}, True),
    ("embeddings answer", "embeddings", {"object": "list", "data": []}, False),
    ("embeddings error", "embeddings", ERROR, True),
    ("embeddings without data", "embeddings", PAYLOADLESS["embeddings"], True),
    ("response with a null error", "responses", {"output": [], "error": None}, False),
    ("response with an error", "responses", {"output": [], **ERROR}, True),
    ("response without output", "responses", PAYLOADLESS["responses"], True),
]


@pytest.mark.parametrize(
    ("route", "doc", "expected"), [c[1:] for c in ERROR_BODIES], ids=[c[0] for c in ERROR_BODIES]
)
def test_what_is_an_error(route: str, doc: dict[str, Any], expected: bool) -> None:
    assert error_body(route, doc) is expected
