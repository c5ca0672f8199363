"""Gateway test fixtures: a fake upstream, an injected clock and a gateway factory that cleans up after itself."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from harness.gateway import FakeClock, RunningGateway, gateway_config, start_gateway

CHAT = {"model": "test-model", "temperature": 0, "messages": [{"role": "user", "content": "What is 2+2?"}]}
AUTH_A = {"Authorization": "Bearer tenant-a-key"}
AUTH_B = {"Authorization": "Bearer tenant-b-key"}
# For tests where one event loop runs the callers, the gateway and the upstream, hundreds of requests at once on a
# loaded 2-core CI machine: the harness's 1 s connect limit (aiohttp's counts the wait for a pooled connection) can
# pass while the loop is busy (a 504 that is correct, but not what those tests are about). A guard against a hang,
# not a measurement.
LOADED_UPSTREAM = {"connect_timeout_s": 10.0, "read_timeout_s": 60.0}


GatewayFactory = Callable[..., Awaitable[RunningGateway]]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session for tests that drive an upstream pool or engines directly."""
    async with aiohttp.ClientSession() as s:
        yield s


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
