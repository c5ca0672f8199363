"""The fast lane: a known request's fresh hit is answered before aiohttp's router and the middleware chain.

The one lane beside the ordinary handler path. It runs inside aiohttp's own request loop (the server parsed the
request and answers it in order, under the edge's head deadline and connection cap), for a `POST` to a cacheable
route whose body is already fully buffered (so no body deadline can be skipped: a body still arriving takes the
ordinary path and its deadlines). It keys on what matters, never on raw request bytes:

- the route (method and raw path), the body bytes (the request memo knows their canonical key), the request's own
  credential headers (its scope: `hits.scope`, computed now, from this request), the model's current revision;
- any conditional, cache-directive or debug header sends the request the ordinary way; every other header (an
  ingress's `X-Request-Id`, `traceparent`, `X-Varnish`, `CF-Ray`) changes nothing.

The key is bound before any await, so a read from a shared tier can never be answered for another caller's key.
The hit core decides (`hits.verdict`), renders (`hits.render`) and counts (`hits.record`) exactly as on the
ordinary path. Anything else (a miss, a stale entry, a refused credential, an unknown body) continues down the
ordinary path with the body and any tier read handed over (nothing is read or counted twice).

The lane is off when the app has a middleware of its own beyond the gateway's (it would be skipped here): then
every request takes the router and the middleware chain (`edge.EdgeRunner` decides at start-up and logs it).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Protocol

from aiohttp import web
from aiohttp.web_urldispatcher import UrlMappingMatchInfo

from gateway import aioseam
from gateway.cache_control import RequestDirectives
from gateway.config import CACHEABLE_ENDPOINTS
from gateway.dashboard.hotkeys import prompt_text
from gateway.errors import GatewayError
from gateway.hits import record, render
from gateway.hits.scope import Credentials, key_scope_of_raw
from gateway.hits.verdict import Verdict, judge
from gateway.lookup import PRE_READ
from gateway.memo import MAX_MEMO_BODY_BYTES, ParsedRequest
from gateway.policy import Lookup, decide
from gateway.reqrecord import DEBUG_HEADER, handler_done
from gateway.state import STATE, GatewayState
from gateway.timing import StageTimer, start_timer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ROUTES = {f"/v1/{endpoint}": endpoint for endpoint in CACHEABLE_ENDPOINTS}  # raw path -> endpoint
JSON_TYPES = frozenset({"application/json"})
NO_DIRECTIVES = RequestDirectives()
# Request headers that send a request the ordinary way: conditionals (RFC 9110 §13), cache directives (the policy
# reads them), the admin debug header (Server-Timing), and body framing a plain request does not have.
SLOW_HEADERS = frozenset(
    name.lower().encode("ascii")
    for name in (
        "If-None-Match",
        "If-Modified-Since",
        "If-Match",
        "If-Unmodified-Since",
        "If-Range",
        "Range",
        "Cache-Control",
        "Pragma",
        DEBUG_HEADER,
        "Expect",
    )
)


class HeadMarks(Protocol):
    """`edge.EdgeRequestHandler`'s request marks (named structurally: gateway.edge imports this module)."""

    def request_started(self) -> None: ...

    def request_finished(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Known:
    """A memoized request's key for this caller, bound before any await (nothing later reads the memo's record)."""

    parsed: ParsedRequest
    key: str
    revision: str


@functools.lru_cache(maxsize=16)
def header_kinds(credential_names: tuple[str, ...]) -> dict[bytes, bool]:
    """Lower-case raw name -> True (a slow header) or False (a credential header), one dict probe a header."""
    kinds = {name.lower().encode("ascii"): False for name in credential_names}
    kinds.update({name: True for name in SLOW_HEADERS})
    return kinds


def scan(request: web.Request, kinds: dict[bytes, bool]) -> Credentials | None:
    """One pass over the raw headers: None when a slow header sends the request the ordinary way, else the
    (lower-case name, raw value) of each credential header, in request order."""
    found: list[tuple[bytes, bytes]] = []
    for name, value in request.raw_headers:
        kind = kinds.get(name.lower())
        if kind is not None:
            if kind:
                return None
            found.append((name.lower(), value))
    return tuple(found)


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
    aioseam.set_body(request, raw)
    return raw


def _lookup(parsed: ParsedRequest, state: GatewayState, endpoint: str) -> Lookup | None:
    """The policy's decision for these bytes without request directives, decided once per memoized request."""
    fast = parsed.fast
    if fast is None:
        decision = decide(endpoint, parsed.body, NO_DIRECTIVES, state.policies[endpoint])
        usable = isinstance(decision, Lookup) and decision.read and parsed.body.get("stream") is not True
        fast = parsed.fast = decision if usable else False
    return fast if isinstance(fast, Lookup) else None


def keyed(state: GatewayState, endpoint: str, raw: bytes, scope: str) -> Known | None:
    """The key the ordinary path last derived for these body bytes, when it was for this caller (`scope`) and the
    model's current revision; else None (the ordinary path derives it)."""
    parsed = state.memo.get(endpoint, raw)
    if parsed is None or _lookup(parsed, state, endpoint) is None:
        return None
    revision = state.catalog.fresh_revision(parsed.body["model"])
    if revision is None:
        return None
    key, context = parsed.key, parsed.key_context
    if key is None or context is None or context[1] != revision or context[0] != scope:
        return None
    return Known(parsed, key.key, revision)


class FastLane:
    """The low-level handler the edge serves: the fast lane, else the app's own handler (router, middleware)."""

    def __init__(self, app: web.Application, handle: Handler, *, enabled: bool = True) -> None:
        self._app = app
        self._enabled = enabled
        self._handle = handle  # the app's own handler, as aiohttp's server would call it
        self._matches: dict[str, UrlMappingMatchInfo] = {}

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        endpoint = ROUTES.get(request.raw_path) if self._enabled else None
        if endpoint is None or request.method != "POST":
            return await self._handle(request)
        match = self._matches.get(request.raw_path)
        if match is None:
            match = await self._resolve(request)
            if match is None:
                return await self._handle(request)
        aioseam.set_match_info(request, match)  # `request.app` and `match_info`, as the router would set them
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
        """A fresh hit (L1, else L2), rendered and counted by the hit core; else None, with the body (and any
        tier read made) handed to the ordinary path."""
        state = self._app[STATE]
        tenancy = state.tenancy
        if tenancy is None or not _json_body(request):
            return None
        raw = buffered_body(request, min(MAX_MEMO_BODY_BYTES, state.config.server.max_body_bytes))
        if raw is None:
            return None
        credentials = scan(request, header_kinds(tenancy.credential_headers))
        if credentials is None:
            return None
        protocol = request.protocol
        marks: HeadMarks | None = protocol if hasattr(protocol, "request_finished") else None  # type: ignore[assignment]
        if marks is not None:  # the head is in: its deadline ends (`edge.edge_middleware` marks it too)
            marks.request_started()
        timer = start_timer(request, endpoint)  # the handler goes on with it if this lane does not serve
        try:
            known = keyed(state, endpoint, raw, key_scope_of_raw(request, state, endpoint, credentials))
        except GatewayError:  # e.g. a refused credential: the ordinary path answers it as JSON
            return None
        if known is None:
            return None
        try:
            response, tier = await self._hit(request, state, endpoint, known, timer)
        except BaseException:  # a client gone during the L2 read (counted there): the request ends here
            if marks is not None:
                marks.request_finished()
            raise
        if response is not None:  # else the middleware marks the end, on the ordinary path
            if marks is not None:
                marks.request_finished()
            handler_done(state, timer, endpoint, "hit", tier)
        return response

    async def _hit(
        self, request: web.Request, state: GatewayState, endpoint: str, known: Known, timer: StageTimer
    ) -> tuple[web.StreamResponse | None, str]:
        """The tiered read for the bound key: a fresh entry is served and counted; anything else is handed to the
        ordinary path as it was read (`lookup.PRE_READ`), never read twice."""
        key = known.key
        keyed_at = perf_counter()
        try:
            found = await state.cache.get(key)
        except (ConnectionResetError, asyncio.CancelledError):
            handler_done(state, timer, endpoint, "client_gone", "client_gone")
            raise
        except Exception:  # a gateway bug: counted as the handler counts it, answered by the edge as JSON 500
            handler_done(state, timer, endpoint, "error", "error")
            raise
        now = state.clock()  # after the (remote) read: the age is the entry's age as served
        if found is None or judge(found.entry, now, NO_DIRECTIVES, known.revision) is not Verdict.HIT:
            request[PRE_READ] = (key, found)
            timer.lap_to("l2" if state.cache.l2 is not None else "l1", perf_counter())
            return None, ""
        entry = found.entry
        looked_up = perf_counter()
        response = render.json_hit(request, state, entry, now, found.tier)
        prompt = (prompt_text(known.parsed.body) or "") if state.config.dashboard.show_prompts else None
        record.hit(state, entry, key, now, prompt)
        timer.key = key
        timer.lap_to("parse", keyed_at)
        timer.lap_to(found.tier, looked_up)
        timer.lap("serialize")
        return response, found.tier
