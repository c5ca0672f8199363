"""The per-request record of a cacheable request: counted and timed once its outcome is known, finished (stage
histograms, time to first token, access log) once its status is known too; whichever comes second finishes it.

Every lane calls these: the handler's `finally` and the fast lane (`handler_done`), the response-prepare signal and
a pre-built hit's `prepare` (`finish_request`).
"""

from __future__ import annotations

from time import perf_counter
from typing import Protocol

from gateway.config.settings import GatewayConfig
from gateway.ops import accesslog
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.timing import StageTimer


class RecordState(Protocol):
    """What the request record reads of the gateway's state (the shell's `RecordState` provides it)."""

    config: GatewayConfig
    metrics: GatewayMetrics


DEBUG_HEADER = "X-Tokenedge-Debug"  # an admin's request for Server-Timing (gateway.handlers.ops)


def finish_request(state: RecordState, timer: StageTimer) -> None:
    """Record a cacheable request's breakdown once both its outcome and its status are known."""
    m = state.metrics
    for stage, seconds in timer.stages.items():
        m.tally.observe(m.stage_duration, (stage,), seconds)
    m.tally.observe(m.ttft, (timer.route, timer.result), timer.ttft())
    accesslog.write(timer, state.config.server.access_log_sample_rate)


def handler_done(state: RecordState, timer: StageTimer, endpoint: str, result: str, reason: str) -> None:
    """Called once per cacheable request when its outcome is known (the handler's `finally`, or the fast lane):
    counted and timed, then finished now if the status is known too."""
    tally = state.metrics.tally
    tally.inc(state.metrics.requests, (endpoint, result, reason))
    tally.observe(state.metrics.request_duration, (endpoint, result), perf_counter() - timer.started)
    timer.result, timer.reason, timer.done = result, reason, True
    if result == "bypass" and "upstream" not in timer.stages:
        timer.lap("upstream")  # a bypass is parse, then the relay: everything after parse is the upstream
    if timer.status:
        finish_request(state, timer)
