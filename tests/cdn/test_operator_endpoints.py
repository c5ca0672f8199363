"""The operator endpoints through the shipped edge configs: nginx and Varnish run on the gateway's host, so every
client they relay arrives from loopback; both mark relayed requests (X-Forwarded-For) and the dashboard refuses
them without the admin token, while a direct loopback client is still served as documented."""

from __future__ import annotations

import pytest

from tests.cdn.conftest import ADMIN, EdgeStack, StackFactory

PATHS = ["/dashboard", "/dashboard/data"]


async def check_edge(stack: EdgeStack, path: str) -> None:
    refused, body = await stack.get(path, headers={"Accept": "application/json"})
    allowed, _ = await stack.get(path, headers=ADMIN)
    async with stack.http.get(stack.gateway.url + path) as direct:
        direct_status = direct.status

    assert refused.status == 401, body
    assert b"authentication_error" in body
    assert allowed.status == 200
    assert direct_status == 200


@pytest.mark.parametrize("path", PATHS)
async def test_dashboard_through_nginx_needs_the_token(make_nginx: StackFactory, path: str) -> None:
    await check_edge(await make_nginx(), path)


@pytest.mark.parametrize("path", PATHS)
async def test_dashboard_through_varnish_needs_the_token(make_varnish: StackFactory, path: str) -> None:
    await check_edge(await make_varnish(), path)
