"""The binary transport client: one miss sent as token ids, its events rendered into the OpenAI response.

`BinaryCall` opens `POST /v1/tokens/generate` through the gateway's one upstream session (so errors are
translated in the usual place) and offers what `gateway.misses.fill` and the stream tee read from an upstream:
`request()` -> a complete JSON `UpstreamResponse`, `open()` -> a response whose `content.iter_any()` yields
SSE bytes. A 409 `tokenizer_mismatch` (the backend's tokenizer changed under us) returns None: the caller
sends the request as JSON instead.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from gateway.keys.policy import wants_usage
from gateway.tokens.render import JSON_CONTENT_TYPE, SSE_HEADERS, Rendering
from gateway.upstream.http import UpstreamResponse, finish_body
from gateway.upstream.routing.attempt import BACKEND_HEADER, ROUTE_HEADER
from gateway.upstream.transport import OpenResponse, UpstreamTransport
from gateway.web.errors import UpstreamError
from tokenedge_wire.framing import REQUEST_TYPE, FrameReader, WireError, encode_request

PATH = "/v1/tokens/generate"
ROUTE_HEADERS = (BACKEND_HEADER, ROUTE_HEADER)
BINARY_ENDPOINTS = {"chat/completions": "chat", "completions": "completion"}
PROMPT_FIELDS = ("messages", "prompt")
# Body fields the backend reads (or ignores) the same way over both transports; anything else goes as JSON.
# Not `logprobs`: the binary frames carry text only, so the backend refuses it there (it honours it over JSON).
BINARY_FIELDS = frozenset(
    {
        "model",
        "messages",
        "prompt",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "n",
        "stream",
        "stream_options",
        "user",
        "metadata",
        "store",
        "service_tier",
    }
)


def _proxy(headers: Mapping[str, str], upstream: Mapping[str, str] | None = None) -> CIMultiDictProxy[str]:
    """`headers`, plus the router's two naming the engine that answered and why (from the binary response, where
    the pool put them), so a miss over the binary transport says where it went as a JSON one does."""
    out = CIMultiDict(headers)
    for name in ROUTE_HEADERS:
        value = upstream.get(name) if upstream is not None else None
        if value is not None:
            out[name] = value
    return CIMultiDictProxy(out)


def request_body(endpoint: str, body: Mapping[str, Any], ids: array[int], tokenizer: str) -> bytes:
    params = {k: v for k, v in body.items() if k not in PROMPT_FIELDS}
    return encode_request(
        {"endpoint": BINARY_ENDPOINTS[endpoint], "tokenizer": tokenizer, "params": params}, ids
    )


def rendering(endpoint: str, body: Mapping[str, Any]) -> Rendering:
    n = body.get("n")
    return Rendering(BINARY_ENDPOINTS[endpoint], n if isinstance(n, int) and n > 0 else 1, wants_usage(body))


def binary_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    out = CIMultiDict(headers)
    out["Content-Type"] = REQUEST_TYPE
    out["Accept-Encoding"] = "identity"
    return out


class RenderedStream:
    """Looks like an aiohttp response to the tee: SSE bytes rendered from the backend's event frames."""

    status = 200

    def __init__(self, upstream: OpenResponse, render: Rendering) -> None:
        self.headers = _proxy(SSE_HEADERS, upstream.headers)
        self._upstream = upstream
        self._render = render
        self.content = self

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_any()])

    async def finish(self, timeout_s: float) -> None:
        await finish_body(self._upstream, timeout_s)

    async def iter_any(self) -> AsyncIterator[bytes]:
        reader, started = FrameReader(), False
        try:
            async for data in self._upstream.content.iter_any():
                for event in reader.feed(data):
                    if "meta" in event:
                        self._render.set_meta(event["meta"])
                        started = True
                        yield b"".join(self._render.stream_start())
                    elif "usage" in event:
                        yield b"".join(self._render.stream_end(event["usage"]))
                        return
                    elif "error" in event:
                        yield self._render.stream_error(event["error"])
                        return
                    elif started:
                        yield b"".join(self._render.stream_event(event))
        except WireError as exc:
            raise UpstreamError(f"bad binary event stream: {exc}") from None


class BinaryCall:
    def __init__(
        self,
        upstream: UpstreamTransport,
        endpoint: str,
        body: Mapping[str, Any],
        ids: array[int],
        tokenizer: str,
    ) -> None:
        self._upstream = upstream
        self._payload = request_body(endpoint, body, ids, tokenizer)
        self._endpoint = endpoint
        self._body = body

    async def request(self, headers: Mapping[str, str]) -> UpstreamResponse | None:
        resp = await self._upstream.request("POST", PATH, binary_headers(headers), self._payload)
        if resp.status == 409:
            return None
        if resp.status != 200:
            return resp
        render = rendering(self._endpoint, self._body)
        try:
            for event in FrameReader().feed(resp.body):
                if "meta" in event:
                    render.set_meta(event["meta"])
                elif "usage" in event:
                    return UpstreamResponse(
                        200,
                        _proxy({"Content-Type": JSON_CONTENT_TYPE}, resp.headers),
                        render.body(event["usage"]),
                    )
                elif "error" in event:
                    error = event["error"]
                    return UpstreamResponse(
                        int(event.get("status", 500)),
                        _proxy({"Content-Type": JSON_CONTENT_TYPE}, resp.headers),
                        _dumps(error),
                    )
                else:
                    render.add(event)
        except WireError as exc:
            raise UpstreamError(f"bad binary event stream: {exc}") from None
        raise UpstreamError("the binary event stream ended before its usage frame")

    @asynccontextmanager
    async def open_stream(self, headers: Mapping[str, str]) -> AsyncIterator[Any]:
        """Yields the rendered SSE response, the backend's own error response, or None (409: use JSON)."""
        async with self._upstream.open_stream("POST", PATH, binary_headers(headers), self._payload) as resp:
            if resp.status == 409:
                yield None
            elif resp.status != 200:
                yield resp
            else:
                yield RenderedStream(resp, rendering(self._endpoint, self._body))


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode()  # the backend's ApiError.response() body (aiohttp json_response)
