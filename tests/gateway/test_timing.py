"""The per-request stage timer: laps, the W3C Server-Timing header (admin debug only) and the stage histograms."""

from __future__ import annotations

import re

from gateway.ops.timing import StageTimer
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.gateway.test_metrics import scrape, value

ADMIN = {"Authorization": "Bearer admin-secret", "X-Tokenedge-Debug": "1"}
ENTRY = re.compile(r"^[a-z0-9]+;dur=\d+\.\d{3}$")


def test_laps_accumulate_per_stage_and_render_as_server_timing() -> None:
    timer = StageTimer("chat/completions")
    timer.lap("parse")
    timer.lap("l1")
    timer.lap("parse")
    header = timer.server_timing()
    names = [part.split(";")[0] for part in header.split(", ")]
    assert names == ["parse", "l1", "total"]
    assert all(ENTRY.match(part) for part in header.split(", "))
    assert sum(timer.stages.values()) <= timer.elapsed()


async def test_server_timing_only_for_admin_debug_requests(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(server={"admin_token": "admin-secret"})
    miss = await gw.client.post("/v1/chat/completions", json=CHAT, headers=ADMIN)
    hit = await gw.client.post("/v1/chat/completions", json=CHAT, headers=ADMIN)
    plain = await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    tenant_debug = await gw.client.post(
        "/v1/chat/completions", json=CHAT, headers={**AUTH_A, "X-Tokenedge-Debug": "1"}
    )
    admin_no_debug = await gw.client.post(
        "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer admin-secret"}
    )
    assert [p.split(";")[0] for p in miss.headers["Server-Timing"].split(", ")] == [
        "parse",
        "l1",
        "upstream",
        "serialize",
        "total",
    ]
    assert [p.split(";")[0] for p in hit.headers["Server-Timing"].split(", ")] == [
        "parse",
        "l1",
        "serialize",
        "total",
    ]
    for resp in (plain, tenant_debug, admin_no_debug):
        assert resp.status == 200
        assert "Server-Timing" not in resp.headers


async def test_no_server_timing_without_a_configured_admin_token(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway()
    resp = await gw.client.post(
        "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer ", "X-Tokenedge-Debug": "1"}
    )
    assert "Server-Timing" not in resp.headers


async def test_stage_histograms_and_ttft_are_recorded(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway()
    await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    await gw.client.post("/v1/chat/completions", json={**CHAT, "temperature": 0.5}, headers=AUTH_A)
    m = await scrape(gw)
    count = "tokenedge_stage_duration_seconds_count"
    assert value(m, count, stage="parse") == 3
    assert value(m, count, stage="l1") == 2
    assert value(m, count, stage="upstream") == 2  # the miss's fill and the bypass's relay
    assert value(m, count, stage="serialize") == 2
    assert value(m, "tokenedge_time_to_first_token_seconds_count", result="hit") == 1
    assert value(m, "tokenedge_time_to_first_token_seconds_count") == 3


async def test_streamed_miss_reports_its_upstream_stage(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(server={"admin_token": "admin-secret"})
    resp = await gw.client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=ADMIN)
    await resp.read()
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert [p.split(";")[0] for p in resp.headers["Server-Timing"].split(", ")] == [
        "parse",
        "l1",
        "upstream",
        "total",
    ]


async def test_each_streamed_request_is_one_ttft_observation(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway()
    for _ in range(2):  # a streamed miss, then its replayed hit
        resp = await gw.client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH_A)
        await resp.read()
    m = await scrape(gw)
    assert value(m, "tokenedge_time_to_first_token_seconds_count", result="miss") == 1
    assert value(m, "tokenedge_time_to_first_token_seconds_count", result="hit") == 1
