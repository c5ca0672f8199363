"""The hit fast path: a fresh cache hit leaves as one pre-serialized write, below aiohttp's Response layer.

A hit's headers are the entry's constant CDN-contract block (DESIGN §5) plus `Date`, `Age` and the `Cache-Status`
ttl, which change at most once a second. So the status line, the block, `Content-Length` and `Server` are encoded
once per entry; the whole response (head and body) is assembled once per entry and second; a request pays for a
dict lookup and one transport write. `HitResponse` is still an aiohttp `StreamResponse`: the server's
request loop prepares it, reads its `keep_alive` and logs it exactly as any response, so keep-alive and pipelining
state stay aiohttp's own. Only the response-prepare signal and header assembly are skipped; the one signal
handler the app installs (`ops.on_response_prepare`) is replayed inline, so metrics and the access log stay exact.

Everything the fast path does not cover keeps the normal path: HTTP/1.0, conditional requests, admin debug
requests (Server-Timing), header values a transport must not carry, and apps with extra prepare-signal handlers.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from email.utils import formatdate
from time import perf_counter

from aiohttp import HttpVersion11, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import SERVER_SOFTWARE

from gateway import headers as hdr
from gateway.cache_control import RequestDirectives
from gateway.dashboard.hotkeys import prompt_text
from gateway.entry import Entry
from gateway.handlers.ops import DEBUG_HEADER, finish_request
from gateway.handlers.tenancy import scope_of
from gateway.keys import PUBLIC_SCOPE
from gateway.memo import ParsedRequest
from gateway.policy import USAGE_ENDPOINTS, Freshness, Lookup, decide, freshness, lacks
from gateway.state import GatewayState
from gateway.timing import StageTimer, timer_of
from gateway.warm import count_hit

# Request headers the fast path leaves to the normal one: conditionals (RFC 9110 §13), cache directives (the policy
# reads them), the admin debug header (Server-Timing), and body framing it does not expect on a plain request.
_SLOW_HEADERS = frozenset(
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
NO_DIRECTIVES = RequestDirectives()
# The full response of a hot entry for the current second, outside the entry (entries never grow after they are
# stored: their size is charged to L1 once). Bounded in count and in response size: at most 16 MiB.
WIRE_CACHE_ENTRIES = 1024
WIRE_CACHE_MAX_RESPONSE_BYTES = 16 * 1024
_WIRES: dict[tuple[str, str, float], tuple[tuple[int, bytes, str, tuple[str, ...]], bytes, int]] = {}
_date_cache: list[object] = [-1, b""]


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
    body_len: int,
) -> tuple[bytes, int] | None:
    """Status line and every header that does not change per request, encoded; None if one is not transportable.

    Memoized by its inputs (like `headers._header_block`), so an L2 hit, a new Entry object each time, reuses it.
    """
    headers, truncated = hdr.header_block(key, etag, ttl_s, stale_if_error_s, tags, tag_targets)
    if not all(_safe(name) and _safe(value) for name, value in headers.items()):
        return None
    lines = [f"{name}: {value}\r\n" for name, value in headers.items()]
    lines.append(f"Content-Length: {body_len}\r\nServer: {SERVER_SOFTWARE}\r\n")
    return ("HTTP/1.1 200 OK\r\n" + "".join(lines)).encode("utf-8"), truncated


def _varying(entry: Entry, now: float, tier: str, date: bytes) -> bytes:
    status, age = hdr.hit_status(entry, now, tier=tier)
    return b"Cache-Status: %s\r\nAge: %s\r\nDate: %s\r\n" % (status.encode(), age.encode(), date)


def wire(
    entry: Entry,
    now: float,
    tier: str,
    targets: tuple[str, ...],
    *,
    head_only: bool = False,
    close: bool = False,
) -> tuple[bytes, int] | None:
    """The whole response for a fresh hit, and how many tags the block dropped; None when it cannot be fast."""
    date = http_date(time.time())
    stamp = (int(entry.age_s(now)), date, tier, targets)
    plain = not (head_only or close)
    ident = (entry.key, entry.etag, entry.created_at)  # a re-stored entry under the same key is another entry
    if plain:
        cached = _WIRES.get(ident)
        if cached is not None and cached[0] == stamp:
            return cached[1], cached[2]
    const = _constant_head(
        entry.key, entry.etag, entry.ttl_s, entry.stale_if_error_s, entry.tags, targets, len(entry.body)
    )
    if const is None:
        return None
    head, truncated = const
    if not plain:  # HEAD or `Connection: close`: rare, built each time, never cached
        tail = b"Connection: close\r\n\r\n" if close else b"\r\n"
        return head + _varying(entry, now, tier, date) + tail + (b"" if head_only else entry.body), truncated
    data = b"".join((head, _varying(entry, now, tier, date), b"\r\n", entry.body))
    if len(data) <= WIRE_CACHE_MAX_RESPONSE_BYTES:
        if len(_WIRES) >= WIRE_CACHE_ENTRIES:
            _WIRES.clear()  # bounded: a hot set re-fills it within a second
        _WIRES[ident] = (stamp, data, truncated)
    return data, truncated


class HitResponse(web.StreamResponse):
    """A 200 whose bytes are already built: `prepare` finishes the request record, `write_eof` writes once."""

    def __init__(self, state: GatewayState, data: bytes, timer: StageTimer | None) -> None:
        super().__init__(status=200)
        self._tokenedge = state
        self._data = data
        self._timer = timer

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self._eof_sent:
            return None
        if self._payload_writer is not None:
            return self._payload_writer
        self._req = request
        self._keep_alive = request.keep_alive
        self._must_be_empty_body = request.method == "HEAD"
        self._payload_writer = request._payload_writer
        timer = self._timer  # what ops.on_response_prepare would do, the only handler (see eligible())
        if timer is not None:
            timer.status = 200
            timer.prepared_at = perf_counter()
            if timer.done:
                finish_request(self._tokenedge, timer)
        return self._payload_writer

    async def write_eof(self, data: bytes = b"") -> None:
        if self._eof_sent:
            return
        assert self._payload_writer is not None, "Response has not been started"
        # The writer has no buffered headers and is not chunked: this is one transport.write of all the bytes.
        await super().write_eof(self._data)


def eligible(request: web.Request) -> bool:
    """Whether this request may take the fast path (the entry's own checks come in `hit_response`).

    One pass over the raw header names: a conditional, directive or debug header sends it the normal way.
    """
    return scan(request, _NO_CREDENTIALS) is not None


Credentials = tuple[
    tuple[bytes, bytes], ...
]  # (lower-case name, raw value) of each credential header, in order
_NO_CREDENTIALS: dict[bytes, bool] = {name: True for name in _SLOW_HEADERS}


@functools.lru_cache(maxsize=16)
def _header_kinds(credential_names: tuple[str, ...]) -> dict[bytes, bool]:
    """Lower-case raw name -> True (a slow header) or False (a credential header), for one dict probe a header."""
    kinds = {name.lower().encode("ascii"): False for name in credential_names}
    kinds.update(_NO_CREDENTIALS)
    return kinds


def scan(request: web.Request, kinds: dict[bytes, bool]) -> Credentials | None:
    """`eligible` and the credential headers' raw values in one pass: None when the request must go the normal
    way, else the (name, value) pairs of the headers `kinds` marks False."""
    if request.version != HttpVersion11 or len(request.app.on_response_prepare) > 1:
        return None
    found: list[tuple[bytes, bytes]] = []
    for name, value in request.raw_headers:
        lower = name.lower()
        kind = kinds.get(lower)
        if kind is not None:
            if kind:
                return None
            found.append((lower, value))
    return tuple(found)


def hit_response(
    request: web.Request, state: GatewayState, entry: Entry, now: float, tier: str, *, checked: bool = False
) -> HitResponse | None:
    """The fast response for a fresh hit, or None when the normal path must serve it."""
    if not checked and not eligible(request):
        return None
    data = counted_wire(
        state, entry, now, tier, head_only=request.method == "HEAD", close=not request.keep_alive
    )
    return HitResponse(state, data, timer_of(request)) if data is not None else None


def counted_wire(
    state: GatewayState, entry: Entry, now: float, tier: str, *, head_only: bool = False, close: bool = False
) -> bytes | None:
    """`wire` with the configured CDN tag headers, the tags it had to drop counted; None when it cannot be fast."""
    built = wire(entry, now, tier, state.config.cache.cdn_tag_headers, head_only=head_only, close=close)
    if built is None:
        return None
    data, truncated = built
    if truncated:
        state.metrics.tag_truncations.inc(truncated)
    return data


def request_scope(request: web.Request, state: GatewayState, public: bool) -> str:
    """The request's key scope, for the normal path (`completions.cache_key`) and the fast path alike:
    `pub` on public routes, else the keyed credential scope (gateway.handlers.tenancy, memoized per credential)."""
    return PUBLIC_SCOPE if public else scope_of(request)


def _lookup(parsed: ParsedRequest, state: GatewayState, endpoint: str) -> Lookup | None:
    """The policy's decision for these bytes without request directives, decided once per memoized request."""
    fast = parsed.fast
    if fast is None:
        decision = decide(endpoint, parsed.body, NO_DIRECTIVES, state.policies[endpoint])
        usable = isinstance(decision, Lookup) and decision.read and parsed.body.get("stream") is not True
        fast = parsed.fast = decision if usable else False
    return fast if isinstance(fast, Lookup) else None


Known = tuple[ParsedRequest, str]  # the memoized request and the key the normal path last derived for it


def known_key(request: web.Request, state: GatewayState, endpoint: str, raw: bytes) -> Known | None:
    """The key of request bytes the memo already knows, keyed as the normal path last keyed them; else None.

    Every step that is not a plain dict lookup (parse, validate, canonicalize, derive, a catalog refresh,
    directives) returns None, and the normal path then does the whole request.
    """
    tenancy = state.tenancy
    if tenancy is None:
        return None
    credentials = scan(request, _header_kinds(tenancy.credential_headers))
    if credentials is None:
        return None

    def scope() -> str:
        if state.config.routes[endpoint].scope == "public":
            return PUBLIC_SCOPE
        if tenancy.tenant_header:  # a trusted proxy's tenant header: the peer decides, so no raw-value memo
            return scope_of(request)
        return tenancy.scope_of_raw(credentials, lambda: scope_of(request))

    return keyed(state, endpoint, raw, scope)


def keyed(state: GatewayState, endpoint: str, raw: bytes, scope: Callable[[], str]) -> Known | None:
    """The memoized request for these body bytes and the key the normal path last derived for it, when that key
    is for this caller (`scope`, asked only once the rest holds) and the model's current revision; else None."""
    parsed = state.memo.get(endpoint, raw)
    if parsed is None or _lookup(parsed, state, endpoint) is None:
        return None
    revision = state.catalog.fresh_revision(parsed.body["model"])
    if revision is None:
        return None
    key, context = parsed.key, parsed.key_context
    if key is None or context is None or context[1] != revision or context[0] != scope():
        return None  # keyed for another caller or revision: the normal path derives it
    return parsed, key.key


def is_fresh(entry: Entry, now: float) -> bool:
    """Fresh, and whole for the JSON answers the fast lanes serve (policy.lacks: a generation's carries usage)."""
    return lacks(entry.usage, needs_usage=entry.endpoint in USAGE_ENDPOINTS) is None and (
        freshness(age_s=entry.age_s(now), ttl_s=entry.ttl_s, stale_if_error_s=entry.stale_if_error_s)
        is Freshness.FRESH
    )


def l1_hit(request: web.Request, state: GatewayState, known: Known, timer: StageTimer) -> HitResponse | None:
    """A fresh L1 entry for a known key, served fast; None (nothing counted) for an L1 miss or a stale entry."""
    keyed = perf_counter()
    l1 = state.cache.l1
    entry = l1.get(known[1]) if l1.enabled else None
    if entry is None:
        return None  # nothing counted or lapped: the caller does the whole lookup
    now = state.clock()
    if not is_fresh(entry, now):
        return None
    response = serve_hit(request, state, known, entry, now, "l1", timer, keyed)
    if response is not None:
        state.cache.count_l1_hit()  # as `TieredCache.get` counts an L1 hit
    return response


def serve_hit(
    request: web.Request,
    state: GatewayState,
    known: Known,
    entry: Entry,
    now: float,
    tier: str,
    timer: StageTimer,
    keyed: float,
) -> HitResponse | None:
    """The fast response for a fresh entry of a known key, counted and lapped as the normal path counts and laps a
    hit (the tier lookup itself is counted by the caller); None when the normal path must write it."""
    looked_up = perf_counter()
    response = hit_response(request, state, entry, now, tier, checked=True)
    if response is not None:
        count_served(state, known, entry, now, tier, timer, (keyed, looked_up))
    return response


def count_served(
    state: GatewayState,
    known: Known,
    entry: Entry,
    now: float,
    tier: str,
    timer: StageTimer,
    marks: tuple[float, float],
) -> None:
    """What `lookup.read_cache` and the handler count for a hit, and its laps: parse up to `marks[0]` (the key
    known), the tier up to `marks[1]` (the entry read), serialize until now."""
    parsed, key_str = known
    state.metrics.served_from_cache(entry.usage, len(entry.body), entry.model)
    prompt = (prompt_text(parsed.body) or "") if state.config.dashboard.show_prompts else None
    state.dashboard.hot_keys.hit(entry, now, prompt)  # as lookup.read_cache counts every hit
    count_hit(state, key_str)
    timer.key = key_str
    timer.lap_to("parse", marks[0])
    timer.lap_to(tier, marks[1])
    timer.lap("serialize")


def try_hit(
    request: web.Request, state: GatewayState, endpoint: str, raw: bytes, timer: StageTimer
) -> HitResponse | None:
    """An L1 hit for request bytes the memo already knows (`known_key`, then `l1_hit`); else None."""
    known = known_key(request, state, endpoint, raw)
    return l1_hit(request, state, known, timer) if known is not None else None
