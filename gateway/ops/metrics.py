"""Prometheus metrics (design §7), one object per app, never module-level singletons.

Buckets span sub-millisecond cache hits to multi-second generations. With `--workers N` the launcher sets
PROMETHEUS_MULTIPROC_DIR before any worker imports prometheus_client, so every worker writes its samples to shared
mmap files and `/metrics` on any worker aggregates all of them (prometheus_client's multiprocess mode). We chose
it over per-worker scrape targets because workers share one port (SO_REUSEPORT): a scraper cannot address a
worker, and any worker can answer for all of them.

Gauges need care in that mode. Per-process state (L1 entries, bytes, evictions) is a `livesum` gauge that every
worker refreshes on a timer, so the sum over live workers is the fleet's L1. Shared state (L2, one Redis for all
workers) must not be summed: it is never written to the per-process files at all, but read from Redis by the
worker answering the scrape and added to the same `tokenedge_cache_entries{tier="l2"}` /
`tokenedge_cache_bytes{tier="l2"}` families at render time, so it is reported exactly once.

Every family the dashboard and the Grafana JSON read is exported from the first scrape: the known label sets (each
route with each result, each tier with each lookup outcome, `cache_errors_total{tier}`, ...) start at 0, so a panel
shows 0 rather than "no data" before the first event (`_zero_known_series`).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from gateway.config.cost import Price, saved_usd
from gateway.keys.canonical import Fallback
from gateway.keys.policy import CACHEABLE_ENDPOINTS
from gateway.ops.routing_metrics import register as register_routing
from gateway.ops.tally import Tally
from gateway.ops.timing import STAGES

Samples = dict[str, list[tuple[dict[str, str], float]]]
ENTRIES = "tokenedge_cache_entries"
BYTES = "tokenedge_cache_bytes"

ROUTES: tuple[str, ...] = CACHEABLE_ENDPOINTS
TIERS: tuple[str, ...] = ("l1", "l2")
LOOKUP_OUTCOMES: tuple[str, ...] = ("hit", "miss", "error")
# One (result, reason) per result, so `sum by (result)` has every result from the first scrape; other reasons
# appear with their first event (the reason set is open: upstream error codes, refusals).
KNOWN_RESULTS: tuple[tuple[str, str], ...] = (
    ("hit", "l1"),
    ("hit", "l2"),
    ("miss", "stored"),
    ("coalesced", "stored"),
    ("stale", "error"),
    ("bypass", "temperature"),
    ("error", "error"),
)
CHARTED_LATENCY_RESULTS: tuple[str, ...] = ("hit", "miss", "coalesced", "stale")
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)


def _latency(name: str, doc: str, labels: Sequence[str], registry: CollectorRegistry) -> Histogram:
    """A latency histogram on the shared `LATENCY_BUCKETS`."""
    return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS, registry=registry)


def _per_tier(name: str, doc: str, registry: CollectorRegistry) -> Gauge:
    """A per-process size gauge by tier, summed over live workers (the shared tiers are added at scrape time)."""
    return Gauge(name, doc, ["tier"], multiprocess_mode="livesum", registry=registry)


KEY_PART_LABELS = 64  # distinct `part` labels of tokenedge_key_parts_total, then `other`


class GatewayMetrics:
    """Every family the gateway exports, built in groups: one `_..._families` method per group, listed once in
    `__init__`, so a new group is one method and one line there."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        for build in (
            self._request_families,
            self._cache_families,
            self._upstream_families,
            self._saving_families,
            self._edge_families,
        ):
            build(self.registry)
        self.routing = register_routing(self.registry)  # many upstreams (gateway/ops/routing_metrics.py)
        self._stages: dict[str, Histogram] = {}
        self.tally = (
            Tally()
        )  # the hot path records here; flushed into the objects above (gateway/ops/tally.py)
        self.prices: dict[str, Price] = {}  # dashboard.prices, parsed (set by the app)
        self._zero_known_series()

    def _request_families(self, r: CollectorRegistry) -> None:
        self.requests = Counter(
            "tokenedge_requests",
            "Requests by route, result and reason",
            ["route", "result", "reason"],
            registry=r,
        )
        self.request_duration = _latency(
            "tokenedge_request_duration_seconds", "Gateway request latency", ["route", "result"], r
        )
        self.ttft = _latency(
            "tokenedge_time_to_first_token_seconds", "Time to first streamed token", ["route", "result"], r
        )
        self.stage_duration = _latency(
            "tokenedge_stage_duration_seconds", "Per-request latency breakdown by stage", ["stage"], r
        )

    def _cache_families(self, r: CollectorRegistry) -> None:
        self.lookups = Counter(
            "tokenedge_cache_lookups", "Cache lookups by tier and outcome", ["tier", "outcome"], registry=r
        )
        self.cache_errors = Counter(
            "tokenedge_cache_errors", "Cache tier failures (served degraded)", ["tier"], registry=r
        )
        self.cache_stores = Counter(
            "tokenedge_cache_stores", "Entries written, by tier", ["tier"], registry=r
        )
        self.cache_refusals = Counter(
            "tokenedge_cache_store_refusals",
            "Entries a tier refused to store, by reason",
            ["tier", "reason"],
            registry=r,
        )
        self.unfit_misses = Counter(
            "tokenedge_cache_unfit_misses",
            "Entries found that could not answer the request (no usage, no JSON form): misses, by route and reason",
            ["route", "reason"],
            registry=r,
        )
        self.cache_entries = _per_tier(ENTRIES, "Entries held, by tier", r)
        self.cache_bytes = _per_tier(BYTES, "Bytes held, by tier", r)
        self.cache_evictions = _per_tier(
            "tokenedge_cache_evictions", "Capacity evictions since start, by tier", r
        )

    def _upstream_families(self, r: CollectorRegistry) -> None:
        self.upstream_duration = _latency(
            "tokenedge_upstream_duration_seconds", "Upstream call latency", ["route"], r
        )
        self.upstream_up = Gauge(
            "tokenedge_upstream_up",
            "1 when the last upstream contact succeeded",
            multiprocess_mode="livemin",
            registry=r,
        )

    def _saving_families(self, r: CollectorRegistry) -> None:
        self.tokenize_duration = _latency(
            "tokenedge_tokenize_duration_seconds", "Tokenization latency", (), r
        )
        self.remote_tokenize_duration = _latency(
            "tokenedge_remote_tokenize_duration_seconds",
            "Upstream tokenization latency (POST /tokenize, /apply-template) per new request body, by outcome",
            ["outcome"],
            r,
        )
        self.key_level_fallbacks = Counter(
            "tokenedge_key_level_fallbacks",
            "Requests a route's auto/tokens level keyed `exact` instead, by reason",
            ["reason"],
            registry=r,
        )
        self.tokens_saved = Counter(
            "tokenedge_tokens_saved", "Prompt + completion tokens served from cache", registry=r
        )
        self.bytes_from_cache = Counter(
            "tokenedge_bytes_served_from_cache", "Body bytes served from cache", registry=r
        )
        self.cost_saved = Counter(
            "tokenedge_cost_saved_usd",
            "Estimated upstream cost of the answers served from cache, in USD (dashboard.prices)",
            registry=r,
        )

    def _edge_families(self, r: CollectorRegistry) -> None:
        self.slow_clients = Counter(
            "tokenedge_slow_clients",
            "Connections closed at the edge: a request head or body too slow, or over the connection cap",
            ["phase"],
            registry=r,
        )
        self.tag_truncations = Counter(
            "tokenedge_tag_header_truncations", "Tags dropped to fit CDN header limits", registry=r
        )
        self.lane_answers = Counter(
            "tokenedge_fast_lane_answers",
            "Hits answered by the fast lane, before HTTP parsing (also counted in requests_total)",
            ["tier"],
            registry=r,
        )
        self.key_parts = Counter(
            "tokenedge_key_parts",
            "Keys derived with a header or query parameter as key material (design §2.1), by part: each one splits "
            "entries; declare a header the upstream never answers by in server.transport_headers",
            ["part"],
            registry=r,
        )
        self._key_part_labels: set[str] = set()

    def count_key_parts(self, parts: Iterable[str]) -> None:
        """One derived key's key-material parts (`header:accept`, `query:api-version`); client-chosen names, so
        the first KEY_PART_LABELS get a label each and the rest count as `other`."""
        for part in parts:
            if part not in self._key_part_labels:
                if len(self._key_part_labels) >= KEY_PART_LABELS:
                    part = "other"
                else:
                    self._key_part_labels.add(part)
            self.tally.inc(self.key_parts, (part,))

    def _zero_known_series(self) -> None:
        for why in Fallback:
            self.key_level_fallbacks.labels(why.value)
        for route in ROUTES:
            for result, reason in KNOWN_RESULTS:
                self.requests.labels(route, result, reason)
            for result in CHARTED_LATENCY_RESULTS:
                self.request_duration.labels(route, result)
                self.ttft.labels(route, result)
            self.upstream_duration.labels(route)
        for tier in TIERS:
            self.cache_errors.labels(tier)
            self.lane_answers.labels(tier)
            self.cache_stores.labels(tier)
            for outcome in LOOKUP_OUTCOMES:
                self.lookups.labels(tier, outcome)
        for stage in STAGES:
            self.stage(stage)

    def served_from_cache(self, usage: Mapping[str, object] | None, body_bytes: int, model: str = "") -> None:
        """A hit (JSON or replayed stream): the stored usage's tokens, the body's bytes and their price were saved."""
        saved = (usage or {}).get("total_tokens")
        if isinstance(saved, int) and saved > 0:
            self.tally.inc(self.tokens_saved, (), saved)
            if self.prices:
                usd = saved_usd(self.prices, model, usage)
                if usd > 0:
                    self.tally.inc(self.cost_saved, (), usd)
        self.tally.inc(self.bytes_from_cache, (), body_bytes)

    def stage(self, name: str) -> Histogram:
        """The pre-bound `stage_duration{stage=name}` child (the label set is the closed `timing.STAGES`)."""
        child = self._stages.get(name)
        if child is None:
            child = self._stages[name] = self.stage_duration.labels(name)
        return child

    def render(self, shared: Mapping[str, tuple[int, int]] | None = None) -> bytes:
        """The exposition text: aggregated over workers in multiprocess mode, this process otherwise.

        `shared` maps a shared tier (``"l2"``) to its (entries, bytes), read once by the caller at scrape time.
        """
        self.tally.flush()
        return generate_latest(_WithSharedTiers(self._source(), shared or {}))

    def samples(
        self, shared: Mapping[str, tuple[int, int]] | None = None, *, charted_only: bool = False
    ) -> Samples:
        """Sample name -> [(labels, value)], exactly what `render` writes (the same collectors), without the text.

        `charted_only`: just the families the dashboard's history keeps (a tenth of the work in one process).
        """
        self.tally.flush()
        charted = (self.requests, self.request_duration, self.ttft, self.tokens_saved, self.cost_saved)
        source: Collector = self._source()
        families: Iterable[Metric]
        if charted_only and source is self.registry:
            families = (family for collector in charted for family in collector.collect())
        else:
            families = _WithSharedTiers(source, shared or {}).collect()
        out: Samples = defaultdict(list)
        for family in families:
            for sample in family.samples:
                out[sample.name].append((sample.labels, sample.value))
        return out

    def _source(self) -> Collector:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            source = CollectorRegistry()
            MultiProcessCollector(source)
            return source
        return self.registry


class _WithSharedTiers(Collector):
    """Adds the shared tiers' sizes to the `cache_entries` / `cache_bytes` families, once per scrape."""

    def __init__(self, source: Collector, shared: Mapping[str, tuple[int, int]]) -> None:
        self._source = source
        self._shared = shared

    def collect(self) -> Iterator[Metric]:
        seen: set[str] = set()
        for metric in self._source.collect():
            if metric.name in (ENTRIES, BYTES) and self._shared:
                seen.add(metric.name)
                index = 0 if metric.name == ENTRIES else 1
                metric.samples = [s for s in metric.samples if s.labels.get("tier") not in self._shared]
                metric.samples.extend(
                    Sample(metric.name, {"tier": tier}, float(sizes[index]))
                    for tier, sizes in self._shared.items()
                )
            yield metric
        for name, index, doc in ((ENTRIES, 0, "Entries held, by tier"), (BYTES, 1, "Bytes held, by tier")):
            if self._shared and name not in seen:
                family = GaugeMetricFamily(name, doc, labels=["tier"])
                for tier, sizes in self._shared.items():
                    family.add_metric([tier], float(sizes[index]))
                yield family
