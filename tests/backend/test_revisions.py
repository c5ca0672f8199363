"""The backend pushes its revision: a header on every answer and `GET /tokenedge/revisions` (SSE)."""

from __future__ import annotations

import asyncio

from backend.server.revisions import FEED_KEY, REVISION_HEADER
from tests.backend.test_server import CHAT, FakeEngine, make_app, serve


async def test_every_answer_names_the_revision_that_made_it() -> None:
    async with serve(make_app(FakeEngine())) as client:
        for resp in (
            await client.post("/v1/chat/completions", json=CHAT),
            await client.get("/v1/models"),
            await client.post("/v1/chat/completions", json={"model": "tiny"}),
        ):  # an error too
            assert resp.headers[REVISION_HEADER] == "rev-test"


async def test_the_stream_announces_at_connect_and_on_every_load_and_ends_at_shutdown() -> None:
    app = make_app(FakeEngine())
    async with serve(app) as client:
        resp = await client.get("/tokenedge/revisions")
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
        assert first == b'event: revision\ndata: {"model":"tiny","revision":"rev-test"}\n\n'
        app[FEED_KEY].announce("tiny", "rev-2")
        second = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
        assert b'"revision":"rev-2"' in second
        app[FEED_KEY].close()
        assert await asyncio.wait_for(resp.content.read(), 5) == b""
