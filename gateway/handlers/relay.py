"""Transparent relay of a request to the upstream, streaming the response body through as it arrives.

Used for bypassed cacheable requests and for the other `/v1/*` routes the gateway knows (`KNOWN_ROUTES`, the
OpenAI API surface) or the operator lists in `upstream.relay_routes`; any other path is a 404 and never reaches the
upstream, so `upstream.api_key` is only ever attached to those routes. The path was checked to be in normal form
before routing (`gateway.web.paths`, the app's path middleware) and is checked again here, at the last step before the
upstream, so no path that leaves `/v1/` is forwarded whatever the caller. Nothing here is cached. An upstream error
before the first byte becomes an OpenAI-style error; after the first byte the status is already sent, so the
connection is closed and the client sees a truncated body, never a fabricated success.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Final

import aiohttp
from aiohttp import web

from gateway.tokens.needs import TokenState
from gateway.upstream.http import forward_headers, relay_headers, translate
from gateway.web.errors import BadRequest, MethodNotAllowed, NotFound
from gateway.web.paths import check_path, origin_path

log = logging.getLogger("tokenedge.relay")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
V1: Final = "/v1/"
# Paths under /v1/ (segments; `*` one segment, a trailing `**` one or more) relayed without configuration.
KNOWN_ROUTES: Final = (
    "models",
    "models/**",
    "chat/completions",
    "chat/completions/**",
    "completions",
    "embeddings",
    "moderations",
    "responses",
    "responses/**",
    "files",
    "files/**",
    "batches",
    "batches/**",
    "uploads",
    "uploads/**",
    "audio/speech",
    "audio/transcriptions",
    "audio/translations",
    "images/generations",
    "images/edits",
    "images/variations",
)

RELAYED_METHODS: Final = (
    "GET",
    "HEAD",
    "POST",
    "PUT",
    "PATCH",
    "DELETE",
    "OPTIONS",
)  # never TRACE, CONNECT, ...


def route_matches(pattern: str, segments: list[str]) -> bool:
    """`*` matches one non-empty segment, a trailing `**` one or more; anything else matches itself."""
    if "" in segments:
        return False  # a trailing slash names no route
    parts = pattern.split("/")
    if parts[-1] == "**":
        head = parts[:-1]
        return len(segments) > len(head) and all(p in ("*", s) for p, s in zip(head, segments, strict=False))
    return len(parts) == len(segments) and all(p in ("*", s) for p, s in zip(parts, segments, strict=True))


def relayable(path: str, extra_routes: Iterable[str] = ()) -> bool:
    """Is this (normal-form, undecoded) path one the gateway relays: a known or operator-listed `/v1/` route?"""
    if not path.startswith(V1) or check_path(path) is not None:
        return False
    segments = path[len(V1) :].split("/")
    return any(route_matches(p, segments) for p in (*KNOWN_ROUTES, *extra_routes))


@web.middleware
async def path_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every request path is checked once, before any handler: not in normal form is a 400, never forwarded."""
    refusal = check_path(origin_path(request.raw_path))
    if refusal is not None:
        where = " (it would leave /v1/)" if refusal.escapes_v1 else ""
        raise BadRequest(refusal.reason + where, code="invalid_path")
    return await handler(request)


def upstream_target(request: web.Request, state: TokenState) -> str:
    """The path and query to send upstream, or an error: never a path outside `/v1/` or an unlisted route."""
    if request.method not in RELAYED_METHODS:
        raise MethodNotAllowed(
            f"{request.method} is not relayed", headers={"Allow": ", ".join(RELAYED_METHODS)}
        )
    path = request.rel_url.raw_path
    refusal = check_path(path)
    if refusal is not None:
        raise BadRequest(refusal.reason, code="invalid_path")
    if not relayable(path, state.config.upstream.relay_routes):
        raise NotFound(f"{request.method} {path} is not a route this gateway relays", code="unknown_route")
    query = request.rel_url.raw_query_string
    return f"{path}?{query}" if query else path


async def passthrough(request: web.Request, state: TokenState) -> web.StreamResponse:
    """Any other `/v1/*` route: relayed untouched when known or listed, never cached."""
    target = upstream_target(request, state)
    body = await request.read() if request.body_exists else None
    fwd = forward_headers(request.headers, api_key=state.config.upstream.api_key, identity=False)
    return await relay(
        request,
        state,
        method=request.method,
        path_qs=target,
        headers=fwd,
        body=body,
        extra_headers={"Cache-Control": "no-store"},
    )


async def relay(
    request: web.Request,
    state: TokenState,
    *,
    method: str,
    path_qs: str,
    headers: Mapping[str, str],
    body: bytes | None,
    extra_headers: Mapping[str, str],
) -> web.StreamResponse:
    if not relayable(path_qs.partition("?")[0], state.config.upstream.relay_routes):
        raise NotFound("not a route this gateway relays", code="unknown_route")  # defence in depth
    async with state.upstream.open_stream(method, path_qs, headers, body) as upstream_resp:
        out_headers = relay_headers(upstream_resp.headers)
        out_headers.update(extra_headers)
        if "Content-Type" in upstream_resp.headers:
            out_headers["Content-Type"] = upstream_resp.headers["Content-Type"]
        if upstream_resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            out_headers["X-Accel-Buffering"] = "no"
            out_headers.setdefault("Cache-Control", "no-cache")
        response = web.StreamResponse(status=upstream_resp.status, headers=out_headers)
        await response.prepare(request)
        try:
            async for chunk in upstream_resp.content.iter_any():
                await response.write(chunk)
        except (TimeoutError, aiohttp.ClientError) as exc:
            if isinstance(exc, ConnectionResetError):
                raise  # the client left (aiohttp's ClientConnectionResetError is both): not an upstream failure
            log.warning(
                "upstream failed mid-body on %s: %s", path_qs.partition("?")[0], translate(exc).message
            )
            if request.transport is not None:
                request.transport.close()
            return response
        await response.write_eof()
        return response
