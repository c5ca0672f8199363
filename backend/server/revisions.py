"""The model revision, pushed: a header on every answer and an event stream the gateway follows.

Every response carries `X-Tokenedge-Revision` (the revision of the model that produced it), so a gateway learns of
a new revision from the first answer made with it. `GET /tokenedge/revisions` is a server-sent event stream: a
`revision` event for the served model as soon as a client connects (that is the announcement at start: a
restarted backend is a new stream), again whenever `RevisionFeed.announce` reports a newly loaded model, and a
`: ping` comment every `HEARTBEAT_S` so a silent death is noticed. The stream ends when the server shuts down.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from backend.server.sse import SSE_HEADERS

REVISION_HEADER = "X-Tokenedge-Revision"
HEARTBEAT_S = 5.0


class RevisionFeed:
    """The served model's (id, revision), and a wake-up for every stream when it changes or the server stops."""

    def __init__(self, model_id: str, revision: str) -> None:
        self.model_id = model_id
        self.revision = revision
        self.closing = False
        self._changed = asyncio.Event()

    def announce(self, model_id: str, revision: str) -> None:
        """A model was (re)loaded: every connected gateway hears of it at once."""
        self.model_id, self.revision = model_id, revision
        self._wake()

    def close(self) -> None:
        self.closing = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout_s: float) -> bool:
        """Wait for a change (True) or the heartbeat interval (False)."""
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


FEED_KEY = web.AppKey("revision_feed", RevisionFeed)


async def stream(request: web.Request) -> web.StreamResponse:
    feed = request.app[FEED_KEY]
    response = web.StreamResponse(status=200, headers=SSE_HEADERS)
    await response.prepare(request)
    sent: tuple[str, str] | None = None
    while not feed.closing:
        if sent != (feed.model_id, feed.revision):
            sent = (feed.model_id, feed.revision)
            data = json.dumps({"model": sent[0], "revision": sent[1]}, separators=(",", ":"))
            await response.write(f"event: revision\ndata: {data}\n\n".encode())
        elif not await feed.changed(HEARTBEAT_S):
            await response.write(b": ping\n\n")
    await response.write_eof()
    return response


async def add_revision_header(request: web.Request, response: web.StreamResponse) -> None:
    feed = request.app.get(FEED_KEY)
    if feed is not None:
        response.headers[REVISION_HEADER] = feed.revision


def register(app: web.Application, model_id: str, revision: str) -> None:
    app[FEED_KEY] = RevisionFeed(model_id, revision)
    app.router.add_get("/tokenedge/revisions", stream)
    app.on_response_prepare.append(add_revision_header)

    async def close_streams(app: web.Application) -> None:
        app[FEED_KEY].close()

    app.on_shutdown.append(close_streams)
