"""The wire lane's side of the connection: which reads it may answer, and aiohttp's bookkeeping when it does.

`gateway.wirelane` answers learned request bytes; this protocol decides when that is in order and keeps aiohttp's
state as if aiohttp had served the request:

- Clean: every byte the parser has been fed so far formed whole requests, one per read. A read that is a partial
  request, several pipelined requests or anything else framed differently makes the connection unclean for good:
  its parser may hold half a request, so later reads are never taken as whole requests again.
- Idle: nothing queued, being handled or being written, and writing not paused: a response written now is the next
  one the client expects.
- An answer written here counts as one request on the connection and restarts aiohttp's keep-alive timer.
- A plain `POST` of at most 16 KiB whose head has arrived but not all of its body (clients that write the head and
  the body apart, like httpx's sync transport) is held for up to HOLD_BODY_S until it is whole, then taken as one
  read; a body that takes longer goes to the parser as it comes, under the usual body deadlines. A request with
  `Expect` or `Transfer-Encoding`, an odd or repeated `Content-Length`, or an incomplete head goes to the parser at
  once.
- An L2 read in flight holds the connection: later reads wait (in order) until the read is settled; if it does not
  end in a fresh hit, the held bytes go to the parser first with the read handed over (`handover`), so the tiers
  are read and counted once per request.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp.http import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

if TYPE_CHECKING:
    from gateway.lookup import Found
    from gateway.timing import StageTimer

# The wire lane's verdicts on a read (`WireLane.serve`).
NOT_SERVED, SERVED, PENDING = 0, 1, 2
MAX_WHOLE_BYTES = 16 * 1024  # a request the lane learns, or waits for when its body arrives apart, at most
HOLD_BODY_S = 0.25  # how long a head waits for the rest of its body before the parser takes it as it is
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length[ \t]*:[ \t]*([^\r]*)", re.IGNORECASE)
_NEVER_WAIT = re.compile(rb"\r\n(?:expect|transfer-encoding)[ \t]*:", re.IGNORECASE)
HOLD_MAX_BYTES = 256 * 1024  # reads held behind an L2 read in flight before reading pauses


class Lane(Protocol):
    """What a connection needs of `gateway.wirelane.WireLane` (named structurally: that module imports this one)."""

    def serve(self, chunk: bytes, conn: WireConnection) -> int: ...


def whole_request(data: bytes, message: object, payload: object) -> bool:
    """`data` is exactly `message`: its head, then a Content-Length body received in full, nothing after."""
    if not isinstance(message, RawRequestMessage) or message.chunked or message.upgrade:
        return False
    if not isinstance(payload, StreamReader) or not payload.is_eof():
        return False
    end = data.find(b"\r\n\r\n")
    declared = message.headers.get("Content-Length", "0")
    return end >= 0 and declared.isdigit() and len(data) == end + 4 + int(declared)


def awaited_length(data: bytes) -> int:
    """The full length of the request `data` starts, when that is one plain `POST` of at most MAX_WHOLE_BYTES with a
    complete head and a body still arriving; else 0 (the bytes go to the parser as they are)."""
    if not data.startswith(b"POST "):
        return 0
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return 0
    head = data[: end + 2]
    lengths = _CONTENT_LENGTH.findall(head)
    declared = lengths[0].strip(b" \t") if len(lengths) == 1 else b""
    if not (0 < len(declared) <= 9 and declared.isdigit()) or _NEVER_WAIT.search(head):
        return 0  # the parser judges odd framing
    total = end + 4 + int(declared)
    return total if len(data) < total <= MAX_WHOLE_BYTES else 0


class WireConnection(RequestHandler):
    """aiohttp's protocol with the wire lane in front of its parser (`take` is called for every read)."""

    def __init__(self, manager: Any, *, wire: Lane | None, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.wire = wire
        self.clean = True
        # The last read that was one whole request, and its message (what `WireLane.learn` remembers).
        self.whole: tuple[object, bytes] | None = None
        self.held: list[bytes] | None = None  # reads that arrived while an L2 read was in flight
        self.partial: bytes | None = None  # a request's head (and some body) waiting for the rest of its body
        self._partial_due: asyncio.TimerHandle | None = None
        self.held_bytes = 0
        # (message, key, what the read found, timer): an L2 read made here and not served, for that message
        self.handover: tuple[object, str, Found | None, StageTimer] | None = None

    def request_started(self) -> None:
        """A request is being handled (the edge's head deadline stops); overridden by `EdgeRequestHandler`."""

    def request_finished(self) -> None:
        """The request is answered; overridden by `EdgeRequestHandler`."""

    def take(self, data: bytes, now: float) -> None:
        """A read: answered on the wire, held, or fed to aiohttp's parser."""
        if self.held is not None:
            self._hold(data)
            return
        if not self.clean:
            super().data_received(data)
            return
        if self.partial is not None:
            data = self._unhold() + data
        wire = self.wire
        idle = wire is not None and self.idle()
        verdict = wire.serve(data, self) if wire is not None and idle else NOT_SERVED
        if verdict == SERVED:
            self.answered(now)
        elif verdict == PENDING:
            self.held, self.held_bytes = [], 0
            self.request_started()
        elif idle and awaited_length(data):
            self.partial = data  # its body is on the way: taken whole when it is (or as it is, soon)
            self._partial_due = self._loop.call_later(HOLD_BODY_S, self._hold_over)
            self.request_started()  # the head is in: no head deadline while its body arrives
        else:
            self.feed(data)

    def _unhold(self) -> bytes:
        data, self.partial = self.partial or b"", None
        if self._partial_due is not None:
            self._partial_due.cancel()
            self._partial_due = None
        return data

    def _hold_over(self) -> None:
        """The rest of the body is slow: the parser takes what came (the body deadlines apply from here)."""
        self._partial_due = None
        if self.partial is not None and self.transport is not None:
            self.feed(self._unhold())

    def connection_lost(self, exc: BaseException | None) -> None:
        self._unhold()
        super().connection_lost(exc)

    def feed(self, data: bytes) -> None:
        """aiohttp's parser on a clean connection: remember a read that was one whole request, else turn unclean."""
        before = self._request_count
        super().data_received(data)
        messages = self._messages
        if self._request_count == before + 1 and len(messages) == 1 and whole_request(data, *messages[0]):
            self.whole = (messages[0][0], data)
        else:
            self.clean, self.whole = False, None

    def idle(self) -> bool:
        """No request queued, being handled or still being written, nothing half-parsed: a response written now is
        in order."""
        transport = self.transport
        return not (
            self._messages
            or self._request_in_progress
            or self._paused
            or self._upgraded
            or self._payload_parser is not None
            or self._close
            or self._force_close
            or transport is None
            or transport.is_closing()
        )

    def answered(self, now: float) -> None:
        """aiohttp's per-request bookkeeping for a request it never saw: counted, and keep-alive restarted."""
        self._request_count += 1
        self._manager.requests_count += 1  # type: ignore[union-attr]
        self._keepalive = True
        close_time = self._next_keepalive_close_time = now + self._keepalive_timeout
        if self._keepalive_handle is None and self._keepalive_timeout > 0:
            self._keepalive_handle = self._loop.call_at(close_time, self._process_keepalive)
        self.request_started()  # a no-op when an L2 read already marked it
        self.request_finished()

    def settled(
        self, data: bytes, served: bool, handover: tuple[str, Found | None, StageTimer] | None
    ) -> None:
        """The L2 read for `data` is over: answered (`served`), or `data` goes to the parser with the read handed
        over; then the reads held meanwhile are taken in order."""
        held, self.held = self.held or [], None
        if self.held_bytes > HOLD_MAX_BYTES and not (self._reading_paused or self._buffer_paused):
            self._resume_transport_reading()  # paused by `_hold` (aiohttp's own pauses keep their hold)
        if served:
            self.answered(self._loop.time())
        else:
            self.request_finished()
            self.feed(data)
            whole = self.whole
            if handover is not None and whole is not None and whole[1] is data:
                self.handover = (whole[0], *handover)
        for chunk in held:
            self.data_received(chunk)

    def _hold(self, data: bytes) -> None:
        assert self.held is not None
        self.held.append(data)
        before, self.held_bytes = self.held_bytes, self.held_bytes + len(data)
        if before <= HOLD_MAX_BYTES < self.held_bytes:
            self._pause_transport_reading()
