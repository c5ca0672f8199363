"""Per-request latency breakdown: a small slotted timer the cacheable-route handler laps as it goes.

Stages (a closed set, so the `stage` label never grows): `parse` (read, validate, canonicalize, model revision,
key), `l1`/`l2` (the cache lookup, named by the deepest tier consulted: an `l2` lap includes the microseconds of
the L1 miss before it), `upstream` (the fill: single-flight wait, upstream call and store; for a bypass the whole
relay), `serialize` (building the response). Every lap is one `perf_counter()` call and a dict write, so
the hit path pays well under a microsecond per stage.

The record is finished twice-over by design: the handler's `finally` knows result and reason, the response-prepare
signal knows the status. Whichever comes second finishes the request (histograms, access log); see
`gateway.handlers.ops.on_response_prepare`.
"""

from __future__ import annotations

from time import perf_counter

from aiohttp import web

STAGES: tuple[str, ...] = ("parse", "l1", "l2", "upstream", "serialize")


class StageTimer:
    __slots__ = (
        "_mark",
        "done",
        "first_token_at",
        "key",
        "prepared_at",
        "reason",
        "result",
        "route",
        "stages",
        "started",
        "status",
    )

    def __init__(self, route: str) -> None:
        self.route = route
        self.started = self._mark = perf_counter()
        self.stages: dict[str, float] = {}
        self.key = ""  # the cache key once derived (for the access log)
        self.result = ""
        self.reason = ""
        self.status = 0  # set when the response headers go out
        self.done = False  # set when the handler has returned or raised
        self.prepared_at = 0.0
        self.first_token_at = 0.0  # set by streaming code at the first content chunk, when it knows

    def lap(self, stage: str) -> None:
        """Charge the time since the previous lap (or the start) to `stage`; repeated laps accumulate."""
        now = perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + (now - self._mark)
        self._mark = now

    def lap_to(self, stage: str, at: float) -> None:
        """`lap` with a `perf_counter()` reading taken earlier (the fast path laps only once it knows it serves)."""
        self.stages[stage] = self.stages.get(stage, 0.0) + (at - self._mark)
        self._mark = at

    def skip(self) -> None:
        """Start the next lap now, charging the time since the last lap to no stage."""
        self._mark = perf_counter()

    def first_token(self) -> None:
        if not self.first_token_at:
            self.first_token_at = perf_counter()

    def elapsed(self) -> float:
        return perf_counter() - self.started

    def ttft(self) -> float:
        """Seconds to the first token: the first streamed chunk when known, else the response going out."""
        at = self.first_token_at or self.prepared_at
        return at - self.started if at else self.elapsed()

    def server_timing(self) -> str:
        """W3C Server-Timing: `parse;dur=0.120, l1;dur=0.004, ...` in milliseconds, plus the total so far."""
        parts = [f"{name};dur={secs * 1000:.3f}" for name, secs in self.stages.items()]
        parts.append(f"total;dur={self.elapsed() * 1000:.3f}")
        return ", ".join(parts)


TIMER: web.RequestKey[StageTimer] = web.RequestKey("tokenedge_timer", StageTimer)


def start_timer(request: web.Request, route: str) -> StageTimer:
    timer = StageTimer(route)
    request[TIMER] = timer
    return timer


def timer_of(request: web.Request) -> StageTimer | None:
    return request.get(TIMER)


def lap(request: web.Request, stage: str, *, key: str | None = None) -> None:
    """Lap the request's timer, if it has one (handlers called outside `make_handler` have none)."""
    timer = request.get(TIMER)
    if timer is not None:
        timer.lap(stage)
        if key is not None:
            timer.key = key
