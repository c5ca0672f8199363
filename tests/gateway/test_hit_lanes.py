"""Every way of answering a hit goes through the hit core (gateway/hits): one edit reaches every lane.

The lanes: the fast lane (a plain POST whose bytes the memo knows), the ordinary JSON path (a request with cache
directives), the streamed hit, the GET alias (and its HEAD), the conditional answers. A header added to the core's
block is on all of them; the app's own response-prepare handlers and middleware are honoured on all of them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from gateway.app import create_app
from gateway.edge.server import EdgeTestServer
from gateway.hits import render
from gateway.hits.verdict import Condition, Verdict, condition, judge
from gateway.keys.cache_control import RequestDirectives
from gateway.keys.entry import Entry, make_etag
from harness.gateway import FakeClock, gateway_config
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory

JSON = {**AUTH_A, "Content-Type": "application/json"}
RAW = orjson.dumps(CHAT)


async def lanes(client: TestClient) -> dict[str, Any]:
    """The same stored answer through every lane: name -> (status, headers)."""
    first = await client.post("/v1/chat/completions", data=RAW, headers=JSON)
    assert first.status == 200 and "stored" in first.headers["Cache-Status"]
    key, etag = first.headers["X-Cache-Key"], first.headers["ETag"]
    await client.post("/v1/chat/completions", data=RAW, headers=JSON)  # the memo knows the bytes now
    seen: dict[str, Any] = {}
    asks: list[tuple[str, str, str, dict[str, str], bytes | None]] = [
        ("fast lane", "POST", "/v1/chat/completions", JSON, RAW),
        ("ordinary JSON", "POST", "/v1/chat/completions", {**JSON, "Cache-Control": "max-age=3600"}, RAW),
        ("streamed", "POST", "/v1/chat/completions", JSON, orjson.dumps({**CHAT, "stream": True})),
        ("alias", "GET", f"/v1/cache/{key}", AUTH_A, None),
        ("alias HEAD", "HEAD", f"/v1/cache/{key}", AUTH_A, None),
        ("alias 304", "GET", f"/v1/cache/{key}", {**AUTH_A, "If-None-Match": etag}, None),
        ("POST 412", "POST", "/v1/chat/completions", {**JSON, "If-None-Match": etag}, RAW),
    ]
    for name, method, path, headers, data in asks:
        resp = await client.request(method, path, data=data, headers=headers)
        await resp.read()
        seen[name] = (resp.status, resp.headers)
    return seen


@pytest.fixture
def marked_block(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """The core's header block with one more header, as a hit rule added in one place would be."""
    plain = render.block

    def marked(*args: Any) -> tuple[dict[str, str], int]:
        headers, truncated = plain(*args)
        return {**headers, "X-Core-Rule": "on"}, truncated

    monkeypatch.setattr(render, "block", marked)
    render.clear()
    yield None
    render.clear()


async def test_a_header_added_to_the_core_is_on_every_hit_lane(
    make_gateway: GatewayFactory, marked_block: None
) -> None:
    gw = await make_gateway()
    seen = await lanes(gw.client)
    expected_status = {"alias 304": 304, "POST 412": 412}
    for name, (status, headers) in seen.items():
        assert status == expected_status.get(name, 200), name
        assert headers.get("X-Core-Rule") == "on", name
        assert headers["Cache-Status"].startswith("tokenedge; hit"), name


@pytest.mark.parametrize("middleware", [False, True])
async def test_a_second_response_prepare_handler_and_a_middleware_are_honoured_on_every_lane(
    upstream_url: str, caplog: pytest.LogCaptureFixture, middleware: bool
) -> None:
    app = create_app(gateway_config(upstream_url), clock=FakeClock())

    async def stamp(_request: web.Request, response: web.StreamResponse) -> None:
        response.headers["X-Prepared"] = "yes"

    ran: list[str] = []

    @web.middleware
    async def tag(request: web.Request, handler: Any) -> web.StreamResponse:
        ran.append(request.path)  # a streamed answer is sent before a middleware could add a header to it
        return await handler(request)

    app.on_response_prepare.append(stamp)
    if middleware:
        app.middlewares.append(tag)
    client = TestClient(EdgeTestServer(app, host="127.0.0.1"))
    with caplog.at_level(logging.INFO, logger="tokenedge.edge"):
        await client.start_server()
    try:
        seen = await lanes(client)
    finally:
        await client.close()
    for name, (_, headers) in seen.items():
        assert headers.get("X-Prepared") == "yes", name
    assert len(ran) == (2 + len(seen) if middleware else 0)  # every request went through the middleware
    assert any("fast lane off" in r.getMessage() for r in caplog.records)  # said at start-up, not silent


def test_the_verdict_is_one_pure_table() -> None:
    body = b'{"ok":true}'
    entry = Entry("te1:pub:d", "chat/completions", body, "m", "r1", 1000.0, 60, 30, make_etag(body), ())
    assert judge(entry, 1030.0) is Verdict.HIT
    assert judge(entry, 1030.0, revision="r1") is Verdict.HIT
    assert judge(entry, 1030.0, revision="r2") is Verdict.MISS  # an old revision, once the new one is known
    assert judge(entry, 1030.0, RequestDirectives(max_age_s=10)) is Verdict.MISS  # fresh, but too old for it
    assert judge(entry, 1070.0) is Verdict.STALE
    assert judge(entry, 1091.0) is Verdict.MISS
    etag = entry.etag
    assert condition("GET", etag, etag) is Condition.NOT_MODIFIED
    assert condition("HEAD", f"W/{etag}", etag) is Condition.NOT_MODIFIED
    assert condition("POST", f'"other", {etag}', etag) is Condition.PRECONDITION_FAILED
    assert condition("POST", "*", etag) is Condition.PRECONDITION_FAILED
    assert condition("POST", '"other"', etag) is Condition.NONE
    assert condition("GET", None, etag) is Condition.NONE
