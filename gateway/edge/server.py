"""The gateway's HTTP edge: read deadlines, a connection cap, and quiet, JSON-only protocol errors.

aiohttp has no deadline for a request's head or body: a client that sends a few bytes, or a Content-Length and
then too few bytes, holds its connection (and a handler) for as long as it likes. Here:

- Head: from a request's first byte (or the connection's start) until aiohttp hands the parsed request to the app,
  each read must come within `server.header_read_timeout_s` and the whole head within `server.header_total_s`. A
  per-process sweep (`EdgeServer`) closes offenders with a 408 JSON answer.
- Body: the app's `edge_middleware` (`gateway.edge.bodies`) reads the whole body before any handler runs, each read
  within `server.body_read_timeout_s` and all of it within `server.body_total_s` (and within `max_body_bytes`).
- At most `server.max_connections` open connections per process; more are closed at once.

Each close is counted in `tokenedge_slow_clients_total{phase}` (header, body, capacity) and logged at debug level,
never as an error: slow clients are the Internet, not a gateway fault. aiohttp's own parser errors (bad
Content-Length, bad Transfer-Encoding, bad method, oversized head) answer OpenAI-style JSON 400s, and a client that
left is debug-logged without a traceback.

The fast lane (`gateway.edge.fastlane`) answers known hits from a connection's reads, in front of aiohttp's parser,
only when that is in order (`EdgeRequestHandler.in_order`). `EdgeRunner` replaces aiohttp's `AppRunner` (the
only seam that chooses the protocol class); `serve` replaces `web.run_app` for `python -m gateway`, and the tests'
`start_gateway` uses the same runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Final

from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.web_protocol import RequestHandler

from gateway.config.settings import ServerConfig
from gateway.edge.drain import DRAIN, Drain, cut_at_deadline, listen, stop_accepting
from gateway.edge.fastlane import NOT_SERVED, PENDING, FastLane
from gateway.edge.framing import Framer
from gateway.edge.needs import EDGE_STATE
from gateway.hits.lookup import PRE_READ
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.timing import TIMER, StageTimer
from gateway.tiers.tiered import Found
from gateway.web import aioseam
from gateway.web.errors import error_body, error_response

log = logging.getLogger("tokenedge.edge")
IDLE, HEAD, HANDLING = 0, 1, 2
SWEEP_MAX_S: Final = 0.5
HOLD_MAX_BYTES: Final = 256 * 1024  # reads held behind the lane's L2 read before reading pauses
_TIMEOUT_BODY = error_body(
    "the request was not received in time", type_="invalid_request_error", code="request_timeout"
)
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Content-Length: " + str(len(_TIMEOUT_BODY)).encode() + b"\r\n\r\n" + _TIMEOUT_BODY
)


class EdgeRequestHandler(RequestHandler):
    """aiohttp's protocol plus the head deadline and the connection cap (state read by `EdgeServer.sweep`), with
    the fast lane in front of its parser.

    The lane may answer a read only when it is in order: every byte fed to aiohttp so far formed whole requests
    (`framing.Framer`) and aiohttp has answered each of them (`finished`, counted as `finish_response` returns).
    While the lane waits for an L2 read, later reads are held, in order, and taken when it settles."""

    def __init__(self, manager: EdgeServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.edge = manager
        self.clock = aioseam.handler_loop(self).time
        self.phase = HEAD
        self.head_started = self.last_rx = 0.0
        self.rx_while_handling = False
        self.framer = Framer()
        self.finished = 0  # requests aiohttp has answered on this connection
        self.held: list[bytes] | None = None  # reads that arrived while the lane waits for an L2 read
        self.held_bytes = 0
        # (key, what the lane's L2 read found, its timer): handed to the next request aiohttp makes here
        self.handover: tuple[str, Found | None, StageTimer] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        edge = self.edge
        if len(edge.live) >= edge.config.max_connections:
            edge.count("capacity")
            self.force_close()
            return
        self.head_started = self.last_rx = self.clock()
        edge.live.add(self)
        edge.ensure_sweeping()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.edge.live.discard(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not data:  # aiohttp re-enters with b"" to resume parsing: not a read
            super().data_received(data)
            return
        now = self.clock()
        if self.phase == IDLE:
            self.phase, self.head_started = HEAD, now
        elif self.phase == HANDLING and not self.rx_while_handling:
            # Bytes after this request's body is complete are a pipelined head: its clock starts when this request
            # ends. (Bytes that complete the body and start a head in one read go unnoticed: keepalive caps them.)
            current = aioseam.current_request(self)
            self.rx_while_handling = current is None or current.content.is_eof()
        self.last_rx = now
        if self.held is not None:
            self._hold(data)
        else:
            self.take(data, now)

    def take(self, data: bytes, now: float) -> None:
        """A read: answered by the fast lane while it may (in order, whole requests), the rest fed to aiohttp."""
        lane = self.edge.lane
        while data and lane is not None and self.in_order():
            verdict, used = lane.take(data, self)
            if verdict == NOT_SERVED:
                break
            data = data[used:]
            if verdict == PENDING:
                self.held, self.held_bytes = ([data] if data else []), len(data)
                self.request_started()
                return
            self.lane_answered()
            if data:
                self.phase, self.head_started = HEAD, now
        if data:
            self.feed(data)

    def in_order(self) -> bool:
        """A response written now is the next one the client expects: aiohttp holds no request, whole or partial."""
        framer, transport = self.framer, self.transport
        return (
            framer.at_boundary()
            and framer.started == self.finished
            and transport is not None
            and not transport.is_closing()
        )

    def feed(self, data: bytes) -> None:
        if self.edge.lane is not None:  # the framing only tells the lane when it may answer
            self.framer.scan(data)
        super().data_received(data)

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self.finished += 1

    def lane_answered(self) -> None:
        """The lane wrote a whole answer: keep-alive restarts, the request is over."""
        aioseam.keep_alive_after_answer(self, self.clock())
        self.request_started()
        self.request_finished()

    def lane_settled(
        self, served: bool, data: bytes, handover: tuple[str, Found | None, StageTimer] | None
    ) -> None:
        """The lane's L2 read is over: answered (`served`), or `data` (the request) goes to aiohttp with the read
        handed over; then the reads held meanwhile are taken, in order."""
        held, self.held = self.held or [], None
        if self.held_bytes > HOLD_MAX_BYTES and self.transport is not None:
            self.transport.resume_reading()
        if self.transport is None:
            return  # the client left: nothing to answer
        if served:
            self.lane_answered()
        else:
            self.request_finished()
            if data:
                self.handover = handover
                self.feed(data)
        for chunk in held:
            self.data_received(chunk)

    def _hold(self, data: bytes) -> None:
        assert self.held is not None
        self.held.append(data)
        before, self.held_bytes = self.held_bytes, self.held_bytes + len(data)
        if before <= HOLD_MAX_BYTES < self.held_bytes and self.transport is not None:
            self.transport.pause_reading()

    def request_started(self) -> None:
        if self.phase != HANDLING:  # once per request
            self.phase, self.rx_while_handling = HANDLING, False

    def request_finished(self) -> None:
        now = self.clock()
        if self.rx_while_handling:
            self.phase, self.head_started, self.last_rx = HEAD, now, now
        else:
            self.phase = IDLE

    def drop_after_response(self) -> None:
        """Close as soon as the answer is written: no lingering read of a body that is not coming."""
        aioseam.no_lingering(self)

    def credit(self, seconds: float) -> None:
        self.last_rx += seconds
        self.head_started += seconds

    def expired(self, now: float) -> bool:
        config = self.edge.config
        return self.phase == HEAD and (
            now - self.last_rx > config.header_read_timeout_s
            or now - self.head_started > config.header_total_s
        )

    def close_slow(self) -> None:
        self.edge.count("header")
        log.debug("closed a connection whose request head was too slow")
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_TIMEOUT_RESPONSE)
        self.force_close()

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        """aiohttp's parser errors and last-resort failures: JSON, and a traceback only for a real 500."""
        if request.writer.output_size > 0:
            raise ConnectionError("response already started")
        if status >= 500 and not isinstance(exc, ConnectionError):
            self.logger.exception("error handling a request", exc_info=exc)
            response = error_response(
                status, "internal gateway error", type_="internal_error", code="internal_error"
            )
        else:
            first_line = (message or "").strip().splitlines()[:1]
            log.debug("protocol error %d from a client: %s", status, first_line or type(exc).__name__)
            text = "malformed HTTP request" + (f": {first_line[0][:200]}" if first_line else "")
            response = error_response(
                status if status < 500 else 400, text, type_="invalid_request_error", code="bad_http_request"
            )
        response.force_close()
        return response


