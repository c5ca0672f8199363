"""Transparent relay of a request to the upstream, streaming the response body through as it arrives.

Used for bypassed cacheable requests and for every other `/v1/*` path. Nothing here is cached. An upstream error
before the first byte becomes an OpenAI-style error; after the first byte the status is already sent, so the
connection is closed and the client sees a truncated body, never a fabricated success.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import aiohttp
from aiohttp import web

from gateway.state import GatewayState
from gateway.upstream import relay_headers, translate

log = logging.getLogger("tokenedge.relay")


async def relay(request: web.Request, state: GatewayState, *, method: str, path_qs: str,
                headers: Mapping[str, str], body: bytes | None, extra_headers: Mapping[str, str]) -> web.StreamResponse:
    async with state.upstream.open(method, path_qs, headers, body) as upstream_resp:
        out_headers = relay_headers(upstream_resp.headers)
        out_headers.update(extra_headers)
        if "Content-Type" in upstream_resp.headers:
            out_headers["Content-Type"] = upstream_resp.headers["Content-Type"]
        if upstream_resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            out_headers["X-Accel-Buffering"] = "no"
            out_headers.setdefault("Cache-Control", "no-cache")
        response = web.StreamResponse(status=upstream_resp.status, reason=upstream_resp.reason,
                                      headers=out_headers)
        await response.prepare(request)
        try:
            async for chunk in upstream_resp.content.iter_any():
                await response.write(chunk)
        except (TimeoutError, aiohttp.ClientError) as exc:
            log.warning("upstream failed mid-body on %s: %s", path_qs, translate(exc).message)
            if request.transport is not None:
                request.transport.close()
            return response
        await response.write_eof()
        return response
