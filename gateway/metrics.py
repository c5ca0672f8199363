"""Prometheus metrics (DESIGN §7), one object per app, never module-level singletons.

Buckets span sub-millisecond cache hits to multi-second generations. With `--workers N` the launcher sets
PROMETHEUS_MULTIPROC_DIR before any worker imports prometheus_client, so every worker writes its samples to shared
mmap files and `/metrics` on any worker aggregates all of them (prometheus_client's multiprocess mode).
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("tokenedge_requests", "Requests by route, result and reason",
                                ["route", "result", "reason"], registry=r)
        self.lookups = Counter("tokenedge_cache_lookups", "Cache lookups by tier and outcome",
                               ["tier", "outcome"], registry=r)
        self.request_duration = Histogram("tokenedge_request_duration_seconds", "Gateway request latency",
                                          ["route", "result"], buckets=LATENCY_BUCKETS, registry=r)
        self.upstream_duration = Histogram("tokenedge_upstream_duration_seconds", "Upstream call latency",
                                           ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("tokenedge_time_to_first_token_seconds", "Time to first streamed token",
                              ["route", "result"], buckets=LATENCY_BUCKETS, registry=r)
        self.stage_duration = Histogram("tokenedge_stage_duration_seconds",
                                        "Per-request latency breakdown by stage", ["stage"],
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.tokenize_duration = Histogram("tokenedge_tokenize_duration_seconds", "Tokenization latency",
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.tokens_saved = Counter("tokenedge_tokens_saved", "Prompt + completion tokens served from cache",
                                    registry=r)
        self.bytes_from_cache = Counter("tokenedge_bytes_served_from_cache", "Body bytes served from cache",
                                        registry=r)
        self.cache_errors = Counter("tokenedge_cache_errors", "Cache tier failures (served degraded)",
                                    ["tier"], registry=r)
        self.cache_stores = Counter("tokenedge_cache_stores", "Entries written, by tier", ["tier"], registry=r)
        self.cache_entries = Gauge("tokenedge_cache_entries", "Entries held, by tier", ["tier"],
                                   multiprocess_mode="livesum", registry=r)
        self.cache_bytes = Gauge("tokenedge_cache_bytes", "Bytes held, by tier", ["tier"],
                                 multiprocess_mode="livesum", registry=r)
        self.cache_evictions = Gauge("tokenedge_cache_evictions", "Capacity evictions since start, by tier",
                                     ["tier"], multiprocess_mode="livesum", registry=r)
        self.upstream_up = Gauge("tokenedge_upstream_up", "1 when the last upstream contact succeeded",
                                 multiprocess_mode="livemin", registry=r)
        self.tag_truncations = Counter("tokenedge_tag_header_truncations", "Tags dropped to fit CDN header limits",
                                       registry=r)

    def render(self) -> bytes:
        """The exposition text: aggregated over workers in multiprocess mode, this process otherwise."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
