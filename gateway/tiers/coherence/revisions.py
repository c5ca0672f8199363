"""Follow the co-deployed backend's revision event stream, so a new model revision is known the moment it loads.

The backend (backend/server/revisions.py) answers `GET /tokenedge/revisions` with an SSE stream: one `revision`
event per served model on connect and again on every model load, and a comment line every few seconds. While the
stream is connected the catalog trusts it (`push_live`) and never polls. When it drops (the backend restarts, the
connection dies, heartbeats stop for 3 intervals) the catalog falls back to confirming the revision with
`/v1/models` before each lookup until the stream is back. An upstream that answers anything but an event stream
cannot push: the watcher stops and the catalog polls every `upstream.models_ttl_s`, as before.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson

from gateway.upstream.catalog import ModelCatalog

log = logging.getLogger("tokenedge.revisions")
PATH = "/tokenedge/revisions"
HEARTBEAT_S = 5.0  # the backend's comment interval; three missed ones mean the stream is dead
_MAX_BACKOFF_S = 1.0


class RevisionWatcher:
    def __init__(
        self, base_url: str, session: aiohttp.ClientSession, catalog: ModelCatalog, headers: dict[str, str]
    ) -> None:
        self._url = base_url.rstrip("/") + PATH
        self._session = session
        self._catalog = catalog
        self._headers = headers
        self.connected = asyncio.Event()  # set while the stream is live (tests and /ready read it)

    async def run(self) -> None:
        backoff_s = 0.02
        while True:
            try:
                if not await self._follow():
                    log.info("upstream offers no revision stream: revisions are polled every models_ttl_s")
                    self._catalog.push_seen = False
                    return
                backoff_s = 0.02
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.debug("revision stream: %s: %s", type(exc).__name__, exc)
            finally:
                self._catalog.push_live = False
                self.connected.clear()
            await asyncio.sleep(backoff_s)  # reconnect pacing; lookups confirm with /v1/models meanwhile
            backoff_s = min(backoff_s * 2, _MAX_BACKOFF_S)

    async def _follow(self) -> bool:
        """Read the stream until it ends; False when the upstream has no such stream."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=2.0, sock_read=3 * HEARTBEAT_S)
        async with self._session.get(self._url, headers=self._headers, timeout=timeout) as resp:
            if resp.status != 200 or not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                return resp.status >= 500  # a 5xx may be a backend still starting: try again
            async for line in resp.content:
                if line.startswith(b"data:"):
                    self._event(line[5:].strip())
        return True

    def _event(self, data: bytes) -> None:
        doc = orjson.loads(data)  # a malformed event raises ValueError: reconnect and read a fresh snapshot
        if not isinstance(doc, dict):
            raise ValueError(f"malformed revision event: {data[:200]!r}")
        model, revision = doc.get("model"), doc.get("revision")
        if not (isinstance(model, str) and isinstance(revision, str) and revision):
            raise ValueError(f"malformed revision event: {data[:200]!r}")
        self._catalog.learn(model, revision)
        if not self._catalog.push_live:  # the first event of a connection: the snapshot is complete enough
            self._catalog.push_seen = self._catalog.push_live = True
            self.connected.set()
