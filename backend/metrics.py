"""Prometheus metrics for the backend (design §7), in a registry owned by one app, never the global one.

Engine gauges and counters are read from `engine.stats()` at scrape time by a collector, so the engine
thread never touches prometheus objects; only the time-to-first-token histogram is observed by the server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backend.engine.outputs import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        yield GaugeMetricFamily(
            "tokenedge_backend_running_requests", "Sequences being decoded.", value=s.running
        )
        yield GaugeMetricFamily(
            "tokenedge_backend_waiting_requests", "Sequences waiting for a slot.", value=s.waiting
        )
        if s.max_running:  # what a router plays a queue forward on (a batching engine is not one slot)
            yield GaugeMetricFamily(
                "tokenedge_backend_max_running_requests",
                "Sequences it decodes at once (max_num_seqs).",
                value=s.max_running,
            )
        blocks = GaugeMetricFamily(
            "tokenedge_backend_kv_blocks", "KV-cache blocks by state.", labels=["state"]
        )
        blocks.add_metric(["total"], s.blocks_total)
        blocks.add_metric(["free"], s.blocks_free)
        blocks.add_metric(["used"], s.blocks_total - s.blocks_free)
        blocks.add_metric(["cached"], s.blocks_cached)
        yield blocks
        yield CounterMetricFamily(
            "tokenedge_backend_prefix_cache_hit_tokens",
            "Prompt tokens served from the prefix cache.",
            value=s.prefix_hit_tokens_total,
        )
        yield CounterMetricFamily(
            "tokenedge_backend_prefill_tokens", "Prompt tokens computed.", value=s.prefill_tokens_total
        )
        yield CounterMetricFamily(
            "tokenedge_backend_generated_tokens", "Tokens generated.", value=s.generated_tokens_total
        )
        yield from _speculation_metrics(s)


def _speculation_metrics(s: EngineStats) -> Iterator[Metric]:
    """Prompt-lookup speculation: counters, plus the acceptance rate and tokens per verify forward so far."""
    yield CounterMetricFamily(
        "tokenedge_backend_spec_verify_steps",
        "Forwards that verified drafts.",
        value=s.spec_verify_steps_total,
    )
    yield CounterMetricFamily(
        "tokenedge_backend_spec_draft_tokens", "Draft tokens proposed.", value=s.spec_draft_tokens_total
    )
    yield CounterMetricFamily(
        "tokenedge_backend_spec_accepted_tokens", "Draft tokens accepted.", value=s.spec_accepted_tokens_total
    )
    yield GaugeMetricFamily(
        "tokenedge_backend_spec_acceptance_rate",
        "Accepted / proposed draft tokens since start.",
        value=s.spec_accepted_tokens_total / s.spec_draft_tokens_total if s.spec_draft_tokens_total else 0.0,
    )
    verify = s.spec_verify_steps_total
    yield GaugeMetricFamily(
        "tokenedge_backend_spec_tokens_per_forward",
        "Tokens gained per verify forward since start (1 + accepted drafts).",
        value=(verify + s.spec_accepted_tokens_total) / verify if verify else 0.0,
    )


class BackendMetrics:
    """One per app: its own registry, the engine collector, and the TTFT histogram."""

    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(stats))
        self.ttft_seconds = Histogram(
            "tokenedge_backend_ttft_seconds",
            "Time from request to first token.",
            buckets=_TTFT_BUCKETS,
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
