"""The router's Prometheus families, registered on the gateway's registry by one call from `GatewayMetrics`.

`backend` labels are the configured backend URLs (a handful), so cardinality stays bounded. The outstanding
gauge is per process and summed over live workers (`livesum`), like the L1 gauges.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class RoutingMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.outstanding = Gauge(
            "tokenedge_backend_outstanding_requests",
            "Requests in flight to each backend",
            ["backend"],
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.requests = Counter(
            "tokenedge_backend_requests",
            "Requests sent to each backend, by outcome (ok, error, retried)",
            ["backend", "outcome"],
            registry=registry,
        )
        self.ejections = Counter(
            "tokenedge_backend_ejections",
            "Times each backend was ejected (circuit opened)",
            ["backend"],
            registry=registry,
        )
        self.affinity = Counter(
            "tokenedge_routing_affinity",
            "Routing decisions for misses: hit (prefix affinity), guarded (load guard overrode it), miss",
            ["result"],
            registry=registry,
        )
        self.up = Gauge(
            "tokenedge_backend_up",
            "1 while a backend takes traffic (circuit closed or half-open), 0 while ejected",
            ["backend"],
            multiprocess_mode="liveall",
            registry=registry,
        )


def register(registry: CollectorRegistry) -> RoutingMetrics:
    """The one call `GatewayMetrics.__init__` makes; families appear once a pool routes (none for one URL)."""
    return RoutingMetrics(registry)
