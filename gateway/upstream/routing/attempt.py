"""One attempt on one backend, bounded: by the backend's ejection (a hung engine, found by its health checks) and,
for a stream, by the first-byte deadline (`upstream.first_byte_timeout_s`: head and first body chunk).

A hung engine accepts connections (the kernel completes the handshake) and then says nothing, so neither the
connect timeout nor anything short of the 120 s read timeout notices it; these two bounds do. Both stop the
attempt before any byte reached the client, so the pool retries it elsewhere. `Routed` is the stream the caller
reads: the primed first chunk, then the rest; with the route headers added to the engine's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, TypeVar

from multidict import CIMultiDict, CIMultiDictProxy

from gateway.upstream.http import finish_body
from gateway.upstream.routing.backend import Backend
from gateway.upstream.routing.policy import Decision, Policy
from gateway.upstream.routing.retention import UsageTap
from gateway.web.errors import UpstreamTimeout, UpstreamUnavailable

T = TypeVar("T")
BACKEND_HEADER = "X-Tokenedge-Backend"
ROUTE_HEADER = "X-Tokenedge-Route"


class FirstByteTimeout(UpstreamTimeout):
    """The stream's first byte did not come within the deadline: the engine is stalled or far behind."""


class Ejected(UpstreamUnavailable):
    """The backend was ejected while this attempt waited on it."""


async def bounded(aw: Awaitable[T], backend: Backend, deadline_s: float) -> T:
    """`aw`'s result, unless `backend` is ejected first (Ejected) or `deadline_s` passes (FirstByteTimeout;
    0: no deadline). The abandoned work is cancelled before either is raised."""
    task = asyncio.ensure_future(aw)
    ejected = backend.ejection()
    waiting: set[asyncio.Future[Any]] = {task, ejected}
    try:
        done, _ = await asyncio.wait(waiting, timeout=deadline_s or None, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task in done or (task.done() and not task.cancelled()):
        return task.result()
    if ejected.done():
        raise Ejected("upstream unavailable: the backend was ejected while answering")
    raise FirstByteTimeout("upstream timed out: no first byte within the deadline")


def route_headers(
    upstream: Mapping[str, str], backend: Backend, decision: Decision, policy: Policy
) -> CIMultiDictProxy[str]:
    """The engine's headers plus the two naming where this answer came from and why."""
    out = CIMultiDict(upstream)
    out[BACKEND_HEADER] = backend.name
    estimate = (
        f"; expected_tokens={decision.expected_tokens}; ttft_ms={decision.ttft_s * 1000:.0f}"
        f"; wait_ms={decision.wait_s * 1000:.0f}"
        if decision.ttft_s is not None
        else ""
    )
    out[ROUTE_HEADER] = (
        f"backend={backend.name}; policy={policy.value}; reason={decision.reason}; "
        f"matched_tokens={decision.matched_tokens}{estimate}"
    )
    return CIMultiDictProxy(out)


class Routed:
    """An open upstream response whose first body chunk was already read (to meet the first-byte deadline). Every
    chunk passes `tap` on its way (`retention.UsageTap`: what the engine says it reused, read when it is over)."""

    def __init__(self, resp: Any, first: bytes, headers: Mapping[str, str]) -> None:
        self._resp = resp
        self._first = first
        self.status: int = resp.status
        self.headers = headers
        self.content = self
        self.tap = UsageTap()

    async def iter_any(self) -> AsyncIterator[bytes]:
        feed = self.tap.feed
        if self._first:
            feed(self._first)
            yield self._first
        async for chunk in self._resp.content.iter_any():
            feed(chunk)
            yield chunk

    async def read(self) -> bytes:
        body: bytes = self._first + await self._resp.read()
        self.tap.feed(body)
        return body

    async def finish(self, timeout_s: float) -> None:
        await finish_body(self._resp, timeout_s)

    def close(self, _: object = None) -> None:
        """Cut the stream (its backend was ejected: a future's callback): the reader gets a clean upstream error."""
        self._resp.close()
