"""After the upstream answered: the rules the JSON fill (`gateway.misses.fill`) and the stream tee (`gateway.misses.streaming`) share.

One place for what both paths must agree on: the miss they send (`FillRequest`), the entry a complete answer
becomes (`make_entry`), when an answer names a newer model revision (`revision_moved`), what to do with the
upstream's answer (`after_upstream`, a pure decision: serve it, serve a stale entry instead, or ask again), and the
headers of an answer served from an entry (hit, stale, stored miss; design §5). The drivers only do the I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from aiohttp import web

from gateway.hits import headers as hdr
from gateway.hits.render import entry_headers
from gateway.keys.derive import CacheKey, entry_tags
from gateway.keys.entry import Entry, make_etag
from gateway.keys.policy import CREDENTIAL_REFUSALS, Outcome, Reason, Result
from gateway.misses.needs import MissState
from gateway.upstream.catalog import REVISION_HEADER
from gateway.upstream.http import relay_headers
from gateway.upstream.transport import UpstreamTransport


@dataclass(frozen=True, slots=True)
class FillRequest:
    """What a miss sends upstream (the client's own bytes and headers) and the key its answer is stored under."""

    endpoint: str
    key: CacheKey
    model: str
    revision: str
    ttl_s: int
    path_qs: str
    headers: Mapping[str, str]
    body: bytes
    via: UpstreamTransport | None = (
        None  # a per-request seam (gateway.tokens: budgets, binary transport); None: plain
    )
    level: str = ""  # the canonicalization level of the key (Cache-Status detail on misses)
    lacked: str = ""  # why the entry found could not answer this request (`policy.lacks`), if one was found

    @property
    def miss_detail(self) -> str:
        """The Cache-Status detail words of this miss: why the entry found did not answer it, then the level."""
        return ".".join(word for word in (self.lacked, self.level) if word)


class Answered(NamedTuple):
    """A cacheable request's response and its metric labels (`tokenedge_requests_total{result,reason}`)."""

    response: web.StreamResponse
    result: Result
    reason: str  # a Reason, an Outcome, a tier name (hits) or an upstream error code (stale answers)


# The decision -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Serve:
    """Serve the upstream's own answer; a failure before any answer propagates as its error (the middleware's JSON)."""

    result: Result  # MISS for the flight's leader, COALESCED for a follower


@dataclass(frozen=True, slots=True)
class ServeStale:
    """RFC 5861 §4 stale-if-error: the upstream failed (refused, timed out, 5xx) and a stale entry is at hand."""

    detail: str  # Cache-Status `detail=stale-if-error-{detail}`: the upstream error code, or `status-NNN`
    reason: str  # the metrics reason: the upstream error code, or `status` for a 5xx answer


@dataclass(frozen=True, slots=True)
class AskAgain:
    """A follower on a public route got the leader's credential refusal (401/403/429): the follower may be another
    tenant, so it asks the upstream again with its own credentials, as a leader."""


Decision = Serve | ServeStale | AskAgain


def after_upstream(
    status: int | None, *, leader: bool, public_scope: bool, has_stale: bool, error_code: str = ""
) -> Decision:
    """What to do with the upstream's answer (`status`), or with its failure before any answer (`status` None,
    `error_code` says how: refused, timeout, ...). Pure: the JSON and stream drivers act on the result."""
    if status is None:
        code = error_code or "error"
        return ServeStale(code, code) if has_stale else Serve(Result.MISS if leader else Result.COALESCED)
    if not leader and public_scope and status in CREDENTIAL_REFUSALS:
        return AskAgain()
    if status >= 500 and has_stale:
        return ServeStale(f"status-{status}", Reason.STATUS)
    return Serve(Result.MISS if leader else Result.COALESCED)


def miss_reason(entry: Entry | None, refusal: Reason | None) -> str:
    """The metrics reason of a served miss: stored, or why not."""
    if entry is not None:
        return Outcome.STORED
    return refusal if refusal is not None else Outcome.NOT_STORED


# The entry ---------------------------------------------------------------------------------------------------


def revision_moved(state: MissState, req: FillRequest, headers: Mapping[str, str]) -> bool:
    """True when the upstream says it answered with another revision than the key's: the catalog learns it at
    once (and tells every process), and the answer is not stored under the old revision's key."""
    revision = headers.get(REVISION_HEADER)
    if not revision or revision == req.revision:
        return False
    state.catalog.learn(req.model, revision)
    return True


def make_entry(
    state: MissState,
    req: FillRequest,
    body: bytes,
    usage: Mapping[str, Any] | None,
    stream_chunks: tuple[bytes, ...] | None = None,
    *,
    stream_only: bool = False,
) -> Entry:
    """The entry a complete answer becomes (design §3): created now, the route's TTL, tagged for purges. A
    `stream_only` entry has no JSON body: its ETag hashes the chunks, which are then the representation."""
    key = req.key
    return Entry(
        key=key.key,
        endpoint=req.endpoint,
        body=body,
        model=req.model,
        revision=req.revision,
        created_at=state.clock(),
        ttl_s=req.ttl_s,
        stale_if_error_s=state.config.cache.stale_if_error_s,
        etag=make_etag(b"\n".join(stream_chunks or ()) if stream_only else body),
        tags=entry_tags(model=req.model, revision=req.revision, scope=key.scope, digest=key.digest),
        usage=usage,
        stream_chunks=stream_chunks,
        stream_only=stream_only,
    )


# The headers of an answer served from an entry (design §5) -------------------------------------------------


def stale_headers(state: MissState, entry: Entry, detail: str) -> dict[str, str]:
    status, age = hdr.stale_status(entry, state.clock(), detail)
    return entry_headers(state, entry, status, age, no_store=True)


def entry_response(
    state: MissState, entry: Entry, cache_status: str, age: str, status: int = 200
) -> web.Response:
    """The entry's JSON body with its headers (a hit, a conditional 304, a stored miss)."""
    return web.Response(
        status=status, body=entry.body, headers=entry_headers(state, entry, cache_status, age)
    )


def stored_miss_response(
    state: MissState,
    entry: Entry,
    upstream_headers: Mapping[str, str],
    *,
    collapsed: bool,
    level: str,
) -> web.Response:
    """A JSON miss that was stored: the entry's headers (as its later hits), then the leader's upstream's own. A
    follower (`collapsed`) gets exactly the entry's headers, as a hit would: the upstream's belong to the leader."""
    status = hdr.miss_status(stored=True, collapsed=collapsed, level=level)
    response = entry_response(state, entry, status, "0")
    if not collapsed:
        for name, value in relay_headers(upstream_headers).items():
            response.headers.setdefault(name, value)
    return response
