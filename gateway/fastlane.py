"""The fast lane: a known request's fresh L1 hit is served before aiohttp's router and the middleware chain.

The cacheable routes are three exact paths, so a `POST` whose raw path (query included) is one of them, whose body
is already fully buffered, and whose bytes the request memo knows, can try `fastpath.try_hit` at once: no
router resolve, no error/path/edge middleware, no body read under deadlines (nothing waits: the parser has
already seen the body's end). Everything the skipped layers would have done for such a request is done here:
the path is in normal form by construction (`check_path` of an exact route is None), the head deadline is marked
over, `Content-Type` is checked, and the request is tallied, lapped and access-logged exactly as the handler does
it. Any other request, and any fast attempt that does not end in a hit (nothing counted), continues down the
normal path with the body handed over (`request._read_bytes`, which `request.read()` and the edge honour).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Protocol, cast

from aiohttp import web
from aiohttp.web_urldispatcher import UrlMappingMatchInfo

from gateway import fastpath
from gateway.errors import GatewayError
from gateway.handlers.ops import handler_done
from gateway.lookup import PRE_READ
from gateway.memo import MAX_MEMO_BODY_BYTES
from gateway.state import STATE, GatewayState
from gateway.timing import TIMER, StageTimer, start_timer
from gateway.wireconn import WireConnection
from gateway.wirelane import WireLane

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HeadMarks(Protocol):
    """`edge.EdgeRequestHandler`'s request marks (named structurally: gateway.edge imports this module)."""

    def request_started(self) -> None: ...

    def request_finished(self) -> None: ...


# The cacheable routes as `gateway.app` registers them: raw path -> endpoint.
ROUTES = {f"/v1/{endpoint}": endpoint for endpoint in ("chat/completions", "completions", "embeddings")}
JSON_TYPES = frozenset({"application/json"})


def _json_body(request: web.Request) -> bool:
    """The request declares a JSON body (or none), as `validate.check_content_type` accepts."""
    declared = request.headers.get("Content-Type")
    if declared is None or declared == "application/json":  # the common case, without parsing parameters
        return True
    ctype = request.content_type
    return ctype in JSON_TYPES or ctype.endswith("+json")


def buffered_body(request: web.Request, limit: int) -> bytes | None:
    """The whole body when the parser has already received all of it (Content-Length within `limit`), else None.

    Nothing is consumed unless it is returned; what is returned stays the request's body (`request.read()`)."""
    declared = request.content_length
    if declared is None or declared == 0 or declared > limit:
        return None
    content = request.content
    if not content.is_eof() or content.exception() is not None:
        return None
    raw = content.read_nowait()
    request._read_bytes = raw
    return raw


def _handed_over(request: web.Request) -> bool:
    """The wire lane read the tiers for this request and did not serve it: the normal path goes on with that read
    and its timer (`WireConnection.handover`), so nothing is read or counted twice."""
    protocol = request.protocol
    if not isinstance(protocol, WireConnection):
        return False
    handover = protocol.handover
    if handover is None or handover[0] is not request._message:
        return False
    protocol.handover = None
    _, key, found, timer = handover
    request[TIMER] = timer
    request[PRE_READ] = (key, found)
    return True


class FastLane:
    """The low-level handler the edge serves: the fast lane, else `app._handle` (router, middleware, handler)."""

    def __init__(self, app: web.Application, wire: WireLane | None = None) -> None:
        self._app = app
        self._wire = wire  # learns the bytes of the L1 hits served here (gateway.wirelane)
        self._handle: Handler = app._handle
        self._matches: dict[str, UrlMappingMatchInfo] = {}

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        endpoint = ROUTES.get(request.raw_path)
        if endpoint is None or request.method != "POST":
            return await self._handle(request)
        match = self._matches.get(request.raw_path)
        if match is None:
            match = await self._resolve(request)
            if match is None:
                return await self._handle(request)
        request._match_info = match  # `request.app` and `match_info`, as the router would set them
        response = await self.serve(request, endpoint)
        return response if response is not None else await self._handle(request)

    async def _resolve(self, request: web.Request) -> UrlMappingMatchInfo | None:
        """The route's match info, resolved once and shared (frozen: no request can change it)."""
        match = await self._app.router.resolve(request)
        if not isinstance(match, UrlMappingMatchInfo) or match.http_exception is not None:
            return None
        match.add_app(self._app)
        match.freeze()
        self._matches[request.raw_path] = match
        return match

    async def serve(self, request: web.Request, endpoint: str) -> web.StreamResponse | None:
        """A fresh hit (L1, else L2) written by `fastpath`, tallied as `completions.make_handler` tallies it; else
        None, with the body (and any tier read made) handed to the normal path."""
        state = self._app[STATE]
        if _handed_over(request):
            return None
        if not _json_body(request):
            return None
        raw = buffered_body(request, min(MAX_MEMO_BODY_BYTES, state.config.server.max_body_bytes))
        if raw is None:
            return None
        marks = cast(HeadMarks, request.protocol) if hasattr(request.protocol, "request_finished") else None
        if marks is not None:  # the head is in: its deadline ends (`edge.edge_middleware` marks it too)
            marks.request_started()
        timer = start_timer(request, endpoint)  # the handler goes on with it if this lane does not serve
        try:
            known = fastpath.known_key(request, state, endpoint, raw)
        except GatewayError:  # e.g. a refused credential: the normal path answers it as JSON
            return None
        if known is None:
            return None
        try:
            response, tier = fastpath.l1_hit(request, state, known, timer), "l1"
            if response is None and state.cache.l2 is not None:
                response, tier = await self._shared_hit(request, state, endpoint, known, timer)
        except BaseException:  # a client gone during the L2 read (counted there): the request ends here
            if marks is not None:
                marks.request_finished()
            raise
        if response is not None:  # else the middleware marks the end, on the normal path
            if marks is not None:
                marks.request_finished()
            if self._wire is not None:
                self._wire.learn(request, endpoint, raw, known)
            handler_done(state, timer, endpoint, "hit", tier)
        return response

    async def _shared_hit(
        self,
        request: web.Request,
        state: GatewayState,
        endpoint: str,
        known: fastpath.Known,
        timer: StageTimer,
    ) -> tuple[fastpath.HitResponse | None, str]:
        """The tiered read (L1 miss counted, L2, back-fill) for a known key: a fresh entry is served fast; anything
        else is handed to the normal path as it was read (`lookup.PRE_READ`), never read twice."""
        key = known[1]
        keyed = perf_counter()
        try:
            found = await state.cache.get(key)
        except (ConnectionResetError, asyncio.CancelledError):
            handler_done(
                state, timer, endpoint, "client_gone", "client_gone"
            )  # as the handler counts a client gone
            raise
        except Exception:  # a gateway bug: counted as the handler counts it, answered by the edge as JSON 500
            handler_done(state, timer, endpoint, "error", "error")
            raise
        now = state.clock()  # after the (remote) read: the age is the entry's age as served
        if found is not None and fastpath.is_fresh(found.entry, now):
            response = fastpath.serve_hit(request, state, known, found.entry, now, found.tier, timer, keyed)
            if response is not None:
                return response, found.tier
        request[PRE_READ] = (key, found)
        timer.lap_to("l2", perf_counter())
        return None, "l2"
