"""The dashboard's numbers, computed from the samples `/metrics` renders (pure, no I/O).

Reading the collectors' samples (`GatewayMetrics.samples`) rather than the live objects makes the page agree with
`/metrics` by construction, including the multiprocess aggregation over workers. Hit ratio = hit / (hit + miss +
coalesced + stale), the requests that consulted the cache (the same expression as the Grafana dashboard); bypasses
and errors are counted apart. This is the since-start view; `gateway.ops.dashboard.history` adds the windows and charts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gateway.ops.dashboard.history import LOOKUP_RESULTS, quantile

__all__ = ["quantile", "samples", "summarize"]

QUANTILES = (0.5, 0.99)
TOP_REASONS = 8


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] for every sample in an exposition text."""
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name].append((dict(s.labels), float(s.value)))
    return out


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


def _hit_ratio(rows: list[tuple[dict[str, str], float]], **match: str) -> float | None:
    looked_up = sum(_sum(rows, result=r, **match) for r in LOOKUP_RESULTS)
    return _sum(rows, result="hit", **match) / looked_up if looked_up else None


def summarize(
    s: Mapping[str, list[tuple[dict[str, str], float]]], *, now: float, upstream: Mapping[str, Any]
) -> dict[str, Any]:
    requests = s.get("tokenedge_requests_total", [])
    total = sum(v for _, v in requests)
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
    for metric, field in (
        ("tokenedge_cache_entries", "entries"),
        ("tokenedge_cache_bytes", "bytes"),
        ("tokenedge_cache_evictions", "evictions"),
    ):
        for labels, value in s.get(metric, []):
            tiers[labels["tier"]][field] = value
    durations = s.get("tokenedge_request_duration_seconds_bucket", [])
    return {
        "now": now,
        "requests": {"total": total, "by_result": _by(requests, "result")},
        "hit_ratio": _hit_ratio(requests),
        "by_route": {
            r: {
                "total": _sum(requests, route=r),
                "hit": _sum(requests, route=r, result="hit"),
                "hit_ratio": _hit_ratio(requests, route=r),
            }
            for r in routes
        },
        "miss_reasons": [{"result": res, "reason": why, "count": n} for (res, why), n in top],
        "latency_s": {
            "hit": _latency(durations, ("hit",)),
            "miss": _latency(durations, ("miss", "coalesced")),
        },
        "tokens_saved": sum(v for _, v in s.get("tokenedge_tokens_saved_total", [])),
        "cost_saved_usd": sum(v for _, v in s.get("tokenedge_cost_saved_usd_total", [])),
        "bytes_served_from_cache": sum(v for _, v in s.get("tokenedge_bytes_served_from_cache_total", [])),
        "lookups": dict(lookups),
        "tiers": dict(tiers),
        "cache_errors": _by(s.get("tokenedge_cache_errors_total", []), "tier"),
        "upstream": dict(upstream),
    }
