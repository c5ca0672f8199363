"""The upstream seam: one pooled aiohttp ClientSession per process, and the only place aiohttp errors are translated.

Timeouts are per socket read (`sock_read`) and per connect, never a total, so long generations are not cut while
a dead or silent upstream is still detected. Bodies are relayed without decompression (`auto_decompress=False`);
cacheable requests ask the upstream for `identity` encoding so their bodies can be parsed and stored.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.config.settings import UpstreamConfig
from gateway.keys.parts import CLIENT_ADDRESS, GATEWAY_ONLY, HOP_BY_HOP, REWRITTEN
from gateway.ops import tracing
from gateway.web.errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable


@dataclass(frozen=True, slots=True)
class UpstreamResponse:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes


def forward_headers(incoming: Mapping[str, str], *, api_key: str, identity: bool) -> CIMultiDict[str]:
    """The client's headers minus hop-by-hop and gateway-only fields; the configured key replaces theirs.

    `identity`: a cacheable request (the request table, gateway.keys.parts): the gateway asks for an unencoded
    answer and leaves out the client address proxies add, so these parts are the same for every caller the answer
    is shared with.
    """
    connection_named = {t.strip().lower() for t in incoming.get("Connection", "").split(",") if t.strip()}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in incoming.items():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in GATEWAY_ONLY or lower in connection_named:
            continue
        if identity and (lower in REWRITTEN or lower in CLIENT_ADDRESS):
            continue
        out.add(name, value)
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    if identity:
        out["Accept-Encoding"] = "identity"
    return out


def relay_headers(upstream: Mapping[str, str]) -> CIMultiDict[str]:
    """Upstream response fields worth relaying to the client (the gateway sets framing and caching itself; the
    backend's revision header is for the gateway, and a hit could not repeat it)."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream.items():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in (
            "date",
            "server",
            "content-type",
            "cache-control",
            "age",
            "etag",
            "expires",
            "set-cookie",
            "x-tokenedge-revision",
        ):
            continue
        out.add(name, value)
    return out


class Upstream:
    def __init__(
        self, config: UpstreamConfig, session: aiohttp.ClientSession, url: str | None = None
    ) -> None:
        """`url`: one backend of `config.targets` (gateway.upstream.routing); by default the first (the only one)."""
        self.config = config
        self._session = session
        self._base = (url or config.primary_url).rstrip("/")
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=config.connect_timeout_s,
            sock_connect=config.connect_timeout_s,
            sock_read=config.read_timeout_s,
        )

    @staticmethod
    def make_session(config: UpstreamConfig) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=config.max_connections, keepalive_timeout=30, ttl_dns_cache=300
        )
        return aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            # One session serves every caller: a cookie an upstream sets for one caller must never ride on the
            # next caller's request (aiohttp's default jar would store and resend it). Clients' own `Cookie`
            # headers are forwarded as sent (scoped, design §2.1).
            cookie_jar=aiohttp.DummyCookieJar(),
            # Transparent: the upstream gets the client's fields, never ones aiohttp would add (`Accept: */*`,
            # a default `Content-Type`); Accept-Encoding is set per request (forward_headers).
            skip_auto_headers=("User-Agent", "Accept", "Content-Type"),
        )

    async def request(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> UpstreamResponse:
        async with self.open_stream(method, path_qs, headers, body) as resp:
            try:
                data = await resp.read()
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise translate(exc) from exc
            tracing.event("first_token")  # a JSON answer arrives whole: its first token with its last
            return UpstreamResponse(resp.status, resp.headers, data)

    @asynccontextmanager
    async def open_stream(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The upstream call, a span of the request's trace when traced (`tracing.span` is a no-op otherwise)."""
        with tracing.span("tokenedge.upstream", {"http.request.method": method, "url.path": path_qs}) as span:
            if span is not None:  # the engine's spans join the trace: its parent is this span
                headers = tracing.inject(headers)
            try:
                resp = await self._session.request(
                    method,
                    self._base + path_qs,
                    headers=headers,
                    data=body,
                    timeout=self._timeout,
                    allow_redirects=False,
                )
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise translate(exc) from exc
            if span is not None:
                span.set_attribute("http.response.status_code", resp.status)
            try:
                yield resp
            finally:
                resp.release()


# A stream's terminal event (`[DONE]`, the usage frame) is followed by the bytes that close its body (the chunked
# terminator), often in a later read. Released before they arrive, a response closes its connection and the next
# miss pays a new one (half of serial misses did, measured against our backend). `finish_body` reads them, within
# these bounds; a body that goes on past its terminal event, or does not end in time, is closed as before.
FINISH_S = 0.1
FINISH_MAX_BYTES = 16 * 1024


async def finish_body(resp: object, timeout_s: float = FINISH_S) -> None:
    """After a stream's terminal event: read what ends its body, so its connection goes back to the pool.

    `resp` is what an `open_stream` yielded: an aiohttp response, or a wrapper over one that has `finish` (the
    pool's `Routed`, the binary transport's `RenderedStream`); anything else (a local answer) has nothing to finish.
    """
    if isinstance(resp, aiohttp.ClientResponse):
        await _drain(resp.content, timeout_s)
        return
    finish = getattr(resp, "finish", None)
    if finish is not None:
        await finish(timeout_s)


async def _drain(content: aiohttp.StreamReader, timeout_s: float) -> None:
    left = FINISH_MAX_BYTES
    try:
        async with asyncio.timeout(timeout_s):
            while not content.at_eof():
                data = await content.readany()
                left -= len(data)
                if not data or left < 0:
                    return
    except (TimeoutError, aiohttp.ClientError):
        return  # closed on release, as any unfinished body


def translate(exc: BaseException) -> UpstreamError:
    """Map aiohttp's exception tree onto ours, once, at the boundary."""
    # Messages reach clients: they name the failure, never an address, port or path (aiohttp's texts do).
    if isinstance(exc, aiohttp.ClientConnectorError):
        errno = getattr(exc.os_error, "errno", None)
        detail = os.strerror(errno).lower() if isinstance(errno, int) and errno > 0 else type(exc).__name__
        return UpstreamUnavailable(f"upstream unavailable: {detail}")
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamTimeout("upstream timed out")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return UpstreamError(f"upstream closed the connection early: {type(exc).__name__}")
    return UpstreamError(f"upstream error: {type(exc).__name__}")
