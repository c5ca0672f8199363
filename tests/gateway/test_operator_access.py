"""Operator endpoints (/dashboard, /dashboard/data, optionally /metrics): direct loopback means a loopback peer AND
no forwarding header of any kind; anything relayed needs the admin token (gateway/handlers/tenancy.py)."""

from __future__ import annotations

import pytest

from tests.gateway.conftest import GatewayFactory

ADMIN = {"Authorization": "Bearer s3cret"}
FORWARDING = [
    "Forwarded",
    "X-Forwarded-For",
    "X-Forwarded-Host",
    "X-Forwarded-Proto",
    "Via",
    "X-Real-IP",
    "True-Client-IP",
    "CF-Connecting-IP",
    "Fastly-Client-IP",
    "X-Client-IP",
    "x-forwarded-for",
]


@pytest.mark.parametrize("header", FORWARDING)
async def test_any_forwarding_header_makes_a_loopback_request_relayed(
    make_gateway: GatewayFactory, header: str
) -> None:
    gw = await make_gateway(server={"admin_token": "s3cret"})
    relayed = {header: "203.0.113.7"}
    for path in ("/dashboard", "/dashboard/data"):
        refused = await gw.client.get(path, headers=relayed)
        assert refused.status == 401
        assert (await refused.json())["error"]["type"] == "authentication_error"
        assert (await gw.client.get(path, headers={**relayed, **ADMIN})).status == 200
    assert (await gw.client.get("/dashboard")).status == 200  # direct loopback, as documented


async def test_relayed_requests_without_an_admin_token_find_nothing(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway()
    assert (await gw.client.get("/dashboard", headers={"X-Real-IP": "203.0.113.7"})).status == 404


async def test_metrics_can_require_the_admin_token(make_gateway: GatewayFactory) -> None:
    open_gw = await make_gateway(server={"admin_token": "s3cret"})
    closed = await make_gateway(
        server={"admin_token": "s3cret", "metrics_require_token": True, "dashboard_public_on_loopback": False}
    )
    assert (
        await open_gw.client.get("/metrics", headers={"Via": "1.1 cdn"})
    ).status == 200  # the default: open
    assert (await closed.client.get("/metrics")).status == 401
    assert (await closed.client.get("/metrics", headers=ADMIN)).status == 200
