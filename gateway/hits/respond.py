"""A fresh hit's answer on the ordinary handler path (the JSON route, the streamed route, the GET alias): the
conditional answer when `If-None-Match` holds the entry's ETag, else the lane's body; counted once either way.
"""

from __future__ import annotations

from aiohttp import web

from gateway.hits import record, render
from gateway.hits.needs import HitState
from gateway.hits.verdict import Condition, condition
from gateway.keys.entry import Entry
from gateway.web.errors import error_body

_PRECONDITION_BODY = error_body(
    "If-None-Match matched: the answer to this request is the one whose ETag you sent",
    type_="invalid_request_error",
    code="precondition_failed",
)


def conditional(
    request: web.Request, state: HitState, entry: Entry, now: float, tier: str
) -> web.Response | None:
    """RFC 9110 §13.1.2 for an entry that answers the request: 304 (GET, HEAD) or 412 (the POST routes) with the
    entry's headers when If-None-Match matches its ETag; None when the request is answered in full."""
    match condition(request.method, request.headers.get("If-None-Match"), entry.etag):
        case Condition.NONE:
            return None
        case Condition.NOT_MODIFIED:
            return web.Response(status=304, headers=render.hit_headers(state, entry, now, tier))
        case Condition.PRECONDITION_FAILED:
            headers = render.hit_headers(state, entry, now, tier)
            headers["Content-Type"] = "application/json"
            return web.Response(status=412, body=_PRECONDITION_BODY, headers=headers)


def json_answer(
    request: web.Request, state: HitState, entry: Entry, now: float, tier: str, prompt: str | None
) -> web.StreamResponse:
    """A fresh hit as JSON (or its conditional answer), recorded as a served hit."""
    record.hit(state, entry, now, prompt)
    return conditional(request, state, entry, now, tier) or render.json_hit(request, state, entry, now, tier)
