"""Structured access log: one JSON line per sampled request, no credentials, off by default."""

from __future__ import annotations

import logging

import orjson
import pytest

from gateway.ops.accesslog import key_fields, sampled
from harness.gateway import RunningGateway
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory


def lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "tokenedge.access"]


@pytest.mark.parametrize(
    ("rate", "draw", "expected"),
    [(0.0, 0.0, False), (1.0, 0.99, True), (0.25, 0.2, True), (0.25, 0.3, False)],
)
def test_sampling(rate: float, draw: float, expected: bool) -> None:
    assert sampled(rate, lambda: draw) is expected


def test_key_fields_truncate_the_digest_and_keep_the_scope_hash() -> None:
    assert key_fields("te1:abcdef0123456789abcd:" + "f" * 64) == (
        "te1:abcdef012345:" + "f" * 16,
        "abcdef012345",
    )
    assert key_fields("") == ("", "")


async def test_one_json_line_per_request_without_the_token(
    make_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await make_gateway(server={"access_log_sample_rate": 1.0})
    with caplog.at_level(logging.INFO, logger="tokenedge.access"):
        await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
        await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
        await gw.client.post("/v1/chat/completions", json={**CHAT, "temperature": 0.3}, headers=AUTH_A)
        await gw.client.post(
            "/v1/chat/completions", data=b"{not json", headers={**AUTH_A, "Content-Type": "application/json"}
        )
    got = lines(caplog)
    assert [(x["result"], x["reason"], x["status"]) for x in got] == [
        ("miss", "stored", 200),
        ("hit", "l1", 200),
        ("bypass", "temperature", 200),
        ("error", "error", 400),
    ]
    miss, hit = got[0], got[1]
    assert hit["key"] == miss["key"] and str(hit["key"]).startswith("te1:")
    assert set(hit["stages_ms"]) == {"parse", "l1", "serialize"}  # type: ignore[arg-type]
    assert hit["route"] == "chat/completions" and hit["tenant"]
    assert all("tenant-a-key" not in r.getMessage() for r in caplog.records)


async def test_off_by_default(gw: RunningGateway, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tokenedge.access"):
        await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert lines(caplog) == []


async def test_streamed_requests_log_their_key(
    make_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await make_gateway(server={"access_log_sample_rate": 1.0})
    with caplog.at_level(logging.INFO, logger="tokenedge.access"):
        for _ in range(2):
            resp = await gw.client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH_A)
            await resp.read()
    got = lines(caplog)
    assert [(x["result"], x["reason"]) for x in got] == [("miss", "stored"), ("hit", "l1")]
    assert got[0]["key"] == got[1]["key"] and str(got[0]["key"]).startswith("te1:")
