"""End-to-end behaviour of the cacheable routes through a real gateway and a fake upstream."""

from __future__ import annotations

import asyncio

from harness.gateway import FakeClock, RunningGateway
from tests.gateway.conftest import AUTH_A, AUTH_B, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream
from tests.support.transports import DeadUpstream


async def post_chat(gw: RunningGateway, body: dict | None = None, headers: dict | None = None):
    return await gw.client.post("/v1/chat/completions", json=body or CHAT, headers=headers or AUTH_A)


async def test_repeated_deterministic_request_is_a_byte_identical_hit(
    gw: RunningGateway, fake: FakeUpstream, clock: FakeClock
) -> None:
    first = await post_chat(gw)
    first_body = await first.read()
    clock.advance(7)
    second = await post_chat(gw)
    second_body = await second.read()

    assert first.status == second.status == 200
    assert first.headers["Cache-Status"].startswith("tokenedge; fwd=miss; stored")
    assert first.headers["Age"] == "0"
    assert second.headers["Cache-Status"].startswith("tokenedge; hit; ttl=3593")
    assert second.headers["Age"] == "7"
    assert fake.calls["chat"] == 1
    assert second_body == first_body
    assert second.headers["ETag"] == first.headers["ETag"]
    assert second.headers["X-Cache-Key"] == first.headers["X-Cache-Key"]


async def test_equivalent_requests_share_one_entry(gw: RunningGateway, fake: FakeUpstream) -> None:
    first = await post_chat(gw)
    assert first.headers["Cache-Status"] == "tokenedge; fwd=miss; stored; detail=exact"  # no tokenizer: exact
    variant = {
        "messages": [{"content": "What is 2+2?", "role": "user"}],
        "temperature": 0.0,
        "model": "test-model",
        "top_p": 1,
        "user": "u",
    }
    resp = await post_chat(gw, variant)
    assert resp.headers["Cache-Status"].startswith("tokenedge; hit")
    assert fake.calls["chat"] == 1


