"""Every private aiohttp name the gateway uses, in one place, each with why (design §1).

aiohttp has no public API for three things the gateway needs: choosing the server's protocol class (the edge's
head deadlines and connection cap, `gateway.edge.server`), answering a request before the router (the fast lane,
`gateway.edge.fastlane`), and writing a pre-built response (`hits.render.HitResponse`). Each use is a small function
here; `tests/gateway/test_aioseam.py` checks that every name exists and behaves on the installed aiohttp, so an
upgrade that moves one fails that test with the name, not connections in production. `pyproject.toml` declares the
aiohttp range these are tested on.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.web_protocol import RequestHandler

# The private names, for the seam test and for a reader: (owner, name, why).
USES: tuple[tuple[str, str, str], ...] = (
    (
        "web.BaseRequest",
        "_read_bytes",
        "the body already read (fast lane, edge deadlines): request.read() returns it",
    ),
    ("web.BaseRequest", "_payload_writer", "the connection's writer a pre-built hit writes its bytes to"),
    ("web.StreamResponse", "_payload_writer", "a pre-built hit is prepared without writing headers"),
    ("web.StreamResponse", "_eof_sent", "a pre-built hit is written once"),
    ("web.StreamResponse", "_req", "the request a pre-built hit answers (aiohttp's access log reads it)"),
    ("web.StreamResponse", "_keep_alive", "keep-alive of a pre-built hit follows the request's"),
    ("web.StreamResponse", "_must_be_empty_body", "a HEAD hit sends no body"),
    ("web.Application", "_client_max_size", "the body limit aiohttp's request.read() enforces itself"),
    ("web.AppRunner", "_make_server", "the only seam that chooses the server (and so the protocol class)"),
    (
        "web.Server",
        "_kwargs",
        "the protocol options aiohttp's runner chose, passed on to the edge's protocol",
    ),
    ("web.Server", "_loop", "the loop the edge's protocols and sweeper run on"),
    ("RequestHandler", "_loop", "the edge's deadlines read the loop's clock"),
    (
        "RequestHandler",
        "_current_request",
        "a pipelined head's deadline starts when the current request's body ends",
    ),
    (
        "RequestHandler",
        "_lingering_time",
        "a connection closed for a slow body does not linger for more of it",
    ),
    (
        "RequestHandler",
        "_keepalive",
        "an answer from the fast lane keeps the connection alive, as aiohttp's do",
    ),
    ("RequestHandler", "_keepalive_timeout", "... for aiohttp's own keep-alive timeout"),
    ("RequestHandler", "_next_keepalive_close_time", "... counted from the lane's last answer"),
    ("RequestHandler", "_keepalive_handle", "... with aiohttp's own timer"),
    ("RequestHandler", "_process_keepalive", "... which closes the connection once idle that long"),
)


def set_body(request: web.BaseRequest, raw: bytes) -> None:
    request._read_bytes = raw


def body_read(request: web.BaseRequest) -> bytes | None:
    return request._read_bytes


def client_max_size(app: web.Application) -> int:
    return app._client_max_size


def adopt_prepared(response: web.StreamResponse, request: web.BaseRequest) -> AbstractStreamWriter | None:
    """`StreamResponse.prepare` without building or writing headers (the response's bytes carry them)."""
    if response._eof_sent:
        return None
    if response._payload_writer is not None:
        return response._payload_writer
    response._req = request
    response._keep_alive = request.keep_alive
    response._must_be_empty_body = request.method == "HEAD"
    response._payload_writer = request._payload_writer
    return response._payload_writer


def eof_sent(response: web.StreamResponse) -> bool:
    return response._eof_sent


def server_kwargs(server: web.Server) -> dict[str, Any]:
    return dict(server._kwargs)


def server_loop(server: web.Server) -> Any:
    return server._loop


def handler_loop(handler: RequestHandler) -> Any:
    return handler._loop


def current_request(handler: RequestHandler) -> web.BaseRequest | None:
    return handler._current_request


def no_lingering(handler: RequestHandler) -> None:
    handler._lingering_time = 0.0


def keep_alive_after_answer(handler: RequestHandler, now: float) -> None:
    """What aiohttp's request loop does after each answer, for an answer it never saw: the connection stays alive
    for its keep-alive timeout from now (aiohttp closes it when idle that long)."""
    handler._keepalive = True
    timeout = handler._keepalive_timeout
    if not timeout:
        return
    close_at = handler._next_keepalive_close_time = now + timeout
    if handler._keepalive_handle is None:
        handler._keepalive_handle = handler._loop.call_at(close_at, handler._process_keepalive)


class ServerRunner(web.AppRunner):
    """`web.AppRunner` whose server a subclass chooses (`serve_with`), from the one aiohttp builds: aiohttp starts
    and freezes the app as it always does, then the subclass wraps that server's handler and options."""

    async def _make_server(self) -> web.Server:
        return await self.serve_with(await super()._make_server())

    async def serve_with(self, plain: web.Server) -> web.Server:
        return plain
