"""The upstream seam: what a fill, a stream tee or a relay needs from "the model server", as a protocol.

Implemented by the HTTP upstream (`gateway.upstream.http.Upstream`), the per-request token path
(`gateway.tokens.path.TokenUpstream`, which may answer over the binary token transport) and test fakes. Callers
hold an `UpstreamTransport`, never a concrete class, so a router over many backends or a local fake plugs in
without touching them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from gateway.upstream.http import UpstreamResponse


class StreamBody(Protocol):
    """The body of an open upstream response: read whole, or chunk by chunk as it arrives."""

    def iter_any(self) -> AsyncIterator[bytes]: ...


class OpenResponse(Protocol):
    """An upstream response whose head has arrived and whose body has not been read yet."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content(self) -> StreamBody: ...

    async def read(self) -> bytes: ...


class UpstreamTransport(Protocol):
    async def request(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> UpstreamResponse:
        """The whole answer; transport failures raise `gateway.web.errors.UpstreamError` subclasses."""
        ...

    def open_stream(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> AbstractAsyncContextManager[OpenResponse]:
        """The answer's head, its body still streaming; released when the context ends."""
        ...
