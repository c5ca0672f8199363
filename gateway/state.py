"""Typed application state shared by the handlers: built once per process by `gateway.app.create_app`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from gateway.catalog import ModelCatalog
from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics
from gateway.singleflight import SingleFlight
from gateway.tiers.tiered import TieredCache
from gateway.upstream import Upstream


@dataclass(slots=True)
class GatewayState:
    config: GatewayConfig
    metrics: GatewayMetrics
    clock: Callable[[], float]
    cache: TieredCache
    upstream: Upstream
    catalog: ModelCatalog
    flights: SingleFlight[object] = field(default_factory=SingleFlight)
    extensions: dict[str, object] = field(default_factory=dict)  # CDN purge clients, token registry, ...


STATE: web.AppKey[GatewayState] = web.AppKey("tokenedge_state", GatewayState)
