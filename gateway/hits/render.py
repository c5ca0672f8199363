"""The headers of an answer served from an entry (design §5), as a mapping or as the bytes of a whole hit.

One header block per entry (validators, freshness, tags, the key: what a CDN in front caches and purges by) is
built by `block` and shared by every answer from an entry: a hit on any lane, a stored miss, a stale answer. Only
`Cache-Status`, `Age` and `Date` vary per answer. A hit's whole response is also kept as bytes per entry and
second (`hit_bytes`), so the lanes that can write bytes pay for a dict lookup; those bytes are assembled from the
same block, so a header added to `block` is on every hit, whatever the lane.
"""

from __future__ import annotations

import functools
import time
from email.utils import formatdate
from time import perf_counter
from typing import Any

from aiohttp import HttpVersion11, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import SERVER_SOFTWARE

from cdn.tags import tag_headers
from gateway.hits.headers import CACHE_STATUS, NAME
from gateway.hits.needs import HitState
from gateway.keys.derive import PUBLIC_SCOPE
from gateway.keys.entry import Entry
from gateway.ops.reqrecord import DEBUG_HEADER, finish_request
from gateway.ops.timing import StageTimer, timer_of
from gateway.web import aioseam

Block = dict[str, str]
# The full response of a hot entry for the current second, outside the entry (entries never grow after they are
# stored: their size is charged to L1 once). Bounded in count and in response size: at most 16 MiB.
WIRE_CACHE_ENTRIES = 1024
WIRE_CACHE_MAX_RESPONSE_BYTES = 16 * 1024
# The block's settings on the byte lane: tag targets, the credential `Vary`, `cache.cdn_credential_keyed_edge`.
EdgeSettings = tuple[tuple[str, ...], str, bool]
_WIRES: dict[tuple[str, str, float], tuple[tuple[int, bytes, str, EdgeSettings], bytes, int]] = {}
_date_cache: list[object] = [-1, b""]


def block(
    key: str,
    etag: str,
    ttl_s: int,
    stale_if_error_s: int,
    tags: tuple[str, ...],
    tag_targets: tuple[str, ...],
    credentials: str,
    keyed_edge: bool,
) -> tuple[Block, int]:
    """The per-entry, time-independent headers, and how many tags were dropped to fit CDN header limits.

    `credentials` is the `Vary` of a tenant answer (every header the scope is computed from); `keyed_edge` is
    `cache.cdn_credential_keyed_edge`, the operator's word that every edge keys by those headers."""
    public = key.split(":", 2)[1] == PUBLIC_SCOPE
    edge = f"max-age={ttl_s}"
    if stale_if_error_s:
        edge += f", stale-if-error={stale_if_error_s}"
    headers = {
        "Content-Type": "application/json",
        "ETag": etag,
        # RFC 9111 §5.2.2.10: s-maxage governs shared caches; max-age=0 keeps browsers from reusing it unasked.
        "Cache-Control": f"public, max-age=0, s-maxage={ttl_s}" if public else "private",
        # RFC 9213 §2.1: a CDN obeys CDN-Cache-Control instead of Cache-Control, so a tenant answer says
        # `private` there too unless every edge keys by the credential. Surrogate-Control has no `private`.
        "CDN-Cache-Control": edge if public or keyed_edge else "private",
        "Surrogate-Control": edge if public or keyed_edge else "no-store",
        "X-Cache-Key": key,
        # RFC 9110 §12.5.5: a cache that honours Vary keeps one answer per credential even if its key has none.
        "Vary": "Accept-Encoding" if public else credentials,
    }
    tag_values, truncated = tag_headers(tags, tag_targets)
    headers.update(tag_values)
    return headers, truncated


@functools.lru_cache(maxsize=4096)
def _shared_block(
    key: str,
    etag: str,
    ttl_s: int,
    stale_if_error_s: int,
    tags: tuple[str, ...],
    tag_targets: tuple[str, ...],
    credentials: str,
    keyed_edge: bool,
) -> tuple[Block, int]:
    """`block`, memoized by its inputs (a pure function; callers copy), so an L2 hit (a new Entry object each time)
    reuses it and the entry's L1 size never grows after it is stored."""
    return block(key, etag, ttl_s, stale_if_error_s, tags, tag_targets, credentials, keyed_edge)


# (the tenancy it was made for, the `Vary` of its tenant answers): one tenancy serves a process for its life, so a
# hit pays an identity check, not a join.
_vary_cache: list[object] = [object(), ""]


