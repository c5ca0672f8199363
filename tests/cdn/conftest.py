"""Edge fixtures: fake upstream -> real gateway -> real varnishd or nginx, each on a free loopback port.

`make_varnish(...)` / `make_nginx(...)` start a fresh stack per test (varnishd in ~0.5 s, nginx in ~0.1 s) and stop
every process they started, by PID, when the test ends. `client` talks to the edge like any HTTP client would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from cdn.nginx.render import NginxEdgeConfig
from cdn.purge import CdnConfig
from cdn.purge.retry import RetryPolicy
from cdn.purge.varnish import VarnishConfig
from cdn.varnish.render import VarnishEdgeConfig
from harness.gateway import FakeClock, RunningGateway, gateway_config, start_gateway
from harness.services import free_port
from tests.support.edges import EdgeProcess, NginxServer, VarnishServer
from tests.support.fake_upstream import FakeUpstream

ADMIN_TOKEN = "edge-admin-token"
AUTH_A = {"Authorization": "Bearer tenant-a-key"}
AUTH_B = {"Authorization": "Bearer tenant-b-key"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def chat(content: str = "What is 2+2?", **extra: Any) -> dict[str, Any]:
    return {
        "model": "test-model",
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


@dataclass
class EdgeStack:
    gateway: RunningGateway
    edge: EdgeProcess
    fake: FakeUpstream
    clock: FakeClock
    http: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return self.edge.url

    async def post(
        self, path: str, body: Any, headers: dict[str, str] | None = None
    ) -> tuple[aiohttp.ClientResponse, bytes]:
        async with self.http.post(self.url + path, json=body, headers=headers or AUTH_A) as resp:
            return resp, await resp.read()

    async def get(
        self, path: str, headers: dict[str, str] | None = None
    ) -> tuple[aiohttp.ClientResponse, bytes]:
        async with self.http.get(self.url + path, headers=headers or AUTH_A) as resp:
            return resp, await resp.read()

    async def admin_purge(self, keys: list[str] = (), tags: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
        async with self.http.post(
            self.gateway.url + "/admin/purge", json={"keys": list(keys), "tags": list(tags)}, headers=ADMIN
        ) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()


StackFactory = Callable[..., Awaitable[EdgeStack]]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


def _sections(sections: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The gateway behind a shipped edge: the edge keys by every credential part, as the operator then declares
    (`cache.cdn_credential_keyed_edge`); a test of a careless edge sets it back to false."""
    server = {"admin_token": ADMIN_TOKEN, **sections.get("server", {})}
    cache = {"cdn_credential_keyed_edge": True, **sections.get("cache", {})}
    return {**sections, "server": server, "cache": cache}


@pytest.fixture
async def make_varnish(
    fake: FakeUpstream, upstream_url: str, clock: FakeClock, http: aiohttp.ClientSession
) -> AsyncIterator[StackFactory]:
    started: list[tuple[RunningGateway, EdgeProcess]] = []

    async def factory(
        *, edge: dict[str, Any] | None = None, purge: dict[str, Any] | None = None, **sections: dict[str, Any]
    ) -> EdgeStack:
        port = free_port()
        cdn = CdnConfig(
            varnish=VarnishConfig(
                purge_urls=(f"http://127.0.0.1:{port}/",),
                retry=RetryPolicy(max_attempts=1, timeout_s=5.0),
                **(purge or {}),
            )
        )
        gw = await start_gateway(gateway_config(upstream_url, **_sections(sections)), clock, cdn=cdn)
        gw_port = gw.server.port
        assert gw_port is not None
        varnish = VarnishServer(VarnishEdgeConfig(backend_port=gw_port, **(edge or {})), port=port)
        started.append((gw, varnish))
        varnish.start()
        return EdgeStack(gw, varnish, fake, clock, http)

    yield factory
    for gw, edge in started:
        edge.stop()
        await gw.close()


@pytest.fixture
async def make_nginx(
    fake: FakeUpstream, upstream_url: str, clock: FakeClock, http: aiohttp.ClientSession
) -> AsyncIterator[StackFactory]:
    started: list[tuple[RunningGateway, EdgeProcess]] = []

    async def factory(*, edge: dict[str, Any] | None = None, **sections: dict[str, Any]) -> EdgeStack:
        gw = await start_gateway(gateway_config(upstream_url, **_sections(sections)), clock)
        nginx = NginxServer(NginxEdgeConfig(backend=f"127.0.0.1:{gw.server.port}", **(edge or {})))
        started.append((gw, nginx))
        nginx.start()
        return EdgeStack(gw, nginx, fake, clock, http)

    yield factory
    for gw, edge in started:
        edge.stop()
        await gw.close()
