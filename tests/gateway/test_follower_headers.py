"""Coalesced followers get exactly the headers the entry would carry, never the leader's upstream fields.

The upstream here stamps every answer with what real providers send per request and per account
(`x-ratelimit-remaining-requests`, `openai-organization`, `x-request-id`), derived from the caller's credential.
Two callers with different credentials ask the same thing on a public route; the leader's upstream call is held by a
gate until the second has joined its flight (JSON), its stream (SSE) or, on another replica, waits on its
lease, so the second is a follower.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.hits import headers as hdr
from gateway.upstream.http import relay_headers
from harness.gateway import RunningGateway
from harness.replicas import replicas
from tests.gateway.conftest import AUTH_A, AUTH_B, CHAT, GatewayFactory
from tests.gateway.test_lease import env as lease_env
from tests.gateway.test_lease import until_waiting
from tests.support.fake_upstream import FakeUpstream

PUBLIC = {"chat/completions": {"scope": "public"}}
LEADER_ONLY = ("x-ratelimit-remaining-requests", "openai-organization", "x-request-id")


@dataclass
class StampingUpstream(FakeUpstream):
    """The fake upstream, plus per-request, per-credential response headers on every answer."""

    stamps: itertools.count = field(default_factory=lambda: itertools.count(1))

    def app(self) -> web.Application:
        app = super().app()
        app.on_response_prepare.append(self._stamp)
        return app

    async def _stamp(self, request: web.Request, response: web.StreamResponse) -> None:
        n = next(self.stamps)
        who = request.headers.get("Authorization", "anon").rsplit(" ", 1)[-1]
        response.headers["x-ratelimit-remaining-requests"] = str(1000 - n)
        response.headers["openai-organization"] = f"org-of-{who}"
        response.headers["x-request-id"] = f"req-{n}"
        response.headers["Retry-After"] = "7"


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    yield StampingUpstream()


async def post(gw: RunningGateway, body: dict[str, Any], auth: Mapping[str, str]) -> aiohttp.ClientResponse:
    return await gw.client.post("/v1/chat/completions", json=body, headers=dict(auth))


async def leader_and_follower(
    gw: RunningGateway, fake: FakeUpstream, body: dict[str, Any]
) -> tuple[aiohttp.ClientResponse, aiohttp.ClientResponse]:
    """A's request leads a JSON flight held at the upstream until B's has joined it."""
    fake.gate = asyncio.Event()
    leader = asyncio.create_task(post(gw, body, AUTH_A))
    await fake.entered.wait()
    follower = asyncio.create_task(post(gw, body, AUTH_B))
    key = next(iter(gw.state.flights._flights))
    while gw.state.flights.followers(key) == 0:
        await asyncio.sleep(0)  # yields until B has joined; no wall-clock wait
    fake.gate.set()
    return await leader, await follower


async def test_a_json_follower_gets_the_entrys_headers_not_the_leaders(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway(routes=PUBLIC)
    led, followed = await leader_and_follower(gw, fake, CHAT)
    hit = await post(gw, CHAT, AUTH_B)

    assert fake.calls["chat"] == 1
    assert led.headers["openai-organization"] == "org-of-tenant-a-key"  # the leader keeps its own answer's
    assert "collapsed" in followed.headers["Cache-Status"] and "stored" in followed.headers["Cache-Status"]
    for name in LEADER_ONLY:
        assert name not in followed.headers, name
        assert name not in hit.headers, name
    entry_names = {
        n for n in hit.headers if n not in ("Cache-Status", "Age", "Date", "Server", "Content-Length")
    }
    assert {
        n for n in followed.headers if n not in ("Cache-Status", "Age", "Date", "Server", "Content-Length")
    } == (entry_names)
    for name in entry_names:
        assert followed.headers[name] == hit.headers[name], name


async def test_a_json_follower_of_an_unstored_answer_gets_no_leader_fields(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway(routes=PUBLIC)
    fake.status = 503
    led, followed = await leader_and_follower(gw, fake, CHAT)

    assert led.status == followed.status == 503 and fake.calls["chat"] == 1
    assert led.headers["openai-organization"] == "org-of-tenant-a-key" and "x-request-id" in led.headers
    assert "collapsed" in followed.headers["Cache-Status"]
    for name in LEADER_ONLY:
        assert name not in followed.headers, name
    assert followed.headers["Retry-After"] == "7"  # when to ask again describes the upstream, not the leader


async def test_a_streamed_follower_gets_no_leader_fields(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway(routes=PUBLIC)
    fake.stream_gates = [asyncio.Event() for _ in range(6)]
    fake.stream_gates[0].set()
    body = {**CHAT, "stream": True}
    led = await post(gw, body, AUTH_A)
    await led.content.readline()  # the stream is in flight, its first event sent
    followed = await post(gw, body, AUTH_B)  # its headers are sent once it joined the flight
    for gate in fake.stream_gates:
        gate.set()
    led_body, followed_body = await led.read(), await followed.read()

    assert fake.calls["chat"] == 1 and followed_body.endswith(b"data: [DONE]\n\n") and led_body
    assert led.headers["openai-organization"] == "org-of-tenant-a-key"
    assert "collapsed" in followed.headers["Cache-Status"]
    for name in LEADER_ONLY:
        assert name not in followed.headers, name
    assert followed.headers["Vary"] == "Accept-Encoding"  # a public answer names no credential


async def test_mutation_a_follower_given_the_leaders_fields_fails_the_check(
    make_gateway: GatewayFactory, fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule the tests above check, broken on purpose: relaying everything puts the leader's fields on B."""
    monkeypatch.setattr(hdr, "relayed", lambda upstream, collapsed: relay_headers(upstream))
    gw = await make_gateway(routes=PUBLIC)
    fake.status = 503
    _, followed = await leader_and_follower(gw, fake, CHAT)
    assert "collapsed" in followed.headers["Cache-Status"]
    assert followed.headers["openai-organization"] == "org-of-tenant-a-key"


async def test_a_follower_on_another_replica_gets_the_entrys_headers(
    fake: FakeUpstream, upstream_url: str, redis_url: str
) -> None:
    """Coalesced across replicas by the lease: B's replica answers from A's stored entry, with its headers only."""
    fake.gate = asyncio.Event()
    settings = {**lease_env(redis_url), "TOKENEDGE_ROUTES_CHAT_COMPLETIONS_SCOPE": "public"}
    async with replicas(upstream_url, 2, settings) as (a, b), aiohttp.ClientSession() as session:
        body = {**CHAT, "messages": [{"role": "user", "content": "across replicas"}]}

        async def ask(url: str, auth: Mapping[str, str]) -> aiohttp.ClientResponse:
            async with session.post(url + "/v1/chat/completions", json=body, headers=dict(auth)) as resp:
                await resp.read()
                return resp

        led = asyncio.ensure_future(ask(a.url, AUTH_A))
        await fake.entered.wait()
        followed = asyncio.ensure_future(ask(b.url, AUTH_B))
        await until_waiting(session, [b.url])  # B's replica is parked on A's lease
        fake.gate.set()
        led_resp, followed_resp = await led, await followed
    assert fake.calls["chat"] == 1
    assert led_resp.headers["openai-organization"] == "org-of-tenant-a-key"
    assert "collapsed" in followed_resp.headers["Cache-Status"]
    for name in LEADER_ONLY:
        assert name not in followed_resp.headers, name
    assert followed_resp.headers["ETag"] == led_resp.headers["ETag"]
