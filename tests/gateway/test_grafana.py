"""The shipped Grafana dashboard is valid JSON and refers only to metrics the gateway or the backend export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from backend.engine.outputs import EngineStats
from backend.metrics import BackendMetrics
from tests.gateway.conftest import AUTH_A, CHAT
from tests.support.gateway import RunningGateway

DASHBOARD = Path(__file__).resolve().parents[2] / "configs" / "grafana" / "tokenedge.json"
METRIC = re.compile(r"\b(tokenedge_[a-z0-9_]+)\b")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",),
             "summary": ("_sum", "_count", ""), "unknown": ("",)}


def exported_names(text: str) -> set[str]:
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
        names.update(s.name for s in family.samples)
    return names


def expressions(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def backend_metrics_text() -> str:
    stats = EngineStats(running=1, waiting=0, blocks_total=64, blocks_free=60, blocks_cached=2,
                        prefix_hit_tokens_total=0, prefill_tokens_total=0, generated_tokens_total=0)
    return BackendMetrics(lambda: stats).render().decode()


def test_dashboard_is_importable_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 30
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 15
    assert all(panel["targets"] and panel["datasource"]["uid"] == "${DS_PROMETHEUS}" for panel in dashboard["panels"])


async def test_every_metric_in_the_dashboard_is_exported(gw: RunningGateway) -> None:
    await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    exported = exported_names(await (await gw.client.get("/metrics")).text()) | exported_names(backend_metrics_text())
    used = {name for expr in expressions(json.loads(DASHBOARD.read_text())) for name in METRIC.findall(expr)}
    assert used, "no PromQL found"
    assert used - exported == set()
    assert {"tokenedge_backend_running_requests", "tokenedge_backend_kv_blocks",
            "tokenedge_backend_generated_tokens_total", "tokenedge_requests_total"} <= used