class EdgeServer(web.Server):
    """aiohttp's low-level server, making `EdgeRequestHandler`s and sweeping them for expired heads."""

    def __init__(
        self,
        *args: Any,
        config: ServerConfig,
        metrics: GatewayMetrics,
        lane: FastLane | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.config = config
        self.metrics = metrics
        self.loop = aioseam.server_loop(self)
        self._protocol_kwargs = aioseam.server_kwargs(self)
        self.lane = lane
        self._make = self.request_factory
        self.request_factory = self.make_request
        self.live: set[EdgeRequestHandler] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._interval = min(SWEEP_MAX_S, config.header_read_timeout_s / 4, config.header_total_s / 4)

    def __call__(self) -> RequestHandler:
        return EdgeRequestHandler(self, loop=self.loop, **self._protocol_kwargs)

    def make_request(self, *args: Any, **kwargs: Any) -> web.BaseRequest:
        """aiohttp's request factory, plus a read the fast lane made and did not serve for this very request: it
        is the first request aiohttp makes on that connection after the lane fed it (aiohttp was idle)."""
        request = self._make(*args, **kwargs)
        protocol = request.protocol
        handover = protocol.handover if isinstance(protocol, EdgeRequestHandler) else None
        if handover is not None and isinstance(protocol, EdgeRequestHandler):
            protocol.handover = None
            key, found, timer = handover
            request[PRE_READ] = (key, found)
            request[TIMER] = timer
        return request

    def count(self, phase: str) -> None:
        self.metrics.slow_clients.labels(phase).inc()

    def ensure_sweeping(self) -> None:
        if self._sweeper is None:
            self._due = self.loop.time() + self._interval
            self._sweeper = self.loop.call_at(self._due, self.sweep)

    def sweep(self, now: float | None = None) -> None:
        """Close every connection whose head is overdue (`now`: the loop's time unless a test passes one).

        A sweep that fires late found the event loop stalled (GC, CPU contention): bytes that arrived meanwhile are
        not read yet, so the stall is credited to every connection, never blamed on the client.
        """
        if self._sweeper is not None:
            self._sweeper.cancel()  # a no-op when this is the timer firing; a test's call keeps one chain
        self._sweeper = None
        if now is None:
            now = self.loop.time()
            stall = now - self._due - self._interval
            if stall > 0:
                for conn in self.live:
                    conn.credit(stall)
        for conn in [c for c in self.live if c.expired(now)]:
            self.live.discard(conn)
            conn.close_slow()
        if self.live:
            self.ensure_sweeping()

    async def shutdown(self, timeout: float | None = None) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        await super().shutdown(timeout)


class EdgeRunner(aioseam.ServerRunner):
    """`web.AppRunner` serving through `EdgeServer`, with the fast lane in front of the parser.

    aiohttp's runner starts the app and builds its server; the edge keeps that server's handler, request factory
    and options and adds the deadlines and the lane. The lane is on unless configured off, or the app has something
    the lane would skip: a middleware or a response-prepare handler of its own (then every request takes the
    ordinary path, where both are honoured), or a trusted tenant header (the scope then depends on the peer)."""

    async def serve_with(self, plain: web.Server) -> web.Server:
        app = self.app
        state = app[EDGE_STATE]
        return EdgeServer(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=asyncio.get_running_loop(),
            config=state.config.server,
            metrics=state.metrics,
            lane=FastLane(state) if lane_allowed(app) else None,
            **aioseam.server_kwargs(plain),
        )


def lane_allowed(app: web.Application) -> bool:
    state = app[EDGE_STATE]
    extra = [m for m in app.middlewares if getattr(m, "__name__", "") not in GATEWAY_MIDDLEWARES]
    prepare = [h for h in app.on_response_prepare if getattr(h, "__name__", "") != "on_response_prepare"]
    why = (
        "server.fast_lane is off"
        if not state.config.server.fast_lane
        else f"the app has middleware of its own ({extra})"
        if extra
        else f"the app has response-prepare handlers of its own ({prepare})"
        if prepare
        else "the scope depends on a trusted tenant header"
        if state.tenancy is None or state.tenancy.tenant_header
        else ""
    )
    if why:
        log.info("fast lane off: %s; every request takes the ordinary path", why)
    return not why


# The middlewares `gateway.app.create_app` installs (the fast lane does what they do for the requests it answers).
GATEWAY_MIDDLEWARES = frozenset({"error_middleware", "path_guard", "edge_middleware"})


class EdgeTestServer(TestServer):
    """aiohttp's TestServer on the gateway's own runner, so tests exercise the same edge as production."""

    async def _make_runner(self, **kwargs: Any) -> web.BaseRunner:
        return EdgeRunner(self.app, **kwargs)


def serve(app: web.Application, config: ServerConfig, *, reuse_port: bool) -> None:
    """`web.run_app` on `EdgeRunner`: serve until SIGINT/SIGTERM, then drain (`gateway.edge.drain`) and clean up."""
    host, port = config.host, config.port
    app[DRAIN] = drain = Drain(grace_s=config.drain_grace_s, timeout_s=config.drain_timeout_s)

    async def main() -> None:
        listen(drain)  # before setup: a signal during start-up drains once the listener is up
        runner = EdgeRunner(
            app,
            handle_signals=False,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=config.drain_timeout_s,  # a backstop: the drain's own deadline cuts first
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port, reuse_port=reuse_port).start()
            await drain.requested.wait()
            await stop_accepting(runner, drain)
        finally:
            with cut_at_deadline(runner, drain):
                await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
