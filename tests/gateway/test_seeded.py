"""Seeded sampled requests (`seed` with `temperature > 0`): cached where the upstream promises invariant seeded
sampling (`tokenedge.seeded_invariant` in `/v1/models`), a bypass with a reason elsewhere unless the route opts in.

Covers policy.confirm_seeded through the gateway, the catalog's reading of the promise, and the seed in the key.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai import AsyncOpenAI

from gateway.upstream.catalog import parse_models
from harness.gateway import FakeClock, RunningGateway, gateway_config, start_gateway
from harness.services import serving
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream
from tests.support.token_backend import EchoEngine, backend_app, chatml_byte_tokenizer

SEEDED = {**CHAT, "temperature": 0.7, "seed": 42}


async def ask(gw: RunningGateway, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    resp = await gw.client.post("/v1/chat/completions", json=body, headers=AUTH_A)
    assert resp.status == 200
    return resp.headers["Cache-Status"], await resp.json()


async def test_the_same_seed_twice_is_a_hit_where_the_upstream_promises(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    fake.seeded_invariant = True
    first_status, first = await ask(gw, SEEDED)
    again_status, again = await ask(gw, SEEDED)

    assert first_status.startswith("tokenedge; fwd=miss; stored")
    assert again_status.startswith("tokenedge; hit")
    assert again == first and fake.calls["chat"] == 1


async def test_another_seed_is_a_miss(gw: RunningGateway, fake: FakeUpstream) -> None:
    fake.seeded_invariant = True
    await ask(gw, SEEDED)
    status, other = await ask(gw, {**SEEDED, "seed": 43})
    status_t, _ = await ask(gw, {**SEEDED, "temperature": 0.8})

    assert status.startswith("tokenedge; fwd=miss; stored") and status_t.startswith("tokenedge; fwd=miss")
    assert fake.calls["chat"] == 3
    assert other["choices"][0]["message"]["content"].startswith("answer #2")


async def test_an_upstream_that_does_not_promise_is_a_bypass_with_a_reason(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    statuses = [(await ask(gw, SEEDED))[0] for _ in range(2)]

    assert statuses == ["tokenedge; fwd=bypass; detail=seed"] * 2
    assert fake.calls["chat"] == 2
    assert (
        gw.state.catalog.known["test-model"].revision == "rev-1"
    )  # the catalog answered: it made no promise


async def test_a_route_that_opts_in_caches_seeded_requests_on_any_upstream(
    make_gateway: GatewayFactory, fake: FakeUpstream
) -> None:
    gw = await make_gateway(routes={"chat/completions": {"allow_seeded": True}})
    await ask(gw, SEEDED)
    status, _ = await ask(gw, SEEDED)

    assert status.startswith("tokenedge; hit") and fake.calls["chat"] == 1
    assert fake.calls["models"] >= 1  # the revision still comes from the catalog


async def test_the_openai_client_gets_a_seeded_stream_from_the_entry(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    fake.seeded_invariant = True
    async with AsyncOpenAI(base_url=gw.url + "/v1", api_key="tenant-a-key", max_retries=0) as client:
        args: dict[str, Any] = {
            "model": "test-model",
            "messages": CHAT["messages"],
            "temperature": 0.7,
            "seed": 42,
        }
        miss = [c async for c in await client.chat.completions.create(**args, stream=True)]
        hit = await client.chat.completions.create(**args)

    assert fake.calls["chat"] == 1
    assert hit.choices[0].message.content == "".join(
        c.choices[0].delta.content or "" for c in miss if c.choices
    )


@pytest.mark.parametrize(
    ("extra", "promised"),
    [
        ({"seeded_invariant": True}, True),
        ({"seeded_invariant": "true"}, False),
        ({"seeded_invariant": 1}, False),
        ({"batch_invariant": True}, False),  # greedy invariance promises nothing about seeded draws
        ({}, False),
    ],
)
def test_the_catalog_reads_only_an_explicit_promise(extra: dict[str, Any], promised: bool) -> None:
    body = {"data": [{"id": "m", "tokenedge": {"revision": "r", **extra}}]}
    assert parse_models(orjson.dumps(body))["m"].seeded_invariant is promised


async def test_a_new_revision_drops_the_promise_until_the_catalog_says_it_again(
    gw: RunningGateway, fake: FakeUpstream
) -> None:
    fake.seeded_invariant = True
    await ask(gw, SEEDED)
    catalog = gw.state.catalog
    assert catalog.known["test-model"].seeded_invariant is True
    catalog.learn("test-model", "rev-2")

    assert catalog.known["test-model"].seeded_invariant is False
    assert (
        await catalog.seeded_invariant("test-model", {}) is True
    )  # asked again: the upstream still promises


async def test_the_real_backend_promises_and_its_seeded_answers_are_cached(clock: FakeClock) -> None:
    """The co-deployed backend's /v1/models says `seeded_invariant` (its engine runs batch-invariant)."""
    tokenizer = chatml_byte_tokenizer()
    engine = EchoEngine(tokenizer)
    body = {"model": "tiny", "temperature": 0.9, "seed": 5, "messages": [{"role": "user", "content": "hi"}]}
    async with serving(backend_app(tokenizer, engine)) as url:
        gw = await start_gateway(gateway_config(url, tokens={"enabled": False}), clock)
        try:
            statuses = [(await ask(gw, body))[0] for _ in range(2)]
            other = (await ask(gw, {**body, "seed": 6}))[0]
        finally:
            await gw.close()

    assert statuses[0].startswith("tokenedge; fwd=miss; stored") and statuses[1].startswith("tokenedge; hit")
    assert other.startswith("tokenedge; fwd=miss; stored") and len(engine.prompts) == 2
