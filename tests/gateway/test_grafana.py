"""The shipped Grafana dashboard is valid JSON, refers only to metrics the gateway or the backend export, finds every
gateway series it reads on the first scrape of a fresh gateway, and has a panel for each chart of `/dashboard`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from backend.engine.outputs import EngineStats
from backend.metrics import BackendMetrics
from harness.gateway import RunningGateway
from tests.gateway.conftest import AUTH_A, CHAT

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "configs" / "grafana" / "tokenedge.json"
PAGE = ROOT / "gateway" / "handlers" / "dashboard.html"
METRIC = re.compile(r"\b(tokenedge_[a-z0-9_]+)\b")
SELECTOR = re.compile(r"\b(tokenedge_[a-z0-9_]+)(?:\{([^}]*)\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "summary": ("_sum", "_count", ""),
    "unknown": ("",),
}


def exported_names(text: str) -> set[str]:
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
        names.update(s.name for s in family.samples)
    return names


def expressions(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def backend_metrics_text() -> str:
    stats = EngineStats(
        running=1,
        waiting=0,
        blocks_total=64,
        blocks_free=60,
        blocks_cached=2,
        prefix_hit_tokens_total=0,
        prefill_tokens_total=0,
        generated_tokens_total=0,
    )
    return BackendMetrics(lambda: stats).render().decode()


def test_dashboard_is_importable_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 30
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 15
    assert all(
        panel["targets"] and panel["datasource"]["uid"] == "${DS_PROMETHEUS}" for panel in dashboard["panels"]
    )


async def test_every_metric_in_the_dashboard_is_exported(gw: RunningGateway) -> None:
    await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    exported = exported_names(await (await gw.client.get("/metrics")).text()) | exported_names(
        backend_metrics_text()
    )
    used = {name for expr in expressions(json.loads(DASHBOARD.read_text())) for name in METRIC.findall(expr)}
    assert used, "no PromQL found"
    assert used - exported == set()
    assert {
        "tokenedge_backend_running_requests",
        "tokenedge_backend_kv_blocks",
        "tokenedge_backend_generated_tokens_total",
        "tokenedge_requests_total",
    } <= used


def selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Each `metric{label="v", label=~"a|b"}` of a PromQL expression: (metric, [(label, op, value)])."""
    return [(name, MATCHER.findall(body or "")) for name, body in SELECTOR.findall(expr)]


def matches(labels: dict[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    for label, op, want in matchers:
        have = labels.get(label, "")
        hit = re.fullmatch(want, have) is not None if op in ("=~", "!~") else have == want
        if hit != (op in ("=", "=~")):
            return False
    return True


async def test_a_fresh_gateway_exports_every_series_grafana_and_the_page_read(gw: RunningGateway) -> None:
    """Before any request: each gateway selector in the Grafana JSON, and each family the page reads, has a sample
    (a panel shows 0, not "no data")."""
    text = await (await gw.client.get("/metrics")).text()
    found: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(dict(sample.labels))
    used = [
        sel
        for expr in expressions(json.loads(DASHBOARD.read_text()))
        for sel in selectors(expr)
        if not sel[0].startswith("tokenedge_backend_")
    ]
    assert len(used) > 20
    for name, matchers in used:
        assert any(matches(labels, matchers) for labels in found.get(name, [])), (name, matchers)
    page_sources = [ROOT / "gateway" / "ops" / "dashboard" / f for f in ("history.py", "summary.py")]
    read_by_page = {m for path in page_sources for m in METRIC.findall(path.read_text())}
    assert {"tokenedge_cache_errors_total", "tokenedge_cost_saved_usd_total"} <= read_by_page
    assert read_by_page - set(found) == set()
    assert {labels["tier"] for labels in found["tokenedge_cache_errors_total"]} >= {"l1", "l2"}


def test_every_page_chart_has_the_grafana_panel_of_the_same_name() -> None:
    titles = {panel["title"] for panel in json.loads(DASHBOARD.read_text())["panels"]}
    charts = re.findall(r'\{ id: "(\w+)", title: "([^"]+)"', PAGE.read_text())
    assert len(charts) == 6
    assert {title for _, title in charts} - titles == set()
    assert {"Hit rate", "Top miss and bypass reasons", "Bypasses and errors"} <= titles
