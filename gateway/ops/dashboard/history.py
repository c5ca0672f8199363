"""The dashboard's time series: cumulative snapshots of `/metrics` kept in bounded rings, one per window.

Every sample is taken from the same collectors `/metrics` renders (aggregated over workers in multiprocess mode),
so each worker's rings hold the fleet's history and any worker can answer `/dashboard/data`; a worker started later
simply has a shorter history. A window's chart points are the differences between consecutive snapshots,
its totals the difference between the current counters and the window's first snapshot: the page, the JSON and a
scrape of `/metrics` agree by construction.

Bounded: 5 min in 10 s steps, 1 h in 1 min steps, 24 h in 15 min steps (about 190 snapshots of about 100 numbers).
Hit rate = hit / (hit + miss + coalesced + stale): the requests that consulted the cache. Bypasses and errors are
counted apart, as in the Grafana dashboard.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from typing import Any

Samples = Mapping[str, list[tuple[dict[str, str], float]]]
Snapshot = dict[str, float]

WINDOWS: dict[str, tuple[float, float]] = {"5m": (300.0, 10.0), "1h": (3600.0, 60.0), "24h": (86400.0, 900.0)}
RESULTS: tuple[str, ...] = ("hit", "miss", "coalesced", "stale", "bypass", "error")
LOOKUP_RESULTS: tuple[str, ...] = ("hit", "miss", "coalesced", "stale")  # the hit-rate denominator
MISS_RESULTS: tuple[str, ...] = ("miss", "coalesced")  # answered by the upstream through the cache
TOP_REASONS = 10


def snapshot(samples: Samples) -> Snapshot:
    """The cumulative counters the charts need, flattened: `req|hit`, `why|bypass|temperature`, `lat|hit|0.005`."""
    snap: Snapshot = defaultdict(float)
    for labels, value in samples.get("tokenedge_requests_total", []):
        result = labels.get("result", "")
        snap[f"req|{result}"] += value
        if result != "hit":
            snap[f"why|{result}|{labels.get('reason', '')}"] += value
    for labels, value in samples.get("tokenedge_request_duration_seconds_bucket", []):
        result = labels.get("result", "")
        kind = "hit" if result == "hit" else "miss" if result in MISS_RESULTS else None
        if kind is not None:
            snap[f"lat|{kind}|{labels['le']}"] += value
    for labels, value in samples.get("tokenedge_time_to_first_token_seconds_bucket", []):
        if labels.get("result") in MISS_RESULTS:
            snap[f"ttft|{labels['le']}"] += value
    snap["tokens_saved"] = sum(v for _, v in samples.get("tokenedge_tokens_saved_total", []))
    snap["cost_saved_usd"] = sum(v for _, v in samples.get("tokenedge_cost_saved_usd_total", []))
    return dict(snap)


def quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """PromQL `histogram_quantile` over cumulative (upper bound, count) buckets; None without observations."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
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


def _buckets(d: Snapshot, prefix: str) -> list[tuple[float, float]]:
    return [(float(k[len(prefix) :]), v) for k, v in d.items() if k.startswith(prefix)]


def figures(d: Snapshot) -> dict[str, Any]:
    """One interval's (or one window's) chart values from a difference of snapshots."""
    requests = {r: d.get(f"req|{r}", 0.0) for r in RESULTS}
    looked_up = sum(requests[r] for r in LOOKUP_RESULTS)
    lat = {kind: _buckets(d, f"lat|{kind}|") for kind in ("hit", "miss")}
    ttft = _buckets(d, "ttft|")
    return {
        "hit_rate": requests["hit"] / looked_up if looked_up else None,
        "requests": requests,
        "latency_s": {
            f"{kind}_p{q}": quantile(q / 100, lat[kind]) for kind in ("hit", "miss") for q in (50, 99)
        },
        "ttft_s": {f"p{q}": quantile(q / 100, ttft) for q in (50, 99)},
        "tokens_saved": d.get("tokens_saved", 0.0),
        "cost_saved_usd": d.get("cost_saved_usd", 0.0),
    }


def delta(older: Snapshot, newer: Snapshot) -> Snapshot:
    """Counter increase; never negative (a counter only drops when its process restarts)."""
    return {k: max(0.0, v - older.get(k, 0.0)) for k, v in newer.items()}


def reasons(d: Snapshot) -> list[dict[str, Any]]:
    rows = [(k.split("|", 2), v) for k, v in d.items() if k.startswith("why|") and v > 0]
    rows.sort(key=lambda row: (-row[1], row[0]))
    return [{"result": parts[1], "reason": parts[2], "count": v} for parts, v in rows[:TOP_REASONS]]


def _columns(points: list[dict[str, Any]]) -> dict[str, Any]:
    """A list of figures -> the same shape with a list per leaf (what the charts plot)."""
    if not points:
        return {}
    out: dict[str, Any] = {}
    for name, value in points[0].items():
        if isinstance(value, dict):
            out[name] = {sub: [p[name][sub] for p in points] for sub in value}
        else:
            out[name] = [p[name] for p in points]
    return out


class History:
    """Snapshots at each window's step (bounded rings); `window()` turns them into chart series and totals."""

    def __init__(self, windows: Mapping[str, tuple[float, float]] = WINDOWS) -> None:
        self.windows = dict(windows)
        self._rings = {
            name: deque[tuple[float, Snapshot]](maxlen=int(span // step) + 2)
            for name, (span, step) in self.windows.items()
        }

    def record(self, now: float, snap: Snapshot) -> None:
        """Keep `snap` in every ring whose step has passed since its last snapshot."""
        for name, ring in self._rings.items():
            if not ring or now - ring[-1][0] >= self.windows[name][1]:
                ring.append((now, snap))

    def due(self, now: float) -> bool:
        """Whether `record` at `now` would keep anything (the finest ring's step has passed)."""
        return any(
            not ring or now - ring[-1][0] >= self.windows[name][1] for name, ring in self._rings.items()
        )

    def window(self, name: str, now: float, current: Snapshot) -> dict[str, Any]:
        span, step = self.windows[name]
        ring = list(self._rings[name])
        inside = [p for p in ring if p[0] >= now - span]
        before = [p for p in ring if p[0] < now - span]
        points = before[-1:] + inside  # the last snapshot before the window starts covers its beginning
        if len(points) > 1 and points[-1][0] >= now:
            points[-1] = (now, current)  # just recorded: the same counters, read again
        else:
            points.append((now, current))  # the live point: the interval in progress
        intervals = [figures(delta(a, b)) for (_, a), (_, b) in itertools.pairwise(points)]
        total = delta(points[0][1], current)
        return {
            "name": name,
            "span_s": span,
            "step_s": step,
            "start": points[0][0],
            "end": now,
            "t": [t for t, _ in points[1:]],
            "series": _columns(intervals),
            "totals": {**figures(total), "reasons": reasons(total)},
        }
