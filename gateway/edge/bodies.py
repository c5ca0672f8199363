"""Request bodies under deadlines: the app's `edge_middleware` reads the whole body before any handler runs.

aiohttp has no deadline for a body: a client that sends a Content-Length and then too few bytes holds its
connection (and a handler) for as long as it likes. Here each read must come within `server.body_read_timeout_s`
and all of it within `server.body_total_s` (and within `max_body_bytes`); a slow body is answered 408, the
connection is closed without lingering, and the close is counted in `tokenedge_slow_clients_total{phase="body"}`.
The head's deadline is the edge's (`gateway.edge.server`); the middleware marks where it ends.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from gateway.edge.needs import EDGE_STATE
from gateway.edge.server import EdgeRequestHandler
from gateway.web import aioseam
from gateway.web.errors import BadRequest, GatewayError, PayloadTooLarge

log = logging.getLogger("tokenedge.edge")


class SlowClient(GatewayError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


@web.middleware
async def edge_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Marks the head as received (no more head deadline), then reads the body under its deadlines."""
    protocol = request.protocol
    edge = protocol if isinstance(protocol, EdgeRequestHandler) else None
    if edge is not None:
        edge.request_started()
    try:
        if request.body_exists:
            try:
                await read_body_within_deadlines(request)
            except RequestPayloadError:  # a body its Content-Encoding does not decode (aiohttp decodes it)
                encoding = request.headers.get("Content-Encoding", "")
                raise BadRequest(
                    f"the request body could not be decoded as Content-Encoding {encoding!r}",
                    code="invalid_body_encoding",
                ) from None
            except SlowClient as exc:
                if edge is not None:
                    edge.drop_after_response()
                response = exc.to_response()
                response.force_close()
                return response
        return await handler(request)
    finally:
        if edge is not None:
            edge.request_finished()


async def read_body_within_deadlines(request: web.Request) -> None:
    """Read the whole body now; `request.read()` then returns it (aiohttp caches a read body in `_read_bytes`)."""
    if aioseam.body_read(request) is not None:
        return  # the fast lane already took the whole, buffered body (gateway.edge.fastlane)
    state = request.app[EDGE_STATE]
    server = state.config.server
    declared = request.content_length
    if declared is not None and declared > server.max_body_bytes:
        raise PayloadTooLarge(
            f"request body of {declared} bytes exceeds the limit of {server.max_body_bytes} bytes"
        )
    content = request.content
    if content.is_eof() and content.exception() is None:  # all of it is buffered already: no read can stall
        body = content.read_nowait()
        if len(body) > server.max_body_bytes:
            raise PayloadTooLarge(f"request body exceeds the limit of {server.max_body_bytes} bytes")
        aioseam.set_body(request, body)
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + server.body_total_s
    chunks: list[bytes] = []
    size = 0
    while True:
        wait_s = min(server.body_read_timeout_s, deadline - loop.time())
        try:
            if wait_s <= 0:
                raise TimeoutError
            async with asyncio.timeout(wait_s):
                chunk = await request.content.readany()
        except TimeoutError:
            state.metrics.slow_clients.labels("body").inc()
            log.debug("closed a connection whose request body was too slow")
            raise SlowClient("the request body was not received in time") from None
        if not chunk:
            break
        size += len(chunk)
        if size > server.max_body_bytes:
            raise PayloadTooLarge(f"request body exceeds the limit of {server.max_body_bytes} bytes")
        chunks.append(chunk)
    aioseam.set_body(request, b"".join(chunks))
