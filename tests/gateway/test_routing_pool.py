"""The pool over real loopback HTTP servers: retries before the first byte only, ejection and probes, routing by
model and revision, the merged catalog, and the gateway wiring (one URL builds no pool)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from gateway.config.upstream import BackendConfig, UpstreamConfig
from gateway.ops.routing_metrics import RoutingMetrics
from gateway.upstream.catalog import REVISION_HEADER, ModelCatalog
from gateway.upstream.http import Upstream
from gateway.upstream.routing import health
from gateway.upstream.routing.build import build_upstream, connect
from gateway.upstream.routing.pool import UpstreamPool
from gateway.web.errors import UpstreamError, UpstreamTimeout
from harness.gateway import FakeClock
from harness.services import free_port
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory


@dataclass
class Backend:
    models: dict[str, str] = field(default_factory=lambda: {"test-model": "rev-1"})
    mode: str = "ok"  # ok | 503 | 400 | cut (head, half a body, then the connection drops) | slow
    calls: Counter[str] = field(default_factory=Counter)
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def list_models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "tokenedge": {"revision": r}} for m, r in self.models.items()]
        return web.json_response({"object": "list", "data": data})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.calls[body.get("model")] += 1
        if self.mode == "slow":
            await asyncio.sleep(2.0)
        if self.mode in ("503", "400"):
            return web.json_response({"error": {"message": self.mode}}, status=int(self.mode))
        headers = {REVISION_HEADER: self.models.get(body.get("model"), "none")}
        if self.mode == "cut":
            resp = web.StreamResponse(headers={**headers, "Content-Length": "1000"})
            await resp.prepare(request)
            await resp.write(b'{"partial": ')
            assert request.transport is not None
            request.transport.close()
            return resp
        doc = {"choices": [{"message": {"content": f"from {self.url}"}, "finish_reason": "stop"}]}
        return web.json_response(doc, headers=headers)


@pytest.fixture
async def servers() -> AsyncIterator[list[Backend]]:
    backends = [Backend() for _ in range(3)]
    started = []
    for b in backends:
        server = TestServer(b.app(), host="127.0.0.1")
        await server.start_server()
        b.url = str(server.make_url("")).rstrip("/")
        started.append(server)
    yield backends
    for server in started:
        await server.close()


def make_pool(session: aiohttp.ClientSession, urls: list[str], **extra: Any) -> UpstreamPool:
    config = UpstreamConfig(url=tuple(urls), connect_timeout_s=0.5, **extra)
    pool = build_upstream(config, session, RoutingMetrics(CollectorRegistry()))
    assert isinstance(pool, UpstreamPool)
    return pool


def chat(model: str = "test-model", content: str = "hello") -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": content}]})


DEAD = f"http://127.0.0.1:{free_port()}"


async def test_a_refused_connection_is_retried_on_another_backend_and_ejects_the_dead_one(
    session: aiohttp.ClientSession, servers: list[Backend]
) -> None:
    pool = make_pool(session, [DEAD, servers[0].url], eject_after_failures=2)
    for i in range(6):
        resp = await pool.request("POST", "/v1/chat/completions", {}, chat(content=f"q{i}"))
        assert resp.status == 200
    assert servers[0].calls["test-model"] == 6
    dead = pool.backends[0]
    assert dead.breaker.ejections == 1 and not dead.breaker.available()


@pytest.mark.parametrize("failing", ["503", "cut"])
async def test_a_503_head_or_a_body_cut_short_is_retried_but_a_400_is_not(
    session: aiohttp.ClientSession, servers: list[Backend], failing: str
) -> None:
    servers[0].mode = failing
    pool = make_pool(session, [servers[0].url, servers[1].url], affinity=False, eject_after_failures=100)
    for i in range(6):
        resp = await pool.request("POST", "/v1/chat/completions", {}, chat(content=f"q{i}"))
        assert resp.status == 200 and servers[1].url.encode() in resp.body
    assert servers[0].calls["test-model"] >= 2  # it was tried, and each failure retried on backend 1
    servers[0].mode = servers[1].mode = "400"
    before = sum(b.calls["test-model"] for b in servers)
    resp = await pool.request("POST", "/v1/chat/completions", {}, chat(content="bad"))
    assert resp.status == 400 and sum(b.calls["test-model"] for b in servers) == before + 1  # not retried


async def test_only_one_retry(session: aiohttp.ClientSession, servers: list[Backend]) -> None:
    for b in servers:
        b.mode = "503"
    pool = make_pool(session, [b.url for b in servers])
    resp = await pool.request("POST", "/v1/chat/completions", {}, chat())
    assert resp.status == 503 and sum(sum(b.calls.values()) for b in servers) == 2


async def test_a_read_timeout_is_not_retried_and_a_lone_503_is_returned(
    session: aiohttp.ClientSession, servers: list[Backend]
) -> None:
    servers[0].mode = "slow"
    pool = make_pool(session, [servers[0].url, servers[1].url], affinity=False, read_timeout_s=0.2)
    with pytest.raises(UpstreamTimeout):
        await pool.request("POST", "/v1/chat/completions", {}, chat())  # the first pick: backend 0
    assert servers[1].calls["test-model"] == 0  # it may still be generating there: no second generation
    servers[2].mode = "503"
    servers[2].models = {"only-here": "1"}
    pool = make_pool(session, [servers[1].url, servers[2].url])
    await pool.request("GET", "/v1/models", {})
    resp = await pool.request("POST", "/v1/chat/completions", {}, chat("only-here"))
    assert resp.status == 503 and servers[2].calls["only-here"] == 1 and servers[1].calls["only-here"] == 0


async def test_a_stream_is_retried_before_its_head_never_after(
    session: aiohttp.ClientSession, servers: list[Backend]
) -> None:
    pool = make_pool(session, [DEAD, servers[1].url])
    async with pool.open_stream("POST", "/v1/chat/completions", {}, chat()) as resp:
        assert resp.status == 200 and servers[1].url.encode() in await resp.read()
    servers[1].mode = "cut"
    pool = make_pool(session, [servers[1].url, servers[2].url], affinity=False)
    with pytest.raises((aiohttp.ClientError, UpstreamError)):
        async with pool.open_stream("POST", "/v1/chat/completions", {}, chat()) as resp:
            assert resp.status == 200  # the head arrived: from here on the caller owns the body
            await resp.read()
    assert servers[2].calls["test-model"] == 0


async def test_a_model_goes_only_to_backends_that_serve_it_and_the_catalog_is_merged(
    session: aiohttp.ClientSession, servers: list[Backend]
) -> None:
    servers[0].models = {"a": "1"}
    servers[1].models = {"a": "1", "b": "7"}
    servers[2].models = {"c": "3"}
    pool = make_pool(session, [b.url for b in servers])
    listing = orjson.loads((await pool.request("GET", "/v1/models", {})).body)
    assert sorted(m["id"] for m in listing["data"]) == ["a", "b", "c"]
    for i in range(8):
        for model in ("a", "b", "c"):
            assert (
                await pool.request("POST", "/v1/chat/completions", {}, chat(model, f"q{i}"))
            ).status == 200
    assert servers[0].calls["a"] + servers[1].calls["a"] == 8 and servers[0].calls["a"] > 0
    assert servers[1].calls["b"] == 8 and servers[2].calls["c"] == 8


async def test_a_model_follows_its_newest_revision_and_the_catalog_never_goes_back(
    session: aiohttp.ClientSession, servers: list[Backend]
) -> None:
    pool = make_pool(session, [b.url for b in servers])
    catalog = ModelCatalog(pool, ttl_s=3600, fallback_revision="", clock=lambda: 0.0)
    connect(pool, catalog)
    assert await catalog.revision("test-model", {}) == "rev-1"
    servers[1].models = {"test-model": "rev-2"}  # a rolling upgrade: backend 1 first
    await health.check(pool, pool.backends[1], "/v1/models", {})
    assert catalog.cached_revision("test-model") == "rev-2"
    for i in range(6):
        resp = await pool.request("POST", "/v1/chat/completions", {}, chat(content=f"q{i}"))
        assert resp.headers[REVISION_HEADER] == "rev-2"
    assert servers[1].calls["test-model"] == 6
    pool.backends[
        1
    ].breaker.failure()  # backend 1 ejected: the old ones answer, uncached (their header says so)
    for _ in range(2):
        pool.backends[1].breaker.failure()
    resp = await pool.request("POST", "/v1/chat/completions", {}, chat(content="late"))
    assert resp.headers[REVISION_HEADER] == "rev-1"
    assert not catalog.learn("test-model", "rev-1")  # the fill's learn(): refused, the key keeps rev-2
    assert catalog.cached_revision("test-model") == "rev-2"


async def test_an_ejected_backend_is_probed_and_let_back_in(
    session: aiohttp.ClientSession, servers: list[Backend]
) -> None:
    clock = FakeClock()
    config = UpstreamConfig(url=(servers[0].url, servers[1].url), eject_base_s=5.0, eject_after_failures=1)
    pool = build_upstream(config, session, RoutingMetrics(CollectorRegistry()), clock)
    assert isinstance(pool, UpstreamPool)
    backend = pool.backends[0]
    backend.failed("test", retried=False)
    assert not backend.breaker.available()
    assert not await health.check(pool, backend, "/v1/models", {})  # still in its backoff: not probed
    clock.advance(5.0)
    assert await health.check(pool, backend, "/v1/models", {})
    assert backend.breaker.available() and backend.breaker.ejections == 1


async def test_a_shared_prefix_sticks_to_one_backend_and_distinct_prompts_spread(
    session: aiohttp.ClientSession, servers: list[Backend]
) -> None:
    pool = make_pool(session, [b.url for b in servers], affinity_block_chars=16)
    document = "a long shared document " * 20
    for i in range(6):
        await pool.request("POST", "/v1/chat/completions", {}, chat(content=document + f"question {i}"))
    assert sorted(sum(b.calls.values()) for b in servers) == [0, 0, 6]
    for i in range(6):
        await pool.request("POST", "/v1/chat/completions", {}, chat(content=f"{i} unrelated " * 10))
    assert all(sum(b.calls.values()) >= 2 for b in servers)


async def test_sequential_misses_follow_the_weights(
    session: aiohttp.ClientSession, servers: list[Backend]
) -> None:
    config = UpstreamConfig(
        backends=(
            BackendConfig(servers[0].url, 2.0),
            BackendConfig(servers[1].url),
            BackendConfig(servers[2].url),
        ),
        health_path="",
    )
    pool = build_upstream(config, session, RoutingMetrics(CollectorRegistry()))
    for i in range(40):
        await pool.request("POST", "/v1/chat/completions", {}, chat(content=f"{i} distinct"))
    assert [b.calls["test-model"] for b in servers] == [20, 10, 10]


async def test_a_backend_configured_for_some_models_gets_and_lists_only_those(
    session: aiohttp.ClientSession, servers: list[Backend]
) -> None:
    servers[0].models = servers[1].models = {"test-model": "rev-1", "big": "b1"}
    config = UpstreamConfig(
        backends=(BackendConfig(servers[0].url, models=("big",)), BackendConfig(servers[1].url)),
        health_path="",
    )
    pool = build_upstream(config, session, RoutingMetrics(CollectorRegistry()))
    listing = orjson.loads((await pool.request("GET", "/v1/models", {})).body)
    assert sorted(m["id"] for m in listing["data"]) == ["big", "test-model"]
    for i in range(4):
        for model in ("big", "test-model"):
            await pool.request("POST", "/v1/chat/completions", {}, chat(model, f"q{i}"))
    assert servers[0].calls == {"big": 2} and servers[1].calls == {"big": 2, "test-model": 4}


async def test_one_url_builds_the_plain_upstream_and_a_list_builds_a_pool(
    make_gateway: GatewayFactory, servers: list[Backend]
) -> None:
    single = await make_gateway(servers[0].url)
    assert type(single.state.upstream) is Upstream
    gw = await make_gateway(",".join(b.url for b in servers))
    assert isinstance(gw.state.upstream, UpstreamPool)
    servers[2].models = {"other": "9"}
    resp = await gw.client.get("/v1/models", headers=AUTH_A)
    assert sorted(m["id"] for m in (await resp.json())["data"]) == ["other", "test-model"]
    for i in range(4):
        body = {**CHAT, "messages": [{"role": "user", "content": f"q{i}"}]}
        assert (await gw.client.post("/v1/chat/completions", json=body, headers=AUTH_A)).status == 200
    assert servers[2].calls["test-model"] == 0 and servers[0].calls["test-model"] > 0
