"""Upstream transports for tests, swapped in as `GatewayState.upstream` (the `gateway.upstream.transport` seam).

A test that needs the upstream to fail, or to see what the gateway asked of it, replaces the transport instead of
reaching into the HTTP client's private attributes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from gateway.upstream.http import UpstreamResponse
from gateway.upstream.transport import OpenResponse, UpstreamTransport
from gateway.web.errors import UpstreamUnavailable

REFUSED = "upstream unavailable: connection refused"  # what the HTTP upstream says for a closed port


class DeadUpstream:
    """An upstream whose port is closed: every call fails before any answer, as the HTTP upstream's does."""

    def __init__(self) -> None:
        self.calls = 0

    async def request(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> UpstreamResponse:
        self.calls += 1
        raise UpstreamUnavailable(REFUSED)

    @asynccontextmanager
    async def open_stream(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> AsyncIterator[OpenResponse]:
        self.calls += 1
        raise UpstreamUnavailable(REFUSED)
        yield  # an async generator, so that entering the context raises


class CountingUpstream:
    """Passes every call to `inner` and counts the streams opened and not yet closed (a leaked connection)."""

    def __init__(self, inner: UpstreamTransport) -> None:
        self.inner = inner
        self.opened = 0
        self.open_now = 0

    async def request(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> UpstreamResponse:
        return await self.inner.request(method, path_qs, headers, body)

    @asynccontextmanager
    async def open_stream(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> AsyncIterator[OpenResponse]:
        async with self.inner.open_stream(method, path_qs, headers, body) as resp:
            self.opened += 1
            self.open_now += 1
            try:
                yield resp
            finally:
                self.open_now -= 1
