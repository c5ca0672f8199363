"""gateway/ops/tracing.py's draw: a request the sample rate drops costs one `random()` and makes nothing.

With a rate, each request draws once before any OpenTelemetry object exists (`Tracing.keeps`); a dropped one
neither extracts the caller's context, nor starts a span, nor attaches a context, nor reads the fast lane's head.
The mutation check is the same calls with a draw that keeps: then the objects are made. The gateway-level
behaviour (one draw per request on either path, the caller's `traceparent` forwarded unchanged when dropped) is
tested against a real OTLP/HTTP receiver in tests/gateway/test_tracing.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import context

from gateway.ops import tracing
from gateway.ops.tracing import TraceSettings, Tracing

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_dropped_draw_makes_no_opentelemetry_object_and_attaches_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept: list[Any] = []
    tracer = Tracing(TraceSettings(None, "t", 0.01), processor=_Collector(kept))
    made: list[str] = []
    start, extract = tracer.tracer.start_span, tracer.propagator.extract
    monkeypatch.setattr(tracer.tracer, "start_span", lambda *a, **k: made.append("span") or start(*a, **k))
    monkeypatch.setattr(
        tracer.propagator, "extract", lambda *a, **k: made.append("extract") or extract(*a, **k)
    )
    monkeypatch.setattr(tracing, "sampled_parent", lambda raw: made.append("head") or None)
    before = context.get_current()
    tracer.draw = lambda: 0.5
    assert tracer.begin({"traceparent": TRACEPARENT}, "chat/completions") is None
    tracer.lane_hit(b"", "chat/completions", None, None, None)  # type: ignore[arg-type]
    assert made == [] and kept == [] and tracing.active() is None and context.get_current() is before
    tracer.draw = lambda: 0.0  # the mutation check: kept, the same calls make the objects
    trace = tracer.begin({"traceparent": TRACEPARENT}, "chat/completions")
    tracer.lane_hit(b"", "chat/completions", None, None, None)  # type: ignore[arg-type]
    assert trace is not None and made == ["extract", "span", "head"] and tracing.active() is trace
    trace.finish("miss", "test")
    assert len(kept) == 1 and tracing.active() is None and context.get_current() is before


class _Collector:
    """A span processor that keeps every finished span."""

    def __init__(self, kept: list[Any]) -> None:
        self.kept = kept

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def _on_ending(self, span: Any) -> None:
        pass

    def on_end(self, span: Any) -> None:
        self.kept.append(span)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 0) -> bool:
        return True