async def test_text_variants_share_an_entry_only_at_the_opt_in_normalized_level(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    variant = {**CHAT, "messages": [{"content": "What is 2+2? \u200b", "role": "user"}]}
    exact = await make_gateway()
    await post_chat(exact)
    missed = await post_chat(exact, variant)
    assert missed.headers["Cache-Status"] == "tokenedge; fwd=miss; stored; detail=exact"
    assert fake.calls["chat"] == 2
    normalized = await make_gateway(routes={"chat/completions": {"level": "normalized"}})
    first = await post_chat(normalized)
    assert first.headers["Cache-Status"] == "tokenedge; fwd=miss; stored; detail=normalized"
    resp = await post_chat(normalized, variant)
    assert resp.headers["Cache-Status"].startswith("tokenedge; hit")
    assert fake.calls["chat"] == 3


async def test_tenants_never_share_an_entry_on_a_tenant_route(gw: RunningGateway, fake: FakeUpstream) -> None:
    a = await post_chat(gw, headers=AUTH_A)
    b = await post_chat(gw, headers=AUTH_B)
    assert b.headers["Cache-Status"].startswith("tokenedge; fwd=miss")
    assert a.headers["X-Cache-Key"] != b.headers["X-Cache-Key"]
    assert await a.read() != await b.read()
    assert fake.calls["chat"] == 2
    assert a.headers["Cache-Control"] == "private"


async def test_tenants_share_an_entry_on_a_public_route(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway(routes={"chat/completions": {"scope": "public"}})
    a = await post_chat(gw, headers=AUTH_A)
    b = await post_chat(gw, headers=AUTH_B)
    assert b.headers["Cache-Status"].startswith("tokenedge; hit")
    assert a.headers["X-Cache-Key"] == b.headers["X-Cache-Key"]
    assert a.headers["X-Cache-Key"].startswith("te1:pub:")
    assert b.headers["Cache-Control"] == "public, max-age=0, s-maxage=3600"
    assert fake.calls["chat"] == 1


async def test_sampled_request_bypasses_with_the_reason(gw: RunningGateway, fake: FakeUpstream) -> None:
    body = {**CHAT, "temperature": 0.7}
    first = await post_chat(gw, body)
    second = await post_chat(gw, body)
    assert first.headers["Cache-Status"] == "tokenedge; fwd=bypass; detail=temperature"
    assert second.headers["Cache-Control"] == "no-store"
    assert "X-Cache-Key" not in second.headers
    assert fake.calls["chat"] == 2


async def test_no_store_stores_nothing(gw: RunningGateway, fake: FakeUpstream) -> None:
    await post_chat(gw, headers={**AUTH_A, "Cache-Control": "no-store"})
    resp = await post_chat(gw)
    assert resp.headers["Cache-Status"].startswith("tokenedge; fwd=miss")
    assert fake.calls["chat"] == 2


async def test_no_cache_skips_the_lookup_but_stores(gw: RunningGateway, fake: FakeUpstream) -> None:
    await post_chat(gw)
    refreshed = await post_chat(gw, headers={**AUTH_A, "Cache-Control": "no-cache"})
    after = await post_chat(gw)
    assert refreshed.headers["Cache-Status"].startswith("tokenedge; fwd=miss; stored")
    assert await after.read() == await refreshed.read()
    assert fake.calls["chat"] == 2


async def test_max_age_rejects_older_entries(
    gw: RunningGateway, fake: FakeUpstream, clock: FakeClock
) -> None:
    await post_chat(gw)
    clock.advance(30)
    young_enough = await post_chat(gw, headers={**AUTH_A, "Cache-Control": "max-age=60"})
    too_old = await post_chat(gw, headers={**AUTH_A, "Cache-Control": "max-age=10"})
    assert young_enough.headers["Cache-Status"].startswith("tokenedge; hit")
    assert too_old.headers["Cache-Status"].startswith("tokenedge; fwd=miss")
    assert fake.calls["chat"] == 2


async def test_only_if_cached_miss_is_504(gw: RunningGateway, fake: FakeUpstream) -> None:
    resp = await post_chat(gw, headers={**AUTH_A, "Cache-Control": "only-if-cached"})
    body = await resp.json()
    assert resp.status == 504
    assert body["error"]["code"] == "only_if_cached"
    assert fake.calls["chat"] == 0
    await post_chat(gw)
    cached = await post_chat(gw, headers={**AUTH_A, "Cache-Control": "only-if-cached"})
    assert cached.status == 200


async def test_expired_entry_is_a_miss(gw: RunningGateway, fake: FakeUpstream, clock: FakeClock) -> None:
    await post_chat(gw)
    clock.advance(3601)
    resp = await post_chat(gw)
    assert resp.headers["Cache-Status"].startswith("tokenedge; fwd=miss")
    assert fake.calls["chat"] == 2


async def test_fifty_concurrent_identical_misses_make_one_upstream_call(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    fake.gate = asyncio.Event()
    tasks = [asyncio.create_task(post_chat(gw)) for _ in range(50)]
    await fake.entered.wait()
    while len(gw.state.flights) == 0:
        await asyncio.sleep(0)
    fake.gate.set()
    responses = await asyncio.gather(*tasks)
    bodies = {await r.read() for r in responses}
    statuses = [r.headers["Cache-Status"] for r in responses]
    assert fake.calls["chat"] == 1
    assert len(bodies) == 1
    assert all(r.status == 200 for r in responses)
    assert sum("collapsed" in s or "hit" in s for s in statuses) == 49


async def test_failing_leader_propagates_to_every_follower(make_gateway: GatewayFactory) -> None:
    dead = "http://127.0.0.1:9"  # discard port: connection refused
    gw = await make_gateway(dead)
    responses = await asyncio.gather(*(post_chat(gw) for _ in range(10)))
    assert {r.status for r in responses} == {502}
    assert len(gw.state.flights) == 0


async def test_upstream_errors_pass_through_and_are_never_stored(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    for status in (429, 500):
        fake.status = status
        first = await post_chat(gw)
        assert first.status == status
        assert (await first.json())["error"]["message"] == f"forced {status}"
        assert first.headers["Cache-Control"] == "no-store"
        assert "detail=status" in first.headers["Cache-Status"]
    fake.status = None
    ok = await post_chat(gw)
    assert ok.status == 200
    assert ok.headers["Cache-Status"].startswith("tokenedge; fwd=miss; stored")
    assert fake.calls["chat"] == 3


async def test_content_filtered_answers_are_not_stored(gw: RunningGateway, fake: FakeUpstream) -> None:
    fake.finish_reason = "content_filter"
    await post_chat(gw)
    resp = await post_chat(gw)
    assert "detail=content-filter" in resp.headers["Cache-Status"]
    assert fake.calls["chat"] == 2


async def test_upstream_down_serves_stale_inside_stale_if_error(
    make_gateway: GatewayFactory, upstream_url: str, clock: FakeClock
) -> None:
    gw = await make_gateway(cache={"stale_if_error_s": 600})
    first = await post_chat(gw)
    stored = await first.read()
    gw.state.upstream = dead = DeadUpstream()  # the same L1 behind an upstream that refuses connections
    clock.advance(3600 + 100)
    stale = await post_chat(gw)
    assert stale.status == 200
    assert await stale.read() == stored
    assert "detail=stale-if-error" in stale.headers["Cache-Status"]
    assert stale.headers["Cache-Control"] == "no-store"
    clock.advance(600)
    gone = await post_chat(gw)
    assert gone.status == 502
    assert (await gone.json())["error"]["code"] == "upstream_unavailable"
    assert dead.calls == 2  # the stale answer asked the upstream first


async def test_connection_refused_is_a_prompt_502(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway("http://127.0.0.1:9")
    started = asyncio.get_running_loop().time()
    resp = await post_chat(gw)
    assert resp.status == 502
    assert asyncio.get_running_loop().time() - started < 1.0 + 0.5
    assert (await resp.json())["error"]["type"] == "upstream_error"


async def test_the_upstream_receives_the_clients_own_bytes(gw: RunningGateway, fake: FakeUpstream) -> None:
    raw = (
        b'{"model":"test-model","temperature":0,"messages":[{"role":"user","content":"  hi  "}],"x_custom":1}'
    )
    await gw.client.post(
        "/v1/chat/completions",
        data=raw,
        headers={**AUTH_A, "Content-Type": "application/json", "Connection": "keep-alive"},
    )
    assert fake.bodies[-1] == {
        "model": "test-model",
        "temperature": 0,
        "x_custom": 1,
        "messages": [{"role": "user", "content": "  hi  "}],
    }
    assert fake.headers[-1]["Authorization"] == "Bearer tenant-a-key"


async def test_configured_upstream_key_replaces_the_clients(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway(upstream={"api_key": "sk-upstream"})
    await post_chat(gw)
    assert fake.headers[-1]["Authorization"] == "Bearer sk-upstream"


async def test_model_revision_change_misses(gw: RunningGateway, fake: FakeUpstream, clock: FakeClock) -> None:
    first = await post_chat(gw)
    fake.revision = "rev-2"
    clock.advance(31)
    stale_rev = await post_chat(gw)  # serves rev-1 while the catalog refreshes in the background
    assert stale_rev.headers["X-Cache-Key"] == first.headers["X-Cache-Key"]
    refresh = gw.state.catalog._refresh
    assert refresh is not None
    await refresh
    assert gw.state.catalog.cached_revision("test-model") == "rev-2"
    after = await post_chat(gw)
    assert after.headers["X-Cache-Key"] != first.headers["X-Cache-Key"]
    assert "rev:rev-2" in after.headers["Surrogate-Key"]


async def test_embeddings_are_cached_whatever_the_temperature(gw: RunningGateway, fake: FakeUpstream) -> None:
    body = {"model": "test-model", "input": "hello"}
    await gw.client.post("/v1/embeddings", json=body, headers=AUTH_A)
    resp = await gw.client.post("/v1/embeddings", json=body, headers=AUTH_A)
    assert resp.headers["Cache-Status"].startswith("tokenedge; hit")
    assert fake.calls["embeddings"] == 1


async def test_other_v1_paths_pass_through_uncached(gw: RunningGateway, fake: FakeUpstream) -> None:
    for _ in range(2):
        resp = await gw.client.get("/v1/files", headers=AUTH_A)
        assert resp.status == 200
        assert (await resp.json())["echo_auth"] == "Bearer tenant-a-key"
    assert fake.calls["files"] == 2


async def test_models_is_proxied_and_cached_briefly(gw: RunningGateway, fake: FakeUpstream) -> None:
    first = await gw.client.get("/v1/models", headers=AUTH_A)
    await gw.client.get("/v1/models", headers=AUTH_A)
    assert (await first.json())["data"][0]["id"] == "test-model"
    assert fake.calls["models"] == 1


async def test_stream_requests_pass_through(gw: RunningGateway, fake: FakeUpstream) -> None:
    resp = await post_chat(gw, {**CHAT, "stream": True, "temperature": 0.5})
    text = await resp.text()
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert text.rstrip().endswith("data: [DONE]")
    assert '"content":"world"' in text


async def test_public_route_follower_is_not_refused_with_the_leaders_credential(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway(routes={"chat/completions": {"scope": "public"}})
    fake.denied_tokens = {AUTH_B["Authorization"]}
    fake.gate = asyncio.Event()
    leader = asyncio.create_task(post_chat(gw, headers=AUTH_B))
    await fake.entered.wait()
    follower = asyncio.create_task(post_chat(gw, headers=AUTH_A))
    key = next(iter(gw.state.flights._flights))
    while gw.state.flights.followers(key) == 0:
        await asyncio.sleep(0)
    fake.gate.set()
    refused, served = await leader, await follower
    assert refused.status == 401
    assert served.status == 200
    assert served.headers["Cache-Status"].startswith("tokenedge; fwd=miss; stored")
    assert fake.calls["chat"] == 2


async def test_tenant_route_followers_share_the_leaders_refusal(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    fake.denied_tokens = {AUTH_A["Authorization"]}
    fake.gate = asyncio.Event()
    leader = asyncio.create_task(post_chat(gw))
    await fake.entered.wait()
    follower = asyncio.create_task(post_chat(gw))
    key = next(iter(gw.state.flights._flights))
    while gw.state.flights.followers(key) == 0:
        await asyncio.sleep(0)
    fake.gate.set()
    assert [(await leader).status, (await follower).status] == [401, 401]
    assert fake.calls["chat"] == 1  # same credential: one refusal is everyone's answer
