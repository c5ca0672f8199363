"""The wire lane: request bytes already served as an L1 hit are answered from the connection's read callback.

A client that repeats a question repeats it byte for byte: request line, headers (its credentials included) and
body. Once such bytes have been served as a fresh L1 hit by the fast lane, and they arrived as exactly one whole
request in one read, the same bytes arriving again are the same request: same method, path, headers, credential
scope and body. So `EdgeRequestHandler.data_received` hands them here before aiohttp's parser; a fresh L1 entry
is written to the transport at once: no parse, no request object, no task, no response object.

What can differ between two arrivals of the same bytes is re-checked each time, exactly as the fast lane does:
the memo's key for the body must be for this scope and the model's current revision (`fastpath.keyed`), and the
L1 entry must be there and fresh (a purge or an eviction removes it: the bytes go to the parser). The scope is
a pure function of the bytes (the credential headers and the scope secret), so it is learned with them; with a
trusted tenant header (which depends on the peer) nothing is learned. The hit is counted, lapped and
access-logged as the fast lane counts it. Anything else (an L1 miss, a stale entry, an L2 hit) is not served
here and nothing is counted: the bytes take the parser and the fast lane.

Only a request that keeps the connection alive over HTTP/1.1 without conditional, directive or debug headers can
be learned (the fast lane's own conditions, `fastpath.scan`). The protocol side (only on an idle connection
whose parser holds no partial request, keep-alive bookkeeping) is in `gateway.edge`.
"""

from __future__ import annotations

from asyncio import Transport
from time import perf_counter

from aiohttp import HttpVersion11, web

from gateway import fastpath
from gateway.handlers.ops import handler_done
from gateway.state import GatewayState
from gateway.timing import StageTimer

MAX_REQUEST_BYTES = 16 * 1024  # a learned request (head and body), at most
MAX_LEARNED_BYTES = 4 * 1024 * 1024  # all learned requests' bytes; the table is cleared when full


class WireLane:
    """Learned request bytes -> (endpoint, where the body starts, the credential scope)."""

    def __init__(self, state: GatewayState) -> None:
        self._state = state
        self._learned: dict[bytes, tuple[str, int, str]] = {}
        self._bytes = 0
        self.served = 0  # hits answered here (they are counted as L1 hits like any other; this is for tests)

    def __len__(self) -> int:
        return len(self._learned)

    def learn(self, request: web.Request, endpoint: str, body: bytes, known: fastpath.Known) -> None:
        """Remember the bytes that carried `request` (an L1 hit the fast lane just served), when they were exactly
        this one request in one read (`EdgeRequestHandler.whole`) and the request can be answered by bytes alone."""
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

    def serve(self, chunk: bytes, transport: Transport) -> bool:
        """Write the fresh L1 hit for learned request bytes and count it; False (nothing counted) otherwise."""
        learned = self._learned.get(chunk)
        if learned is None:
            return False
        endpoint, body_at, scope = learned
        state = self._state
        timer = StageTimer(endpoint)
        known = fastpath.keyed(state, endpoint, chunk[body_at:], lambda: scope)
        if known is None:
            return False
        keyed = perf_counter()
        l1 = state.cache.l1
        entry = l1.get(known[1]) if l1.enabled else None
        if entry is None:
            return False
        now = state.clock()
        if not fastpath.is_fresh(entry, now):
            return False
        looked_up = perf_counter()
        built = fastpath.wire(entry, now, "l1", state.config.cache.cdn_tag_headers)
        if built is None:
            return False
        transport.write(built[0])
        if built[1]:
            state.metrics.tag_truncations.inc(built[1])
        state.cache.count_l1_hit()
        fastpath.count_served(state, known, entry, now, "l1", timer, (keyed, looked_up))
        timer.status, timer.prepared_at = 200, perf_counter()
        handler_done(state, timer, endpoint, "hit", "l1")
        self.served += 1
        return True
