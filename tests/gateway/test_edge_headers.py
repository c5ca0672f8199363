"""The edge headers of answers (gateway/hits/render.py `block`, design §5): a tenant answer is never marked shareable
for a cache that may key without the credential, unless the operator declares `cache.cdn_credential_keyed_edge`;
its `Vary` names every credential header the tenancy scopes by. Checked on the pure block, then on every kind of
answer a real gateway sends: stored miss, fast-lane and ordinary hits, streamed hit and miss, alias, 304, stale.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.config.sections import ServerConfig
from gateway.hits import render
from gateway.hits.tenancy import Tenancy
from harness.gateway import FakeClock, RunningGateway
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream

TTL = 3600
EDGE = f"max-age={TTL}, stale-if-error=600"
BUILT_IN = (
    "authorization, x-api-key"  # the block's input in the pure table; a gateway's comes from its tenancy
)
TEAM = {**AUTH_A, "X-Team": "red"}
TENANT_KEY = "te1:t0123456789abcdef:digest"
PUBLIC_KEY = "te1:pub:digest"

BLOCK_CASES = [
    # (key, keyed edge, Cache-Control, CDN-Cache-Control, Surrogate-Control, Vary)
    (PUBLIC_KEY, False, f"public, max-age=0, s-maxage={TTL}", EDGE, EDGE, "Accept-Encoding"),
    (PUBLIC_KEY, True, f"public, max-age=0, s-maxage={TTL}", EDGE, EDGE, "Accept-Encoding"),
    (TENANT_KEY, False, "private", "private", "no-store", BUILT_IN),
    (TENANT_KEY, True, "private", EDGE, EDGE, BUILT_IN),
]


@pytest.mark.parametrize(("key", "keyed", "cc", "cdn", "surrogate", "vary"), BLOCK_CASES)
def test_block_marks_only_public_or_credential_keyed_answers_shareable(
    key: str, keyed: bool, cc: str, cdn: str, surrogate: str, vary: str
) -> None:
    headers, _ = render.block(key, '"e"', TTL, 600, (), (), BUILT_IN, keyed)
    assert (headers["Cache-Control"], headers["CDN-Cache-Control"], headers["Surrogate-Control"]) == (
        cc,
        cdn,
        surrogate,
    )
    assert headers["Vary"] == vary


def test_credential_vary_reads_the_tenancys_headers_and_the_tenant_header() -> None:
    server = ServerConfig(
        credential_headers=("X-Team", "Authorization"),
        tenant_header="X-Tenant",
        tenant_proxy_secret="s" * 16,
    )
    tenancy = Tenancy.from_config(server, b"secret")
    state: Any = SimpleNamespace(tenancy=tenancy)
    vary = render.credential_vary(state).split(", ")
    assert vary == [*tenancy.credential_headers, "x-tenant"]
    assert vary[0] == "authorization" and vary.count("authorization") == 1 and "x-team" in vary
    # another tenancy: not the remembered value
    state.tenancy = Tenancy.from_config(ServerConfig(), b"secret")
    assert "x-team" not in render.credential_vary(state).split(", ")
    state.tenancy = None
    assert render.credential_vary(state) == "*"


async def post(gw: RunningGateway, body: dict[str, Any], headers: dict[str, str]) -> aiohttp.ClientResponse:
    resp = await gw.client.post("/v1/chat/completions", json=body, headers=headers)
    await resp.read()
    return resp


async def every_answer(gw: RunningGateway, fake: FakeUpstream, clock: FakeClock) -> dict[str, Any]:
    """Each kind of answer from an entry (or on its way to one), by name: its headers."""
    seen: dict[str, Any] = {}
    stream = {**CHAT, "messages": [{"role": "user", "content": "streamed"}], "stream": True}
    seen["streamed miss"] = (await post(gw, stream, TEAM)).headers
    seen["streamed hit"] = (await post(gw, stream, TEAM)).headers
    seen["stored miss"] = (miss := await post(gw, CHAT, TEAM)).headers
    seen["fast-lane hit"] = (await post(gw, CHAT, TEAM)).headers
    seen["ordinary hit"] = (await post(gw, CHAT, {**TEAM, "Cache-Control": "max-age=3600"})).headers
    alias = f"/v1/cache/{miss.headers['X-Cache-Key']}"
    async with gw.client.get(alias, headers=TEAM) as resp:
        seen["alias"] = resp.headers
    async with gw.client.get(alias, headers={**TEAM, "If-None-Match": miss.headers["ETag"]}) as resp:
        assert resp.status == 304
        seen["alias 304"] = resp.headers
    clock.advance(TTL + 1)
    fake.status = 500
    seen["stale"] = (stale := await post(gw, CHAT, TEAM)).headers
    assert "stale-if-error" in stale.headers["Cache-Status"]
    for name, headers in seen.items():
        assert headers["Cache-Status"].startswith("tokenedge; "), name
    return seen


@pytest.mark.parametrize("keyed", [False, True])
async def test_every_tenant_answer_is_private_to_an_edge_unless_it_is_credential_keyed(
    make_gateway: GatewayFactory, fake: FakeUpstream, clock: FakeClock, keyed: bool
) -> None:
    gw = await make_gateway(
        server={"credential_headers": ["X-Team"]}, cache={"cdn_credential_keyed_edge": keyed}
    )
    credentials = ", ".join(gw.state.tenancy.credential_headers)  # type: ignore[union-attr]
    assert "x-team" in credentials.split(", ")
    seen = await every_answer(gw, fake, clock)
    for name, headers in seen.items():
        assert headers["Vary"] == credentials, name
        if name in ("stale", "streamed miss"):  # never kept downstream, whatever the edge
            assert headers["CDN-Cache-Control"] == headers["Surrogate-Control"] == "no-store", name
            continue
        assert headers["Cache-Control"] == "private", name
        if keyed:
            assert headers["CDN-Cache-Control"] == headers["Surrogate-Control"] == EDGE, name
        else:
            assert headers["CDN-Cache-Control"] == "private", name
            assert headers["Surrogate-Control"] == "no-store", name
    assert seen["stale"]["Cache-Control"] == "no-store"


async def test_public_answers_stay_shareable_without_the_setting(
    make_gateway: GatewayFactory, fake: FakeUpstream, clock: FakeClock
) -> None:
    gw = await make_gateway(routes={"chat/completions": {"scope": "public"}})
    seen = await every_answer(gw, fake, clock)
    for name, headers in seen.items():
        assert headers["Vary"] == "Accept-Encoding", name
        if name not in ("stale", "streamed miss"):
            assert headers["CDN-Cache-Control"] == headers["Surrogate-Control"] == EDGE, name
            assert headers["Cache-Control"] == f"public, max-age=0, s-maxage={TTL}", name


@dataclass
class EdgeMarkingUpstream(FakeUpstream):
    """The fake upstream; with `edge_marked`, every answer also tells a CDN to keep it (as some servers do)."""

    edge_marked: bool = False

    def app(self) -> web.Application:
        app = super().app()
        app.on_response_prepare.append(self._mark)
        return app

    async def _mark(self, _request: web.Request, response: web.StreamResponse) -> None:
        if self.edge_marked:
            response.headers["CDN-Cache-Control"] = response.headers["Surrogate-Control"] = "max-age=600"


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    yield EdgeMarkingUpstream()


async def test_an_unstored_answer_drops_the_upstreams_own_edge_headers(
    make_gateway: GatewayFactory, fake: EdgeMarkingUpstream
) -> None:
    """RFC 9213: an upstream's `CDN-Cache-Control: max-age` would override the gateway's `no-store` at a CDN."""
    gw = await make_gateway()
    fake.status, fake.edge_marked = 400, True
    resp = await post(gw, CHAT, TEAM)
    assert resp.status == 400 and resp.headers["Cache-Control"] == "no-store"
    assert "fwd=miss" in resp.headers["Cache-Status"]
    assert "CDN-Cache-Control" not in resp.headers and "Surrogate-Control" not in resp.headers
