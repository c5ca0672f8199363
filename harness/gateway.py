"""Start a real gateway (create_app on a loopback port) in front of a fake or real upstream, for tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp.test_utils import TestClient

from cdn.purge import CdnConfig
from gateway.app import create_app
from gateway.config.settings import GatewayConfig
from gateway.edge.server import EdgeTestServer
from gateway.state import STATE, GatewayState


class FakeClock:
    """Wall-clock stand-in: tests advance time instead of sleeping."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def gateway_config(upstream_url: str, **sections: dict[str, Any]) -> GatewayConfig:
    data: dict[str, Any] = {
        "upstream": {"url": upstream_url, "connect_timeout_s": 1.0, "read_timeout_s": 10.0}
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return GatewayConfig.from_mapping(data)


@dataclass
class RunningGateway:
    client: TestClient
    server: EdgeTestServer

    @property
    def state(self) -> GatewayState:
        return self.server.app[STATE]

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    async def close(self) -> None:
        await self.client.close()


async def start_gateway(
    config: GatewayConfig, clock: FakeClock | None = None, cdn: CdnConfig | None = None
) -> RunningGateway:
    app = create_app(config, clock=clock or FakeClock(), cdn=cdn)
    server = EdgeTestServer(app, host="127.0.0.1", handler_cancellation=True)
    client = TestClient(server)
    await client.start_server()
    return RunningGateway(client, server)