def credential_vary(state: HitState) -> str:
    """The `Vary` of a tenant answer: every credential header the tenancy names (read from it, so a header it learns
    to count is named here too), and the trusted proxy's tenant header. Headers the scope counts by pattern cannot
    be listed; `CDN-Cache-Control: private` is what keeps an edge from sharing, `Vary` is a second line."""
    tenancy = state.tenancy
    if _vary_cache[0] is not tenancy:
        if tenancy is None:  # no tenancy yet: RFC 9110 §12.5.5, any request field may matter
            _vary_cache[0], _vary_cache[1] = tenancy, "*"
        else:
            tenant = (tenancy.tenant_header.lower(),) if tenancy.tenant_header else ()
            names = dict.fromkeys((*tenancy.credential_headers, *tenant))
            _vary_cache[0], _vary_cache[1] = tenancy, ", ".join(names)
    return _vary_cache[1]  # type: ignore[return-value]


# (the cache section and tenancy it was made for, their EdgeSettings): one tuple per process, reused by every hit.
_edge_cache: list[Any] = [None, None, None]


def edge_settings(state: HitState) -> EdgeSettings:
    """The block's settings for this state's config and tenancy, built once: a hit pays two identity checks."""
    cache, tenancy, memo = state.config.cache, state.tenancy, _edge_cache
    if memo[2] is None or memo[0] is not cache or memo[1] is not tenancy:
        memo[:] = (
            cache,
            tenancy,
            (cache.cdn_tag_headers, credential_vary(state), cache.cdn_credential_keyed_edge),
        )
    settings: EdgeSettings = memo[2]
    return settings


def entry_block(state: HitState, entry: Entry) -> Block:
    """A fresh copy of the entry's block for the configured CDN tag headers; dropped tags are counted."""
    headers, truncated = _shared_block(
        entry.key, entry.etag, entry.ttl_s, entry.stale_if_error_s, entry.tags, *edge_settings(state)
    )
    if truncated:
        state.metrics.tag_truncations.inc(truncated)
    return dict(headers)


def hit_status(entry: Entry, now: float, *, tier: str) -> tuple[str, str]:
    """(Cache-Status, Age) for a fresh hit; RFC 9211 §2.4: ttl is the remaining freshness in seconds."""
    age = int(entry.age_s(now))
    return f"{NAME}; hit; ttl={entry.ttl_s - age}; detail={tier}", str(age)


def entry_headers(
    state: HitState, entry: Entry, cache_status: str, age: str, *, no_store: bool = False
) -> Block:
    """The entry's block with this answer's Cache-Status and Age (a hit, a stale answer, a stored miss)."""
    headers = entry_block(state, entry)
    headers[CACHE_STATUS] = cache_status
    headers["Age"] = age
    if no_store:  # a stale answer must not be cached further downstream, by a CDN either (RFC 9213)
        headers["Cache-Control"] = headers["CDN-Cache-Control"] = headers["Surrogate-Control"] = "no-store"
    return headers


def hit_headers(state: HitState, entry: Entry, now: float, tier: str) -> Block:
    status, age = hit_status(entry, now, tier=tier)
    return entry_headers(state, entry, status, age)


def clear() -> None:
    """Forget every memoized block and response (a test that changes `block` calls it)."""
    _shared_block.cache_clear()
    _constant_head.cache_clear()
    _WIRES.clear()


# The bytes of a whole hit ------------------------------------------------------------------------------------


def http_date(now: float) -> bytes:
    """RFC 9110 §5.6.7 IMF-fixdate, formatted once per second."""
    second = int(now)
    if _date_cache[0] != second:
        _date_cache[0], _date_cache[1] = second, formatdate(second, usegmt=True).encode("ascii")
    return _date_cache[1]  # type: ignore[return-value]


def _safe(value: str) -> bool:
    return "\r" not in value and "\n" not in value


@functools.lru_cache(maxsize=4096)
def _constant_head(
    key: str,
    etag: str,
    ttl_s: int,
    stale_if_error_s: int,
    tags: tuple[str, ...],
    tag_targets: tuple[str, ...],
    credentials: str,
    keyed_edge: bool,
    body_len: int,
) -> tuple[bytes, int] | None:
    """Status line and every header that does not change per answer, encoded; None if one is not transportable."""
    headers, truncated = _shared_block(
        key, etag, ttl_s, stale_if_error_s, tags, tag_targets, credentials, keyed_edge
    )
    if not all(_safe(name) and _safe(value) for name, value in headers.items()):
        return None
    lines = [f"{name}: {value}\r\n" for name, value in headers.items()]
    lines.append(f"Content-Length: {body_len}\r\nServer: {SERVER_SOFTWARE}\r\n")
    return ("HTTP/1.1 200 OK\r\n" + "".join(lines)).encode("utf-8"), truncated


