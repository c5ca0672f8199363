"""The dashboard's numbers, computed from the same exposition text `/metrics` serves (pure, no I/O).

Reading the rendered text rather than the live objects makes the page agree with `/metrics` by construction,
including the multiprocess aggregation over workers. Hit ratio = `hit` requests / all requests on the cacheable
routes (the same expression the Grafana dashboard and the Prometheus test use); stale answers are counted apart.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

QUANTILES = (0.5, 0.95, 0.99)
TOP_REASONS = 8


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] for every sample in an exposition text."""
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name].append((dict(s.labels), float(s.value)))
    return out


def quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """PromQL `histogram_quantile` over cumulative (upper bound, count) buckets; None without observations."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound  # the +Inf bucket: the highest finite bound, as Prometheus does
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def _sum(rows: list[tuple[dict[str, str], float]], **match: str) -> float:
    return sum(v for labels, v in rows if all(labels.get(k) == want for k, want in match.items()))


def _latency(rows: list[tuple[dict[str, str], float]], results: tuple[str, ...]) -> dict[str, float | None]:
    merged: dict[float, float] = defaultdict(float)
    for labels, value in rows:
        if labels.get("result") in results:
            merged[float(labels["le"])] += value
    out: dict[str, float | None] = {f"p{round(q * 100)}": quantile(q, merged.items()) for q in QUANTILES}
    out["count"] = max(merged.values(), default=0.0)
    return out


def _by(rows: list[tuple[dict[str, str], float]], label: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for labels, value in rows:
        out[labels.get(label, "")] += value
    return dict(out)


def summarize(text: str, *, now: float, upstream: Mapping[str, Any]) -> dict[str, Any]:
    s = samples(text)
    requests = s.get("tokenedge_requests_total", [])
    total = sum(v for _, v in requests)
    hits = _sum(requests, result="hit")
    routes = sorted({labels["route"] for labels, _ in requests})
    reasons: dict[tuple[str, str], float] = defaultdict(float)
    for labels, value in requests:
        if labels.get("result") in ("miss", "bypass", "coalesced", "error") and value:
            reasons[(labels["result"], labels["reason"])] += value
    top = sorted(reasons.items(), key=lambda item: (-item[1], item[0]))[:TOP_REASONS]
    lookups: dict[str, dict[str, float]] = defaultdict(dict)
    for labels, value in s.get("tokenedge_cache_lookups_total", []):
        lookups[labels["tier"]][labels["outcome"]] = value
    tiers: dict[str, dict[str, float]] = defaultdict(dict)
    for metric, field in (("tokenedge_cache_entries", "entries"), ("tokenedge_cache_bytes", "bytes"),
                          ("tokenedge_cache_evictions", "evictions")):
        for labels, value in s.get(metric, []):
            tiers[labels["tier"]][field] = value
    durations = s.get("tokenedge_request_duration_seconds_bucket", [])
    return {
        "now": now,
        "requests": {"total": total, "by_result": _by(requests, "result")},
        "hit_ratio": hits / total if total else None,
        "by_route": {r: {"total": _sum(requests, route=r), "hit": _sum(requests, route=r, result="hit")}
                     for r in routes},
        "miss_reasons": [{"result": res, "reason": why, "count": n} for (res, why), n in top],
        "latency_s": {"hit": _latency(durations, ("hit",)), "miss": _latency(durations, ("miss", "coalesced"))},
        "tokens_saved": sum(v for _, v in s.get("tokenedge_tokens_saved_total", [])),
        "bytes_served_from_cache": sum(v for _, v in s.get("tokenedge_bytes_served_from_cache_total", [])),
        "lookups": dict(lookups),
        "tiers": dict(tiers),
        "cache_errors": _by(s.get("tokenedge_cache_errors_total", []), "tier"),
        "upstream": dict(upstream),
    }
