"""Typed application state shared by the handlers: built once per process by `gateway.app.create_app`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from aiohttp import web

from gateway.config.settings import GatewayConfig
from gateway.hits.tenancy import Tenancy
from gateway.keys.memo import RequestMemo
from gateway.keys.policy import RoutePolicy
from gateway.misses.lease import Leases
from gateway.misses.singleflight import SingleFlight
from gateway.misses.streaming.broadcast import StreamFlights
from gateway.ops.dashboard.dashboard_state import DashboardState
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.tracing import Tracing
from gateway.tiers.coherence.coherence import Coherence
from gateway.tiers.hotrecord import HotRecord, Warmup
from gateway.tiers.tiered import TieredCache
from gateway.tokens.planner import TokenPath
from gateway.upstream.catalog import ModelCatalog
from gateway.upstream.transport import UpstreamTransport

# `/admin/purge`'s fan-out to the configured CDNs: (keys, tags) -> a result per CDN (gateway.app._cdn_ctx)
CdnPurge = Callable[[Sequence[str], Sequence[str]], Awaitable[dict[str, object]]]


@dataclass(slots=True)
class GatewayState:
    config: GatewayConfig
    metrics: GatewayMetrics
    clock: Callable[[], float]
    cache: TieredCache
    upstream: UpstreamTransport
    catalog: ModelCatalog
    flights: SingleFlight[object] = field(default_factory=SingleFlight)
    memo: RequestMemo = field(default_factory=lambda: RequestMemo(32 * 1024 * 1024))
    policies: dict[str, RoutePolicy] = field(default_factory=dict)  # per cacheable endpoint, built at startup
    stream_flights: StreamFlights = field(default_factory=StreamFlights)
    dashboard: DashboardState = field(
        default_factory=DashboardState
    )  # history rings, hot keys (gateway.ops.dashboard)
    coherence: Coherence | None = None  # the invalidation bus end of this process (gateway.tiers.coherence)
    # Set by the app's cleanup_ctx generators after this state is built; None until (or unless) they run.
    tenancy: Tenancy | None = None  # the scope secret's keyed hash (handlers.tenancy.tenancy_ctx)
    tokens: TokenPath | None = None  # None with `[tokens] enabled = false` (tokens.path.tokens_ctx)
    leases: Leases | None = None  # cross-replica leases, Redis L2 only (lease_fill.lease_ctx)
    hot_record: HotRecord | None = None  # the shared hot-key record, Redis L2 only (warm.warm_ctx)
    warmup: Warmup | None = None  # the start-up L1 fill's progress, read by /ready (warm.warm_ctx)
    cdn_purge: CdnPurge | None = None  # the CDNs `/admin/purge` fans out to (app._cdn_ctx)
    tracing: Tracing | None = None  # OpenTelemetry spans, when on (ops.tracing.tracing_ctx)

    def __post_init__(self) -> None:
        stale_s = self.config.cache.stale_if_error_s
        for endpoint, route in self.config.routes.items():
            self.policies.setdefault(
                endpoint,
                RoutePolicy(
                    enabled=route.enabled,
                    ttl_s=route.ttl_s,
                    allow_seeded=route.allow_seeded,
                    allow_n_gt_1=route.allow_n_gt_1,
                    stale_if_error_s=stale_s,
                ),
            )


STATE: web.AppKey[GatewayState] = web.AppKey("tokenedge_state", GatewayState)
