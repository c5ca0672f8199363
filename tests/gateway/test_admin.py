"""Purge (L1 + L2), the GET alias with ETag/304, explain, health and readiness."""

from __future__ import annotations

from tests.gateway.conftest import AUTH_A, AUTH_B, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream

ADMIN = {"Authorization": "Bearer admin-secret"}


async def test_purge_by_key_and_by_tag_empties_both_tiers(
    make_gateway: GatewayFactory, fake: FakeUpstream, redis_url: str
) -> None:
    gw = await make_gateway(cache={"redis_url": redis_url}, server={"admin_token": "admin-secret"})
    other = {**CHAT, "messages": [{"role": "user", "content": "other"}]}
    first = await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    await gw.client.post("/v1/chat/completions", json=other, headers=AUTH_A)
    key = first.headers["X-Cache-Key"]

    by_key = await gw.client.post("/admin/purge", json={"keys": [key]}, headers=ADMIN)
    assert (await by_key.json())["purged"] == {
        "l1": 1,
        "l2": 1,
        "bus": 0,
    }  # bus: other processes that confirmed
    miss = await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert miss.headers["Cache-Status"].startswith("tokenedge; fwd=miss")

    by_tag = await gw.client.post("/admin/purge", json={"tags": ["model:test-model"]}, headers=ADMIN)
    assert (await by_tag.json())["purged"] == {"l1": 2, "l2": 2, "bus": 0}
    for body in (CHAT, other):
        resp = await gw.client.post("/v1/chat/completions", json=body, headers=AUTH_A)
        assert resp.headers["Cache-Status"].startswith("tokenedge; fwd=miss")
    assert fake.calls["chat"] == 5


async def test_purge_needs_the_admin_token(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(server={"admin_token": "admin-secret"})
    for headers in ({}, AUTH_A, {"Authorization": "Bearer admin-secre"}):
        resp = await gw.client.post("/admin/purge", json={"tags": ["x"]}, headers=headers)
        assert resp.status == 401
        assert (await resp.json())["error"]["type"] == "authentication_error"


async def test_admin_is_disabled_without_a_configured_token(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway()
    resp = await gw.client.post("/admin/purge", json={"tags": ["x"]}, headers={"Authorization": "Bearer "})
    assert resp.status == 404


async def test_purge_rejects_malformed_requests(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(server={"admin_token": "admin-secret"})
    for body in ({}, {"keys": "te1:x"}, {"keys": ["not-a-key"]}, {"tags": [1]}):
        resp = await gw.client.post("/admin/purge", json=body, headers=ADMIN)
        assert resp.status == 400, body


async def test_get_alias_returns_the_stored_body_and_answers_304(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway(routes={"chat/completions": {"scope": "public"}})
    first = await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    key, etag = first.headers["X-Cache-Key"], first.headers["ETag"]
    alias = await gw.client.get(f"/v1/cache/{key}")
    assert alias.status == 200
    assert await alias.read() == await first.read()
    assert alias.headers["ETag"] == etag
    assert alias.headers["Cache-Control"] == "public, max-age=0, s-maxage=3600"
    not_modified = await gw.client.get(f"/v1/cache/{key}", headers={"If-None-Match": etag})
    assert not_modified.status == 304
    assert await not_modified.read() == b""
    assert not_modified.headers["ETag"] == etag
    changed = await gw.client.get(f"/v1/cache/{key}", headers={"If-None-Match": '"other"'})
    assert changed.status == 200


async def test_tenant_alias_answers_only_its_tenant(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway()
    first = await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    key = first.headers["X-Cache-Key"]
    mine = await gw.client.get(f"/v1/cache/{key}", headers=AUTH_A)
    theirs = await gw.client.get(f"/v1/cache/{key}", headers=AUTH_B)
    anonymous = await gw.client.get(f"/v1/cache/{key}")
    assert mine.status == 200
    assert theirs.status == anonymous.status == 404


async def test_alias_of_unknown_or_malformed_key_is_404(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway()
    for key in ("te1:pub:" + "0" * 64, "garbage", "te1:pub:xyz"):
        resp = await gw.client.get(f"/v1/cache/{key}")
        assert resp.status == 404


async def test_explain_shows_the_key_without_calling_upstream(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway()
    explained = await gw.client.post(
        "/v1/cache/explain", json={"request": {**CHAT, "user": "bob"}}, headers=AUTH_A
    )
    doc = await explained.json()
    assert fake.calls["chat"] == 0
    assert doc["decision"] == {"action": "lookup", "ttl_s": 3600, "read": True}
    assert "user" not in doc["canonical"]
    assert (doc["level"], doc["route_level"]) == ("exact", "auto")  # the fake upstream has no tokenizer
    sampled = await gw.client.post(
        "/v1/cache/explain", json={"request": {**CHAT, "temperature": 0.9}}, headers=AUTH_A
    )
    assert (await sampled.json())["decision"] == {"action": "bypass", "reason": "temperature"}
    await gw.client.get("/v1/models", headers=AUTH_A)  # learn the upstream's revision
    explained = await (
        await gw.client.post("/v1/cache/explain", json={"request": CHAT}, headers=AUTH_A)
    ).json()
    real = await gw.client.post("/v1/chat/completions", json=CHAT, headers=AUTH_A)
    assert explained["key"] == real.headers["X-Cache-Key"]


async def test_health_and_ready(make_gateway: GatewayFactory, redis_url: str) -> None:
    gw = await make_gateway(cache={"redis_url": redis_url})
    assert (await gw.client.get("/health")).status == 200
    ready = await gw.client.get("/ready")
    assert ready.status == 200
    assert await ready.json() == {"status": "ready", "upstream": "up", "redis": "up"}
    down = await make_gateway("http://127.0.0.1:9")
    unready = await down.client.get("/ready")
    assert unready.status == 503
    assert (await unready.json())["upstream"] == "down"
