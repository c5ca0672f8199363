"""Gateway test fixtures: a fake upstream, an injected clock and a gateway factory that cleans up after itself."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from harness.gateway import FakeClock, RunningGateway, gateway_config, start_gateway

CHAT = {"model": "test-model", "temperature": 0, "messages": [{"role": "user", "content": "What is 2+2?"}]}
AUTH_A = {"Authorization": "Bearer tenant-a-key"}
AUTH_B = {"Authorization": "Bearer tenant-b-key"}


GatewayFactory = Callable[..., Awaitable[RunningGateway]]


@pytest.fixture
async def make_gateway(upstream_url: str, clock: FakeClock) -> AsyncIterator[GatewayFactory]:
    started: list[RunningGateway] = []

    async def factory(url: str | None = None, **sections: dict[str, Any]) -> RunningGateway:
        gw = await start_gateway(gateway_config(url or upstream_url, **sections), clock)
        started.append(gw)
        return gw

    yield factory
    for gw in started:
        await gw.close()


@pytest.fixture
async def gw(make_gateway: GatewayFactory) -> RunningGateway:
    return await make_gateway()
