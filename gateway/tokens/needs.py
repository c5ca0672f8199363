"""What the token path reads of the gateway's state (a port: the shell's `GatewayState` provides it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gateway.config.settings import GatewayConfig
from gateway.ops.metrics import GatewayMetrics
from gateway.tokens.planner import TokenPath
from gateway.upstream.catalog import ModelCatalog
from gateway.upstream.transport import UpstreamTransport


class TokenState(Protocol):
    config: GatewayConfig
    metrics: GatewayMetrics

    @property
    def clock(self) -> Callable[[], float]: ...

    upstream: UpstreamTransport
    catalog: ModelCatalog
    tokens: TokenPath | None  # None with `[tokens] enabled = false`; set by `tokens.path.tokens_ctx`
