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
        self._add_decisions(registry)

    def _add_decisions(self, registry: CollectorRegistry) -> None:
        """The families that explain choices and refusals (added with the cost policy)."""
        self.decisions = Counter(
            "tokenedge_routing_decisions",
            "Routing decisions by chosen backend, policy and reason (cost: prefix, spill, balance; affinity: hit,"
            " guarded, miss; least_loaded, round_robin, random)",
            ["backend", "policy", "reason"],
            registry=registry,
        )
        self.matched_tokens = Counter(
            "tokenedge_routing_matched_prompt_tokens",
            "Prompt tokens the chosen backend was expected to hold already (the router's prefix record)",
            ["backend"],
            registry=registry,
        )
        self.first_byte_timeouts = Counter(
            "tokenedge_backend_first_byte_timeouts",
            "Streams whose first byte missed upstream.first_byte_timeout_s (retried elsewhere; count to ejection)",
            ["backend"],
            registry=registry,
        )
        self.health_failures = Counter(
            "tokenedge_backend_health_failures",
            "Failed health checks, by kind (timeout, error, status)",
            ["backend", "kind"],
            registry=registry,
        )
        self.placement = Counter(
            "tokenedge_routing_placement",
            "Shared placement (Redis) by operation (read, write) and outcome (read: hit, miss, late, error,"
            " skipped while off after an error; write: ok, error, skipped)",
            ["op", "outcome"],
            registry=registry,
        )
        self.retention = Gauge(
            "tokenedge_routing_prefix_retention",
            "Share of the prompt prefix each backend was expected to reuse (the router's record of what it sent)"
            " that its answers' cached tokens say it did reuse, smoothed (1: keeps its prefixes; the cost policy"
            " counts matched tokens x this)",
            ["backend"],
            multiprocess_mode="livemostrecent",
            registry=registry,
        )
        self.rejected = Counter(
            "tokenedge_routing_rejected",
            "Misses answered 503 (Retry-After) because every backend stayed at max_outstanding for admission_wait_s",
            registry=registry,
        )


def register(registry: CollectorRegistry) -> RoutingMetrics:
    """The one call `GatewayMetrics.__init__` makes; families appear once a pool routes (none for one URL)."""
    return RoutingMetrics(registry)
