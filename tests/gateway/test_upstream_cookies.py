"""One upstream session serves every caller: a cookie the upstream sets for one caller never reaches the upstream
on another caller's request (design §2.1: every part of a request the upstream sees is this caller's).

aiohttp's default `ClientSession` keeps a cookie jar: an upstream (or a load balancer in front of it) that sets a
session or stickiness cookie on caller A's answer would get it back on caller B's request, and could answer B as A.
The upstream here sets a cookie named after the caller on every answer and records the `Cookie` headers it gets.
It is addressed by host name (`localhost`), as production upstreams are: aiohttp's jar refuses cookies from bare IP
addresses, which would hide the leak.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from harness.gateway import gateway_config, start_gateway


class CookieUpstream:
    def __init__(self) -> None:
        self.cookies: list[str | None] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(self, request: web.Request) -> web.Response:
        self.cookies.append(request.headers.get("Cookie"))
        body = await request.json()
        caller = request.headers.get("Authorization", "").removeprefix("Bearer ")
        answer = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": body["model"],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
        return web.json_response(answer, headers={"Set-Cookie": f"sid=secret-of-{caller}; Path=/"})


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[CookieUpstream, str]]:
    fake = CookieUpstream()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    yield fake, f"http://localhost:{server.port}"
    await server.close()


async def two_callers(fake: CookieUpstream, url: str) -> list[str | None]:
    """Caller A, then caller B, each with a question of its own (two misses); the cookies the upstream got."""
    gw = await start_gateway(gateway_config(url))
    try:
        for n, caller in enumerate(("alice", "bob")):
            body: dict[str, Any] = {
                "model": "m",
                "temperature": 0,
                "messages": [{"role": "user", "content": f"q{n}"}],
            }
            resp = await gw.client.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {caller}"}
            )
            assert resp.status == 200, await resp.text()
            await resp.read()
    finally:
        await gw.close()
    return fake.cookies


async def test_an_upstream_cookie_never_rides_on_another_callers_request(
    upstream: tuple[CookieUpstream, str],
) -> None:
    fake, url = upstream
    assert await two_callers(fake, url) == [None, None]


async def test_mutation_a_session_cookie_jar_is_caught(
    upstream: tuple[CookieUpstream, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above catches the bug it exists for: with aiohttp's default jar back, bob's request carries
    alice's cookie."""
    monkeypatch.setattr(aiohttp, "DummyCookieJar", functools.partial(aiohttp.CookieJar))
    fake, url = upstream
    assert await two_callers(fake, url) == [None, "sid=secret-of-alice"]