def _varying(entry: Entry, now: float, tier: str, date: bytes) -> bytes:
    status, age = hit_status(entry, now, tier=tier)
    return b"%s: %s\r\nAge: %s\r\nDate: %s\r\n" % (CACHE_STATUS.encode(), status.encode(), age.encode(), date)


def _wire(
    entry: Entry,
    now: float,
    tier: str,
    edge: EdgeSettings,
    *,
    head_only: bool,
    close: bool,
) -> tuple[bytes, int] | None:
    """The whole response for a fresh hit, and how many tags the block dropped; None when it cannot be bytes."""
    date = http_date(time.time())
    stamp = (int(entry.age_s(now)), date, tier, edge)
    plain = not (head_only or close)
    ident = (entry.key, entry.etag, entry.created_at)  # a re-stored entry under the same key is another entry
    if plain:
        cached = _WIRES.get(ident)
        if cached is not None and cached[0] == stamp:
            return cached[1], cached[2]
    const = _constant_head(
        entry.key, entry.etag, entry.ttl_s, entry.stale_if_error_s, entry.tags, *edge, len(entry.body)
    )
    if const is None:
        return None
    head, truncated = const
    if not plain:  # HEAD or `Connection: close`: rare, built each time, never kept
        tail = b"Connection: close\r\n\r\n" if close else b"\r\n"
        return head + _varying(entry, now, tier, date) + tail + (b"" if head_only else entry.body), truncated
    data = b"".join((head, _varying(entry, now, tier, date), b"\r\n", entry.body))
    if len(data) <= WIRE_CACHE_MAX_RESPONSE_BYTES:
        if len(_WIRES) >= WIRE_CACHE_ENTRIES:
            _WIRES.clear()  # bounded: a hot set re-fills it within a second
        _WIRES[ident] = (stamp, data, truncated)
    return data, truncated


def hit_bytes(
    state: HitState, entry: Entry, now: float, tier: str, *, head_only: bool = False, close: bool = False
) -> bytes | None:
    """The whole hit response as bytes, dropped tags counted; None when a header cannot travel as is."""
    memo = _edge_cache  # edge_settings, inlined while it holds: the fast lane's hit pays no extra call
    edge = memo[2] if memo[0] is state.config.cache and memo[1] is state.tenancy else edge_settings(state)
    built = _wire(entry, now, tier, edge, head_only=head_only, close=close)
    if built is None:
        return None
    data, truncated = built
    if truncated:
        state.metrics.tag_truncations.inc(truncated)
    return data


class HitResponse(web.StreamResponse):
    """A 200 whose bytes are already built: `prepare` finishes the request record, `write_eof` writes once.

    Still an aiohttp `StreamResponse`: the server's request loop prepares it, reads its `keep_alive` and logs it like
    any response, so keep-alive and pipelining stay aiohttp's own. Only header assembly and the response-prepare
    signal are skipped; it is used only where the signal has the gateway's own handler alone (`bytes_allowed`), whose
    work (the request record) `prepare` does inline."""

    def __init__(self, state: HitState, data: bytes, timer: StageTimer | None) -> None:
        super().__init__(status=200)
        self._tokenedge = state
        self._data = data
        self._timer = timer

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        writer = aioseam.adopt_prepared(self, request)
        if writer is None or self._timer is None:
            return writer
        timer = self._timer
        timer.status, timer.prepared_at = 200, perf_counter()
        if timer.done:
            finish_request(self._tokenedge, timer)
        return writer

    async def write_eof(self, data: bytes = b"") -> None:
        if aioseam.eof_sent(self):
            return
        # The writer has no buffered headers and is not chunked: this is one transport write of all the bytes.
        await super().write_eof(self._data)


def bytes_allowed(request: web.Request, debug_header: str) -> bool:
    """Whether a hit for `request` may leave as pre-built bytes: HTTP/1.1, the app's response-prepare signal holds
    only the gateway's own handler (any other is honoured by a normal response), no debug header (Server-Timing)."""
    return (
        request.version == HttpVersion11
        and len(request.app.on_response_prepare) == 1
        and debug_header not in request.headers
    )


def json_hit(
    request: web.Request, state: HitState, entry: Entry, now: float, tier: str
) -> web.StreamResponse:
    """The JSON answer of a fresh hit: pre-built bytes where they may be used, else the same headers as a
    `web.Response` (every response-prepare handler runs on it)."""
    if bytes_allowed(request, DEBUG_HEADER):
        data = hit_bytes(
            state, entry, now, tier, head_only=request.method == "HEAD", close=not request.keep_alive
        )
        if data is not None:
            return HitResponse(state, data, timer_of(request))
    return web.Response(body=entry.body, headers=hit_headers(state, entry, now, tier))
