"""Model revisions are pushed, not polled: the backend's revision stream and the revision header on its answers.

The upstream here is the fake one plus the two things the co-deployed backend adds (backend/server/revisions.py,
registered on the fake's app): `X-Tokenedge-Revision` on every answer and `GET /tokenedge/revisions`. Catalog
polling is effectively off (`models_ttl_s` an hour), so only push and headers can teach the gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from backend.server import revisions
from gateway.upstream.catalog import REVISION_HEADER
from harness.gateway import RunningGateway
from harness.services import serving
from tests.gateway.conftest import AUTH_A, CHAT, GatewayFactory
from tests.support.fake_upstream import FakeUpstream

OTHER = {**CHAT, "messages": [{"role": "user", "content": "a different question"}]}
HOUR = {"models_ttl_s": 3600.0}


@pytest.fixture
async def pushing(fake: FakeUpstream) -> AsyncIterator[tuple[str, revisions.RevisionFeed]]:
    app = fake.app()
    revisions.register(app, "test-model", fake.revision)

    async def header_from_fake(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[REVISION_HEADER] = fake.revision  # the fake's own revision, changed by the tests

    app.on_response_prepare.append(header_from_fake)
    async with serving(app) as url:
        yield url, app[revisions.FEED_KEY]


async def ask(gw: RunningGateway, body: dict[str, Any] = CHAT) -> tuple[str, bytes]:
    resp = await gw.client.post("/v1/chat/completions", json=body, headers=AUTH_A)
    assert resp.status == 200
    return resp.headers["Cache-Status"], await resp.read()


def learned(gw: RunningGateway) -> asyncio.Event:
    """Set when the gateway's catalog learns a new revision (wraps the coherence listener)."""
    event = asyncio.Event()
    catalog = gw.state.catalog
    inner: Callable[..., None] | None = catalog.listener

    def listener(*args: Any) -> None:
        if inner is not None:
            inner(*args)
        event.set()

    catalog.listener = listener
    return event


async def until(condition: Callable[[], bool]) -> None:
    """Wait (bounded) for a state the gateway reaches on its own, from an event on a socket."""
    for _ in range(400):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


async def test_a_pushed_revision_is_used_at_once(
    make_gateway: GatewayFactory, fake: FakeUpstream, pushing: tuple[str, revisions.RevisionFeed]
) -> None:
    url, feed = pushing
    gw = await make_gateway(url, upstream=HOUR)
    await until(lambda: gw.state.catalog.push_live)
    _, old = await ask(gw)
    assert (await ask(gw))[0].endswith("detail=l1")
    event = learned(gw)
    fake.revision = "rev-2"
    feed.announce("test-model", "rev-2")
    await asyncio.wait_for(event.wait(), 5)
    status, answer = await ask(gw)
    assert status.startswith("tokenedge; fwd=miss") and answer != old
    assert gw.state.cache.l1.entries() == 1  # the old revision's entry was dropped from memory


async def test_after_the_stream_drops_the_first_answer_of_a_new_backend_is_never_old(
    make_gateway: GatewayFactory, fake: FakeUpstream, pushing: tuple[str, revisions.RevisionFeed]
) -> None:
    url, feed = pushing
    gw = await make_gateway(url, upstream=HOUR)
    await until(lambda: gw.state.catalog.push_live)
    _, old = await ask(gw)
    feed.close()  # the backend goes away: its stream ends (and reconnects find no stream)
    await until(lambda: not gw.state.catalog.push_live)
    fake.revision = "rev-2"  # a new backend reports a new revision
    for _ in range(5):
        status, answer = await ask(gw)
        assert answer != old, status
    assert gw.state.catalog.cached_revision("test-model") == "rev-2"


async def test_an_answer_naming_a_new_revision_updates_the_catalog(
    make_gateway: GatewayFactory, fake: FakeUpstream, pushing: tuple[str, revisions.RevisionFeed]
) -> None:
    url, _ = pushing
    gw = await make_gateway(url, upstream={**HOUR, "revision_push": False})  # an upstream that cannot push
    _, old = await ask(gw)
    fake.revision = "rev-2"
    status, _ = await ask(gw, OTHER)  # a miss answered by the new revision: learned, not stored under rev-1
    assert status.startswith("tokenedge; fwd=miss") and "detail=revision-changed" in status
    assert gw.state.catalog.cached_revision("test-model") == "rev-2"
    status, answer = await ask(gw)  # the first request after the gateway learned it misses
    assert status.startswith("tokenedge; fwd=miss; stored") and answer != old
    assert (await ask(gw))[0].endswith("detail=l1")


def backend_app(revision: str) -> web.Application:
    from backend.server import ServedModel, ServerLimits, create_app
    from tests.backend.test_server import FakeEngine, byte_tokenizer

    model = ServedModel(
        id="tiny", revision=revision, tokenizer=byte_tokenizer(), max_model_len=256, created=0
    )
    return create_app(model, FakeEngine, ServerLimits(default_max_tokens=16))


async def test_a_restarted_backend_with_a_new_revision_is_never_answered_from_old_entries(
    make_gateway: GatewayFactory,
) -> None:
    """The real backend app, stopped and started again on the same port with another revision."""
    first = TestServer(backend_app("rev-A"), host="127.0.0.1")
    await first.start_server()
    port = first.port
    gw = await make_gateway(f"http://127.0.0.1:{port}", upstream=HOUR, tokens={"enabled": False})
    body = {"model": "tiny", "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
    await until(lambda: gw.state.catalog.push_live)
    before = await gw.client.post("/v1/chat/completions", json=body, headers=AUTH_A)
    assert (
        (await gw.client.post("/v1/chat/completions", json=body, headers=AUTH_A))
        .headers["Cache-Status"]
        .endswith("detail=l1")
    )
    await first.close()
    second = TestServer(backend_app("rev-B"), host="127.0.0.1", port=port)
    await second.start_server()
    try:
        statuses = []
        for _ in range(4):  # from the first request on: the new revision's key
            resp = await gw.client.post("/v1/chat/completions", json=body, headers=AUTH_A)
            assert resp.status == 200 and resp.headers["X-Cache-Key"] != before.headers["X-Cache-Key"]
            statuses.append(resp.headers["Cache-Status"])
        assert statuses[0].startswith("tokenedge; fwd=miss")
        assert gw.state.catalog.cached_revision("tiny") == "rev-B"
    finally:
        await second.close()
