"""The wire lane: request bytes already served as a hit are answered from the connection's read callback.

A client that repeats a question repeats it byte for byte: request line, headers (its credentials included) and
body. Once such bytes have been served as a fresh hit by the fast lane, and they arrived as exactly one whole
request in one read, the same bytes arriving again are the same request: same method, path, headers, credential
scope and body. So the connection (`gateway.wireconn`) hands them here before aiohttp's parser, and a fresh entry
is written to the transport at once: no parse, no request object, no task, no response object.

What can differ between two arrivals of the same bytes is re-checked each time, exactly as the fast lane does:
the memo's key for the body must be for this scope and the model's current revision (`fastpath.keyed`), and the
entry must be there and fresh (a purge or an eviction removes it). L1 is read at once; on an L1 miss the L2 read
(Redis, Redis Cluster, Memcached: batched with the other reads in flight) is waited on with a callback while the
connection holds later reads. The scope is a pure function of the bytes (the credential headers and the scope
secret), so it is learned with them; with a trusted tenant header (which depends on the peer) nothing is learned.
A hit is counted, lapped and access-logged as the fast lane counts it. Anything else (a miss, a stale entry, an
open L2 breaker) is not served here: the bytes take the parser and the fast lane, with any L2 read handed over so
nothing is read or counted twice.

Only a request that keeps the connection alive over HTTP/1.1 without conditional, directive or debug headers can
be learned (the fast lane's own conditions, `fastpath.scan`).
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from time import perf_counter
from typing import Any

from aiohttp import HttpVersion11, web

from gateway import fastpath
from gateway.entry import Entry
from gateway.handlers.ops import handler_done
from gateway.state import GatewayState
from gateway.tiers.base import L2Unavailable
from gateway.timing import StageTimer
from gateway.wireconn import MAX_WHOLE_BYTES, NOT_SERVED, PENDING, SERVED, WireConnection

log = logging.getLogger("tokenedge.wire")

MAX_REQUEST_BYTES = MAX_WHOLE_BYTES  # a learned request (head and body), at most
MAX_LEARNED_BYTES = 4 * 1024 * 1024  # all learned requests' bytes; the table is cleared when full


class WireLane:
    """Learned request bytes -> (endpoint, where the body starts, the credential scope)."""

    def __init__(self, state: GatewayState) -> None:
        self._state = state
        self._learned: dict[bytes, tuple[str, int, str]] = {}
        self._bytes = 0
        self.served = 0  # hits answered here (counted as hits like any other, and in wire_lane_answers_total)

    def __len__(self) -> int:
        return len(self._learned)

    def learn(self, request: web.Request, endpoint: str, body: bytes, known: fastpath.Known) -> None:
        """Remember the bytes that carried `request` (a hit the fast lane just served), when they were exactly this
        one request in one read (`WireConnection.whole`) and the request can be answered by its bytes alone."""
        whole = getattr(request.protocol, "whole", None)
        if whole is None or whole[0] is not request._message or len(whole[1]) > MAX_REQUEST_BYTES:
            return
        tenancy = self._state.tenancy
        if (
            tenancy is None
            or tenancy.tenant_header
            or not request.keep_alive
            or request.version != HttpVersion11
        ):
            return
        chunk = whole[1]
        if not chunk.endswith(body) or chunk in self._learned:
            return
        context = known[0].key_context
        if context is None:
            return
        if self._bytes + len(chunk) > MAX_LEARNED_BYTES:
            self._learned.clear()  # bounded: a hot set is learned again within a request each
            self._bytes = 0
        self._learned[chunk] = (endpoint, len(chunk) - len(body), context[0])
        self._bytes += len(chunk)

    def serve(self, chunk: bytes, conn: WireConnection) -> int:
        """A learned request's fresh L1 hit written and counted (SERVED); an L2 read started, settled later by
        `_l2_read` (PENDING); else NOT_SERVED, nothing counted."""
        learned = self._learned.get(chunk)
        if learned is None:
            return NOT_SERVED
        endpoint, body_at, scope = learned
        state = self._state
        timer = StageTimer(endpoint)
        known = fastpath.keyed(state, endpoint, chunk[body_at:], lambda: scope)
        if known is None:
            return NOT_SERVED
        keyed = perf_counter()
        cache = state.cache
        entry = cache.l1.get(known[1]) if cache.l1.enabled else None
        if entry is not None:
            now = state.clock()
            if not fastpath.is_fresh(entry, now) or not self._write(
                conn, known, entry, now, "l1", timer, keyed
            ):
                return NOT_SERVED
            cache.count_l1_hit()
            return SERVED
        if cache.l2 is None:
            return NOT_SERVED
        generation = cache.l1.generation
        try:
            pending = cache.l2.read(known[1])
        except L2Unavailable:  # breaker open: the normal path reads (and counts the error) as it always does
            return NOT_SERVED
        if cache.l1.enabled:
            cache.count_l1_miss()
        pending.add_done_callback(partial(self._l2_read, conn, chunk, known, timer, keyed, generation))
        return PENDING

    def _l2_read(
        self,
        conn: WireConnection,
        chunk: bytes,
        known: fastpath.Known,
        timer: StageTimer,
        keyed: float,
        generation: int,
        pending: asyncio.Future[Any],
    ) -> None:
        """The L2 read is over: a fresh entry is written at once; anything else goes to the parser with the read."""
        state = self._state
        try:
            exc = pending.exception()
            if exc is not None and not isinstance(exc, L2Unavailable):
                raise exc
            l2 = state.cache.l2
            assert l2 is not None  # the tier `serve` read from
            value = exc if exc is not None else l2.entry_of(pending.result())
            found = state.cache.settle(known[1], value, generation)
        except (
            Exception,
            asyncio.CancelledError,
        ):  # a gateway bug: the normal path reads and answers instead
            log.exception("wire lane: L2 read failed")
            conn.settled(chunk, False, None)
            return
        if conn.transport is None or conn.transport.is_closing():
            conn.held = None  # nobody left to answer, held reads included
            handler_done(state, timer, timer.route, "client_gone", "client_gone")
            return
        now = state.clock()
        fresh = found is not None and fastpath.is_fresh(found.entry, now)
        if fresh and found is not None and self._write(conn, known, found.entry, now, "l2", timer, keyed):
            conn.settled(chunk, True, None)
            return
        timer.lap_to("l2", perf_counter())
        conn.settled(chunk, False, (known[1], found, timer))

    def _write(
        self,
        conn: WireConnection,
        known: fastpath.Known,
        entry: Entry,
        now: float,
        tier: str,
        timer: StageTimer,
        keyed: float,
    ) -> bool:
        """Write a fresh entry's response and count the hit as the fast lane does; False if it must not be fast."""
        state = self._state
        looked_up = perf_counter()
        transport = conn.transport
        data = fastpath.counted_wire(state, entry, now, tier) if transport is not None else None
        if transport is None or data is None:
            return False
        transport.write(data)
        fastpath.count_served(state, known, entry, now, tier, timer, (keyed, looked_up))
        state.metrics.tally.inc(state.metrics.wire_answers, (tier,))
        timer.status, timer.prepared_at = 200, perf_counter()
        handler_done(state, timer, timer.route, "hit", tier)
        self.served += 1
        return True
