"""The fast lane: a known request's fresh hit answered from the connection's read, before aiohttp parses it.

The one lane beside the ordinary handler path (router, middleware, handler). It keys on what matters, never on raw
request bytes, and reuses only a key the intake pipeline derived (gateway.intake.pipeline) in this request's whole
context: the route, the body (the request memo knows its canonical key), the request's own credential headers (its
scope, `hits.scope`, computed from this request), its key-material headers (the request table, gateway.keys.parts),
the model's current revision and the tokenizer identity the route keys by. Transport headers (an ingress's
`X-Request-Id`, `traceparent`, `X-Varnish`, `CF-Ray`) change nothing; a query string, a conditional,
cache-directive, debug, framing or `Connection: close` header sends the request the ordinary way.

What it keeps of the ordinary path:
- Order: it answers only when every request before it on the connection has been answered (the connection counts
  requests started and answered, `gateway.edge.framing`), and while it waits for an L2 read the connection holds later
  bytes, in order.
- Deadlines: it takes only a request that arrived whole in one read, so no body deadline is ever waited out here
  (a request still arriving goes to aiohttp's parser as it comes, under the edge's head and body deadlines); the
  connection cap and slow-client counting are the edge's, unchanged.
- Trust: the key is bound from this request's own bytes before any await; nothing after the L2 read looks at a
  record another request can write.
- Counting: the hit core decides (`hits.verdict`), renders (`hits.render`) and counts (`hits.record`), and the
  request record (`reqrecord`) is kept, exactly as on the ordinary path.
Anything else (a miss, a stale entry, a refused credential, an unknown body) goes to aiohttp's parser, with any L2
read handed over so the tiers are read and counted once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from time import perf_counter
from typing import Any, Protocol

from multidict import CIMultiDict

from gateway.edge.needs import EdgeState
from gateway.hits import record, render
from gateway.hits.scope import key_scope_of_fields
from gateway.hits.verdict import Verdict, judge
from gateway.intake.pipeline import lane_lookup
from gateway.keys.cache_control import NO_DIRECTIVES
from gateway.keys.entry import Entry
from gateway.keys.memo import MAX_MEMO_BODY_BYTES, ParsedRequest
from gateway.keys.parts import Part, wire_material
from gateway.keys.policy import CACHEABLE_ENDPOINTS
from gateway.keys.validate import is_json_media
from gateway.ops.dashboard.hotkeys import prompt_text
from gateway.ops.reqrecord import DEBUG_HEADER, handler_done
from gateway.ops.timing import StageTimer
from gateway.tiers.base import L2Unavailable
from gateway.tiers.tiered import Found
from gateway.tokens.keyform import TOKEN_LEVELS, key_tokenizer_now
from gateway.web.errors import GatewayError

log = logging.getLogger("tokenedge.fastlane")
NOT_SERVED, SERVED, PENDING = 0, 1, 2
# A plain HTTP/1.1 POST head to a cacheable route, every field line well formed (RFC 9110 §5.1 token names; values
# without control characters but tab). Anything else is aiohttp's to parse (and to refuse).
_ROUTES = b"|".join(re.escape(e.encode()) for e in sorted(CACHEABLE_ENDPOINTS, key=len, reverse=True))
_HEAD = re.compile(
    rb"POST /v1/(" + _ROUTES + rb") HTTP/1\.1\r\n"
    rb"((?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[^\x00-\x08\x0a-\x1f\x7f]*\r\n)*)\r\n"
)
SLOW, CREDENTIAL, LENGTH, CTYPE, CONNECTION, HOST, KEYED, IGNORED = range(8)
_PARTS = {Part.CREDENTIAL: CREDENTIAL, Part.KEYED: KEYED}  # anything else: transport, never read here
MAX_KINDS = 4096  # header names classified and remembered per process (client-chosen: bounded)
# Request headers that send a request the ordinary way: conditionals (RFC 9110 §13), cache directives (the policy
# reads them), the admin debug header (Server-Timing), and framing a plain request does not have.
SLOW_HEADERS = (
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
    "Content-Encoding",  # the body on the wire is not the body: aiohttp decodes it (gateway.edge.bodies)
    "Transfer-Encoding",
    "Upgrade",
)


class Connection(Protocol):
    """What the lane needs of the edge's protocol (`edge.EdgeRequestHandler`)."""

    transport: Any

    def lane_settled(
        self, served: bool, data: bytes, handover: tuple[str, Found | None, StageTimer] | None
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Known:
    """A memoized request's key for this caller, bound before any await (nothing later reads the memo's record)."""

    parsed: ParsedRequest
    key: str
    revision: str
    endpoint: str
    needs_usage: bool  # the JSON answer carries usage: an entry without it is not a hit (policy.lacks)


@functools.lru_cache(maxsize=16)
def header_kinds(credential_names: tuple[str, ...]) -> dict[bytes, int]:
    """Lower-case raw name -> what the lane does with it, one dict probe a header."""
    kinds = {name.lower().encode("ascii"): CREDENTIAL for name in credential_names}
    kinds.update({name.lower().encode("ascii"): SLOW for name in SLOW_HEADERS})
    kinds.update(
        {b"content-length": LENGTH, b"content-type": CTYPE, b"connection": CONNECTION, b"host": HOST}
    )
    return kinds


def _json_type(value: bytes) -> bool:
    """`validate.check_content_type`'s rule, on the raw field value."""
    return is_json_media(value.split(b";", 1)[0].strip(b" \t").lower().decode("latin-1"))


@dataclass(frozen=True, slots=True)
class Head:
    endpoint: str
    fields: bytes  # the field lines, each ending in CRLF
    credentials: tuple[tuple[bytes, bytes], ...]  # (lower-case name, raw value), in request order
    body_at: int
    length: int
    keyed: tuple[tuple[bytes, bytes], ...] = ()  # key-material headers (gateway.keys.parts), in request order


def header_wire(keyed: tuple[tuple[bytes, bytes], ...]) -> bytes:
    """The key material of these headers, as the ordinary path computes it (`Tenancy.classify`)."""
    pairs = [(n.decode("latin-1"), v.decode("utf-8", "surrogateescape")) for n, v in keyed]
    return wire_material(pairs, ())


def _classify(kinds: dict[bytes, int], lower: bytes, part: Callable[[str], Part]) -> int:
    """A header name `kinds` does not know yet, classified by the request table and remembered (bounded)."""
    kind = _PARTS.get(part(lower.decode("latin-1")), IGNORED)
    if len(kinds) < MAX_KINDS:
        kinds[lower] = kind
    return kind


def plain_head(data: bytes, kinds: dict[bytes, int], part: Callable[[str], Part]) -> Head | None:
    """The head of the request `data` starts, when the lane may answer it; else None."""
    match = _HEAD.match(data)
    if match is None:
        return None
    length, hosts = -1, 0
    credentials: list[tuple[bytes, bytes]] = []
    keyed: list[tuple[bytes, bytes]] = []
    for line in match.group(2).split(b"\r\n")[:-1]:
        name, _, value = line.partition(b":")
        lower = name.lower()
        kind = kinds.get(lower)
        if kind is None:
            kind = _classify(kinds, lower, part)
        if kind == IGNORED:
            continue
        if kind == SLOW:
            return None
        value = value.strip(b" \t")
        if kind == CREDENTIAL:
            if value:  # a blank credential is none (Tenancy.split)
                credentials.append((lower, value))
        elif kind == KEYED:
            keyed.append((lower, value))
        elif kind == LENGTH:
            if length >= 0 or not value.isdigit() or len(value) > 9:
                return None
            length = int(value)
        elif kind == CTYPE:
            if not _json_type(value):
                return None
            keyed.append((lower, value))  # key material like any header the upstream reads
        elif kind == HOST:
            hosts += 1
        elif b"close" in value.lower() or b"upgrade" in value.lower():
            return None  # aiohttp closes (or upgrades) as the request asks
    if length <= 0 or hosts != 1:  # RFC 9112 §3.2: HTTP/1.1 without exactly one Host is the parser's 400
        return None
    return Head(
        match.group(1).decode(), match.group(2), tuple(credentials), match.end(), length, tuple(keyed)
    )


def keyed(
    state: EdgeState, endpoint: str, raw: bytes, scope: Callable[[], str], wire: Callable[[], bytes]
) -> Known | None:
    """The key the ordinary path last derived for these body bytes, when it was derived in this request's whole
    context (gateway.intake.pipeline): this caller (`scope`, asked only once the rest holds), the model's current
    revision, the tokenizer identity the route keys by now, and these headers' key material (`wire`); else None
    (the ordinary path derives it)."""
    parsed = state.memo.get(endpoint, raw)
    lookup = lane_lookup(state, endpoint, parsed) if parsed is not None else None
    if parsed is None or lookup is None:
        return None
    model = parsed.body["model"]
    revision = state.catalog.fresh_revision(model)
    if revision is None:
        return None
    key, context = parsed.key, parsed.key_context
    if key is None or context is None or context[1] != revision:
        return None
    if context[2] and state.config.routes[endpoint].level in TOKEN_LEVELS:  # keyed by a tokenizer's ids
        tok = key_tokenizer_now(state, endpoint, model, revision)
        if tok is None or tok.version != context[2]:
            return (
                None  # not known without an await, or changed (a remote engine's template): the ordinary path
            )
    if context[3] != wire() or context[0] != scope():
        return None
    return Known(parsed, key.key, revision, endpoint, lookup.needs_usage)


def _headers_of(fields: bytes) -> CIMultiDict[str]:
    """The field lines as aiohttp would decode them (UTF-8, surrogate escapes), for a scope computed the first
    time a credential is seen."""
    headers: CIMultiDict[str] = CIMultiDict()
    for line in fields.split(b"\r\n")[:-1]:
        name, _, value = line.partition(b":")
        headers.add(name.decode("latin-1"), value.strip(b" \t").decode("utf-8", "surrogateescape"))
    return headers


class FastLane:
    """One per process: answers the requests a connection offers (`take`), hits only."""

    def __init__(self, state: EdgeState) -> None:
        self._state = state
        tenancy = state.tenancy
        assert tenancy is not None, "tenancy_ctx runs before the server starts"
        self._kinds = dict(header_kinds(tenancy.credential_headers))
        self._part = tenancy.part
        self._wires: dict[tuple[tuple[bytes, bytes], ...], bytes] = {}
        self._max_body = min(MAX_MEMO_BODY_BYTES, state.config.server.max_body_bytes)

    def take(self, data: bytes, conn: Connection) -> tuple[int, int]:
        """(verdict, bytes used): SERVED (the hit is written), PENDING (an L2 read; the connection holds what comes
        next and `lane_settled` follows), or NOT_SERVED (nothing used or counted: the bytes go to the parser)."""
        head = plain_head(data, self._kinds, self._part)
        if head is None or head.length > self._max_body or len(data) < head.body_at + head.length:
            return NOT_SERVED, 0
        used = head.body_at + head.length
        state = self._state
        timer = StageTimer(head.endpoint)
        try:
            known = keyed(
                state,
                head.endpoint,
                data[head.body_at : used],
                partial(self._scope, head),
                partial(self._wire, head),
            )
        except GatewayError:  # a refused credential: the ordinary path answers it as JSON
            return NOT_SERVED, 0
        if known is None:
            return NOT_SERVED, 0
        keyed_at = perf_counter()
        cache = state.cache
        entry = cache.l1.get(known.key) if cache.l1.enabled else None
        if entry is not None:
            now = state.clock()
            if (
                judge(entry, now, NO_DIRECTIVES, known.revision, needs_usage=known.needs_usage)
                is not Verdict.HIT
            ):
                return NOT_SERVED, 0  # the ordinary path reads it again and decides (stale-if-error, ...)
            if not self._write(conn, known, entry, now, "l1", timer, keyed_at, data):
                return NOT_SERVED, 0
            cache.count_l1_hit()
            return SERVED, used
        if cache.l2 is None:
            return NOT_SERVED, 0
        generation = cache.l1.generation
        try:
            pending = cache.l2.read(known.key)
        except (
            L2Unavailable
        ):  # breaker open: the ordinary path reads (and counts the error) as it always does
            return NOT_SERVED, 0
        if cache.l1.enabled:
            cache.count_l1_miss()
        pending.add_done_callback(
            partial(self._l2_read, conn, data[:used], known, timer, keyed_at, generation)
        )
        return PENDING, used

    def _wire(self, head: Head) -> bytes:
        """The headers' key material, remembered by their raw values (the same raw values, the same bytes)."""
        if not head.keyed:
            return b""
        wire = self._wires.get(head.keyed)
        if wire is None:
            wire = header_wire(head.keyed)
            if len(self._wires) >= MAX_KINDS:
                self._wires.clear()
            self._wires[head.keyed] = wire
        return wire

    def _scope(self, head: Head) -> str:
        """This request's key scope, from its own credential headers (`hits.scope`)."""
        return key_scope_of_fields(
            self._state, head.endpoint, head.credentials, partial(_headers_of, head.fields)
        )

    def _l2_read(
        self,
        conn: Connection,
        data: bytes,
        known: Known,
        timer: StageTimer,
        keyed_at: float,
        generation: int,
        pending: asyncio.Future[Any],
    ) -> None:
        """The L2 read is over: a fresh entry is written; anything else goes to the parser with the read."""
        state = self._state
        try:
            exc = pending.exception()
            if exc is not None and not isinstance(exc, L2Unavailable):
                raise exc
            l2 = state.cache.l2
            assert l2 is not None  # the tier `take` read from
            value = exc if exc is not None else l2.entry_of(pending.result())
            found = state.cache.settle(known.key, value, generation)
        except (
            Exception,
            asyncio.CancelledError,
        ):  # a gateway bug: the ordinary path reads and answers instead
            log.exception("fast lane: L2 read failed")
            conn.lane_settled(False, data, None)
            return
        if conn.transport is None or conn.transport.is_closing():
            conn.lane_settled(False, b"", None)  # nobody left to answer
            handler_done(state, timer, known.endpoint, "client_gone", "client_gone")
            return
        now = state.clock()
        fresh = (
            found is not None
            and judge(found.entry, now, NO_DIRECTIVES, known.revision, needs_usage=known.needs_usage)
            is Verdict.HIT
        )
        if (
            fresh
            and found is not None
            and self._write(conn, known, found.entry, now, found.tier, timer, keyed_at, data)
        ):
            conn.lane_settled(True, b"", None)
            return
        timer.lap_to("l2", perf_counter())
        conn.lane_settled(False, data, (known.key, found, timer))

    def _write(
        self,
        conn: Connection,
        known: Known,
        entry: Entry,
        now: float,
        tier: str,
        timer: StageTimer,
        keyed_at: float,
        raw: bytes,
    ) -> bool:
        """Write a fresh entry's response and count it as the ordinary path counts a hit; False if it cannot be
        written as bytes (then nothing was written or counted). `raw`: the request's bytes (its head first)."""
        state = self._state
        looked_up = perf_counter()
        data = render.hit_bytes(state, entry, now, tier)
        if data is None:
            return False
        conn.transport.write(data)
        prompt = (prompt_text(known.parsed.body) or "") if state.config.dashboard.show_prompts else None
        record.hit(state, entry, now, prompt)
        timer.key = known.key
        timer.lap_to("parse", keyed_at)
        timer.lap_to(tier, looked_up)
        timer.lap("serialize")
        timer.status, timer.prepared_at = 200, perf_counter()
        handler_done(state, timer, known.endpoint, "hit", tier)
        state.metrics.tally.inc(state.metrics.lane_answers, (tier,))
        if state.tracing is not None:  # a caller's sampled trace continues through this hit (ops.tracing)
            state.tracing.lane_hit(raw, known.endpoint, known.parsed, entry, timer)
        return True
