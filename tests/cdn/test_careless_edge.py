"""Tenant answers behind an edge configured as a careless operator would: keyed by URL and body WITHOUT the
credential, `Vary` ignored (as many CDNs do outside Accept-Encoding), `Surrogate-Control` / `CDN-Cache-Control`
obeyed as shipped. The gateway's own headers must keep tenant B from ever being served tenant A's answer or A's
alias URL by that edge: B reaches the gateway, which answers B's own (a miss) or 404.

Each careless edge is the shipped config with its credential hashing cut out, so the mutation check (the operator
declares `cache.cdn_credential_keyed_edge` that this edge does not honour) shows the same edge serving A's answer
to B: the edge does leak when told an answer is shareable, and only the headers stop it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from cdn.nginx.render import NginxEdgeConfig
from cdn.varnish.render import VarnishEdgeConfig
from gateway.hits import render
from harness.gateway import FakeClock, RunningGateway, gateway_config, start_gateway
from tests.cdn.conftest import ADMIN_TOKEN, AUTH_A, AUTH_B, EdgeStack, chat
from tests.support.edges import EdgeProcess, NginxServer, VarnishServer
from tests.support.fake_upstream import FakeUpstream

CHAT = "/v1/chat/completions"
# Varnish: no credential in vcl_hash, and Vary dropped before the object is stored.
VCL_CREDENTIAL_HASH = re.compile(
    r'    if \(req\.url !~ "\^/v1/cache/te1:pub:"\) \{\n(?:        .*\n|\n)+    \}\n'
)
VCL_EDGE_FRESHNESS = "    # Edge freshness comes from Surrogate-Control"
# nginx: the key is method, host, URI and body; Vary ignored like Cache-Control.
NGINX_KEY = "proxy_cache_key $tokenedge_key;"
NGINX_IGNORE = "proxy_ignore_headers Cache-Control Expires;"

CarelessFactory = Callable[..., Awaitable[EdgeStack]]


def careless_vcl(vcl: str, *, honour_vary: bool) -> str:
    careless, cut = VCL_CREDENTIAL_HASH.subn("", vcl)
    assert cut == 1 and 'hash_data("authorization:' not in careless  # the shipped VCL changed: update the cut
    if not honour_vary:
        assert VCL_EDGE_FRESHNESS in careless
        careless = careless.replace(
            VCL_EDGE_FRESHNESS, "    unset beresp.http.Vary;  # careless: Vary ignored\n" + VCL_EDGE_FRESHNESS
        )
    return careless


def careless_nginx(conf: str) -> str:
    assert conf.count(NGINX_KEY) == 2 and conf.count(NGINX_IGNORE) == 2  # the shipped conf changed: update
    careless = conf.replace(NGINX_KEY, 'proxy_cache_key "$request_method|$host|$request_uri|$request_body";')
    return careless.replace(NGINX_IGNORE, "proxy_ignore_headers Cache-Control Expires Vary;")


@pytest.fixture
async def make_careless(
    fake: FakeUpstream, upstream_url: str, clock: FakeClock
) -> AsyncIterator[CarelessFactory]:
    """`factory(edge, honour_vary=False, cache_streams=False, **sections)`: gateway behind a careless varnish
    (`cache_streams`: streamed requests looked up too) or nginx."""
    started: list[tuple[RunningGateway, EdgeProcess]] = []
    async with aiohttp.ClientSession(auto_decompress=False) as http:

        async def factory(
            edge: str, *, honour_vary: bool = False, cache_streams: bool = False, **sections: dict[str, Any]
        ) -> EdgeStack:
            server = {"admin_token": ADMIN_TOKEN, **sections.pop("server", {})}
            gw = await start_gateway(gateway_config(upstream_url, server=server, **sections), clock)
            port = gw.server.port
            assert port is not None
            proc: EdgeProcess
            if edge == "varnish":
                varnish = VarnishServer(VarnishEdgeConfig(backend_port=port, cache_streams=cache_streams))
                varnish.vcl.write_text(careless_vcl(varnish.vcl.read_text(), honour_vary=honour_vary))
                proc = varnish
            else:
                assert not honour_vary
                nginx = NginxServer(NginxEdgeConfig(backend=f"127.0.0.1:{port}"))
                nginx.conf.write_text(careless_nginx(nginx.conf.read_text()))
                proc = nginx
            started.append((gw, proc))
            proc.start()
            return EdgeStack(gw, proc, fake, clock, http)

        yield factory
        for gw, proc in started:
            proc.stop()
            await gw.close()


async def fill_and_fetch(stack: EdgeStack, body: dict[str, Any]) -> tuple[bytes, str]:
    """Tenant A asks twice and fetches its alias twice (an edge that may keep them has kept them): (A's body, alias)."""
    first, answer = await stack.post(CHAT, body, AUTH_A)
    assert first.status == 200
    await stack.post(CHAT, body, AUTH_A)
    alias = f"/v1/cache/{first.headers['X-Cache-Key']}"
    for _ in range(2):
        got, alias_body = await stack.get(alias, AUTH_A)
        assert got.status == 200 and alias_body == answer
    return answer, alias


@pytest.mark.parametrize("edge", ["varnish", "nginx"])
async def test_a_careless_edge_never_serves_a_tenant_answer_to_another_credential(
    make_careless: CarelessFactory, edge: str
) -> None:
    stack = await make_careless(edge)
    answer, alias = await fill_and_fetch(stack, chat())
    assert stack.fake.calls["chat"] == 1  # A's second ask was A's own gateway hit

    other, other_body = await stack.post(CHAT, chat(), AUTH_B)
    assert other.status == 200 and other_body != answer
    assert other.headers["Cache-Status"].startswith("tokenedge; fwd=miss")  # it reached the gateway
    assert f"{edge}; hit" not in other.headers["Cache-Status"]
    assert stack.fake.calls["chat"] == 2  # B's own upstream call
    fetched, fetched_body = await stack.get(alias, AUTH_B)
    assert fetched.status == 404 and answer not in fetched_body
    assert f"{edge}; hit" not in fetched.headers.get("Cache-Status", "")


@pytest.mark.parametrize("edge", ["varnish", "nginx"])
async def test_mutation_a_careless_edge_told_it_is_credential_keyed_leaks(
    make_careless: CarelessFactory, edge: str
) -> None:
    """The test above can fail: the same edge, told tenant answers are shareable, serves A's answer to B."""
    stack = await make_careless(edge, cache={"cdn_credential_keyed_edge": True})
    answer, alias = await fill_and_fetch(stack, chat())

    other, other_body = await stack.post(CHAT, chat(), AUTH_B)
    assert other_body == answer and f"{edge}; hit" in other.headers["Cache-Status"]
    fetched, fetched_body = await stack.get(alias, AUTH_B)
    assert fetched.status == 200 and fetched_body == answer
    assert stack.fake.calls["chat"] == 1


@pytest.mark.parametrize("keyed", [False, True])
async def test_a_careless_edge_that_caches_streams_never_serves_a_tenant_stream_to_another_credential(
    make_careless: CarelessFactory, keyed: bool
) -> None:
    """Streamed requests looked up at the careless edge: A's streamed miss and A's streamed hit; B's identical
    stream reaches the gateway. With the setting's false claim (`keyed`), the edge serves A's stream to B."""
    stack = await make_careless("varnish", cache_streams=True, cache={"cdn_credential_keyed_edge": keyed})
    body = chat("stream it", stream=True)
    _, first = await stack.post(CHAT, body, AUTH_A)
    hit, answer = await stack.post(CHAT, body, AUTH_A)
    assert answer == first and hit.headers["Cache-Status"].startswith("tokenedge; hit")  # the gateway's hit

    other, other_body = await stack.post(CHAT, body, AUTH_B)
    if keyed:
        assert other_body == answer and "varnish; hit" in other.headers["Cache-Status"]
        assert stack.fake.calls["chat"] == 1
    else:
        assert other_body != answer and "varnish; hit" not in other.headers["Cache-Status"]
        assert other.headers["Cache-Status"].startswith("tokenedge; fwd=miss")
        assert stack.fake.calls["chat"] == 2


TEAM_A = {**AUTH_A, "X-Team": "red"}
TEAM_B = {**AUTH_A, "X-Team": "blue"}


async def test_vary_names_a_configured_credential_header_to_an_edge_that_honours_it(
    make_careless: CarelessFactory,
) -> None:
    """Even an edge told tenant answers are shareable keeps two callers apart by `Vary` alone, when it honours
    `Vary`, for an operator's own credential header (`server.credential_headers`)."""
    stack = await make_careless(
        "varnish",
        honour_vary=True,
        server={"credential_headers": ["X-Team"]},
        cache={"cdn_credential_keyed_edge": True},
    )
    first, answer = await stack.post(CHAT, chat(), TEAM_A)
    again, again_body = await stack.post(CHAT, chat(), TEAM_A)
    assert "varnish; hit" in again.headers["Cache-Status"] and again_body == answer
    assert "x-team" in first.headers["Vary"].split(", ")

    other, other_body = await stack.post(CHAT, chat(), TEAM_B)
    assert other_body != answer and "varnish; hit" not in other.headers["Cache-Status"]
    assert stack.fake.calls["chat"] == 2


async def test_mutation_a_vary_without_the_configured_header_leaks(
    make_careless: CarelessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test above can fail: a `Vary` that names only the built-in credentials lets the edge share."""
    monkeypatch.setattr(render, "credential_vary", lambda _state: "authorization")
    render.clear()
    stack = await make_careless(
        "varnish",
        honour_vary=True,
        server={"credential_headers": ["X-Team"]},
        cache={"cdn_credential_keyed_edge": True},
    )
    _, answer = await stack.post(CHAT, chat(), TEAM_A)
    await stack.post(CHAT, chat(), TEAM_A)
    other, other_body = await stack.post(CHAT, chat(), TEAM_B)
    render.clear()
    assert other_body == answer and "varnish; hit" in other.headers["Cache-Status"]
